package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/warmpath/warmpath/affinity"
	"github.com/zeebo/xxh3"
)

// Wire format (version 2), little-endian, varints as encoding/binary's
// uvarint:
//
//	header:  "WPC" version(1) kind(1) flags(1) fingerprint(8)
//	         incarnation(8) seq(8) send_unix_ns(8)
//	         uvarint len + instance name
//	table:   uvarint count, then count x (uvarint sender replica id,
//	         uvarint len + replica name)
//	records: until the end, each kind(1) uvarint replica id, then
//	  insert      uvarint n, n x hash(8)            chain, first block first
//	  truncate    tail(8) uvarint n
//	  reset       -
//	  load        uvarint in_flight, pending_prefill_tokens, pending_requests
//	  entry add   len(1: 4 or 16) client address    fast-path affinity entry
//	  entry del   len(1) client address
//	  snapshot    uvarint n, n x (hash(8) parent(8)) least recent first
//	  tail        tail(8)                               a finished request's deepest block
//
// Replica ids are the sender's; the table names the ones a message uses
// (receivers resolve names to their own ids). incarnation is random per
// sender process (a restart changes it); seq counts the incarnation's
// batches from 1. flags (batches only): full = the batch's load records are
// the sender's whole load (a replica without one has none: heartbeats);
// leave = the sender is closing (receivers withdraw its load at once). A message of kind batch
// carries any records but snapshot; a snapshot chunk only snapshot records.
const (
	wireVersion = 2

	msgBatch    = 1
	msgSnapshot = 2

	recInsert   = 1
	recTruncate = 2
	recReset    = 3
	recLoad     = 4
	recEntryAdd = 5
	recEntryDel = 6
	recSnapshot = 7
	recTail     = 8
	recKinds    = 9

	flagFull  = 1 << 0
	flagLeave = 1 << 1

	headerFixed  = 3 + 1 + 1 + 1 + 8 + 8 + 8 + 8
	maxInstance  = 128
	maxNameBytes = 1024
	maxTable     = 1 << 16
)

// Decode errors (preallocated: garbage from the network costs no
// allocation to reject).
var (
	errShort    = errors.New("decode: truncated message")
	errMagic    = errors.New("decode: not a warmpath cluster message")
	errVersion  = errors.New("decode: unsupported version")
	errKind     = errors.New("decode: unknown message kind")
	errRecord   = errors.New("decode: unknown record kind")
	errTable    = errors.New("decode: bad replica table")
	errInstance = errors.New("decode: bad instance name")
	errAddr     = errors.New("decode: bad client address")
	errVarint   = errors.New("decode: bad varint")
	errRange    = errors.New("decode: value out of range")
)

// Fingerprint identifies the hash configuration: peers whose block hashes
// are not comparable (different bytes per token, block size or tenancy
// mode, which salts hashes) must not apply each other's updates.
func Fingerprint(h affinity.HashConfig, tenancy string) uint64 {
	h = h.WithDefaults()
	s := "warmpath-hash/v1 bpt=" + strconv.Itoa(h.BytesPerToken) + " bt=" + strconv.Itoa(h.BlockTokens) + " tenancy=" + tenancy
	return xxh3.HashString(s)
}

// appendHeader starts a message.
func appendHeader(dst []byte, kind, flags byte, fp, inc, seq uint64, sendNs int64, instance string) []byte {
	dst = append(dst, 'W', 'P', 'C', wireVersion, kind, flags)
	dst = binary.LittleEndian.AppendUint64(dst, fp)
	dst = binary.LittleEndian.AppendUint64(dst, inc)
	dst = binary.LittleEndian.AppendUint64(dst, seq)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(sendNs))
	dst = binary.AppendUvarint(dst, uint64(len(instance)))
	return append(dst, instance...)
}

// appendTableEntry adds one (sender id, name) pair; the caller writes the
// count first.
func appendTableEntry(dst []byte, id uint32, name string) []byte {
	dst = binary.AppendUvarint(dst, uint64(id))
	dst = binary.AppendUvarint(dst, uint64(len(name)))
	return append(dst, name...)
}

func appendInsert(dst []byte, id uint32, hs []uint64) []byte {
	dst = append(dst, recInsert)
	dst = binary.AppendUvarint(dst, uint64(id))
	dst = binary.AppendUvarint(dst, uint64(len(hs)))
	for _, h := range hs {
		dst = binary.LittleEndian.AppendUint64(dst, h)
	}
	return dst
}

func appendTruncate(dst []byte, id uint32, tail uint64, n int) []byte {
	dst = append(dst, recTruncate)
	dst = binary.AppendUvarint(dst, uint64(id))
	dst = binary.LittleEndian.AppendUint64(dst, tail)
	return binary.AppendUvarint(dst, uint64(max(n, 0)))
}

func appendTail(dst []byte, id uint32, tail uint64) []byte {
	dst = append(dst, recTail)
	dst = binary.AppendUvarint(dst, uint64(id))
	return binary.LittleEndian.AppendUint64(dst, tail)
}

func appendReset(dst []byte, id uint32) []byte {
	dst = append(dst, recReset)
	return binary.AppendUvarint(dst, uint64(id))
}

func appendLoad(dst []byte, id uint32, l affinity.PeerLoad) []byte {
	dst = append(dst, recLoad)
	dst = binary.AppendUvarint(dst, uint64(id))
	dst = binary.AppendUvarint(dst, uint64(max(l.InFlight, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(l.PendingPrefillTokens, 0)))
	return binary.AppendUvarint(dst, uint64(max(l.PendingRequests, 0)))
}

func appendEntry(dst []byte, id uint32, client netip.Addr, add bool) []byte {
	k := byte(recEntryDel)
	if add {
		k = recEntryAdd
	}
	dst = append(dst, k)
	dst = binary.AppendUvarint(dst, uint64(id))
	client = client.Unmap()
	if client.Is4() {
		a := client.As4()
		dst = append(dst, 4)
		return append(dst, a[:]...)
	}
	a := client.As16()
	dst = append(dst, 16)
	return append(dst, a[:]...)
}

func appendSnapshot(dst []byte, id uint32, hs, ps []uint64) []byte {
	dst = append(dst, recSnapshot)
	dst = binary.AppendUvarint(dst, uint64(id))
	dst = binary.AppendUvarint(dst, uint64(len(hs)))
	for i := range hs {
		dst = binary.LittleEndian.AppendUint64(dst, hs[i])
		dst = binary.LittleEndian.AppendUint64(dst, ps[i])
	}
	return dst
}

// Message is one decoded message. Decode reuses its slices; Hashes and
// Parents of its records point into them and are valid until the next
// Decode into the same Message.
type Message struct {
	Kind        byte
	Flags       byte // flagFull, flagLeave
	Fingerprint uint64
	Incarnation uint64 // random per sender process
	Seq         uint64
	SendNs      int64 // sender's wall clock, unix nanoseconds
	Instance    string
	Names       []Name
	Records     []Record

	words []uint64 // backing store of the records' Hashes and Parents
}

// Name maps a sender replica id to its name.
type Name struct {
	ID   uint32
	Name string
}

// Record is one decoded record.
type Record struct {
	Kind    byte
	Replica uint32 // sender's id; resolve with Message.Names
	Hashes  []uint64
	Parents []uint64 // snapshot records
	Tail    uint64
	N       int
	Load    affinity.PeerLoad
	Client  netip.Addr // entry records

	off, n int // into Message.words while decoding
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) byte1() byte {
	if r.err != nil || len(r.b) < 1 {
		r.fail(errShort)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) u64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail(errShort)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) uvarint(limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errVarint)
		return 0
	}
	r.b = r.b[n:]
	if v > limit {
		r.fail(errRange)
		return 0
	}
	return v
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.fail(errShort)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// Decode parses b into m. It never panics and allocates at most in
// proportion to len(b): every count is checked against the bytes left.
func Decode(b []byte, m *Message) error {
	m.Names, m.Records, m.words = m.Names[:0], m.Records[:0], m.words[:0]
	m.Instance = ""
	if len(b) < headerFixed {
		return errShort
	}
	if b[0] != 'W' || b[1] != 'P' || b[2] != 'C' {
		return errMagic
	}
	if b[3] != wireVersion {
		return errVersion
	}
	m.Kind = b[4]
	if m.Kind != msgBatch && m.Kind != msgSnapshot {
		return errKind
	}
	m.Flags = b[5]
	r := reader{b: b[6:]}
	m.Fingerprint = r.u64()
	m.Incarnation = r.u64()
	m.Seq = r.u64()
	m.SendNs = int64(r.u64())
	in := r.bytes(int(r.uvarint(maxInstance)))
	if r.err != nil {
		return r.err
	}
	if len(in) == 0 {
		return errInstance
	}
	m.Instance = string(in)
	nt := int(r.uvarint(maxTable))
	for range nt {
		id := uint32(r.uvarint(1<<31 - 1))
		name := r.bytes(int(r.uvarint(maxNameBytes)))
		if r.err != nil {
			return r.err
		}
		if len(name) == 0 {
			return errTable
		}
		m.Names = append(m.Names, Name{ID: id, Name: string(name)})
	}
	for r.err == nil && len(r.b) > 0 {
		k := r.byte1()
		if k == 0 || k >= recKinds || (m.Kind == msgSnapshot) != (k == recSnapshot) {
			return errRecord
		}
		rec := Record{Kind: k, Replica: uint32(r.uvarint(1<<31 - 1))}
		switch k {
		case recInsert:
			n := int(r.uvarint(uint64(len(r.b) / 8)))
			rec.off, rec.n = len(m.words), n
			for range n {
				m.words = append(m.words, r.u64())
			}
		case recTruncate:
			rec.Tail = r.u64()
			rec.N = int(r.uvarint(1 << 31))
		case recTail:
			rec.Tail = r.u64()
		case recReset:
		case recLoad:
			rec.Load.InFlight = int32(r.uvarint(1<<31 - 1))
			rec.Load.PendingPrefillTokens = int32(r.uvarint(1<<31 - 1))
			rec.Load.PendingRequests = int32(r.uvarint(1<<31 - 1))
		case recEntryAdd, recEntryDel:
			switch n := r.byte1(); n {
			case 4:
				if a := r.bytes(4); a != nil {
					rec.Client = netip.AddrFrom4([4]byte(a))
				}
			case 16:
				if a := r.bytes(16); a != nil {
					rec.Client = netip.AddrFrom16([16]byte(a))
				}
			default:
				r.fail(errAddr)
			}
		case recSnapshot:
			n := int(r.uvarint(uint64(len(r.b) / 16)))
			rec.off, rec.n = len(m.words), n
			for range 2 * n {
				m.words = append(m.words, r.u64())
			}
		}
		if r.err != nil {
			return r.err
		}
		m.Records = append(m.Records, rec)
	}
	if r.err != nil {
		return r.err
	}
	for i := range m.Records {
		rec := &m.Records[i]
		switch rec.Kind {
		case recInsert:
			rec.Hashes = m.words[rec.off : rec.off+rec.n : rec.off+rec.n]
		case recSnapshot:
			w := m.words[rec.off : rec.off+2*rec.n]
			rec.Hashes, rec.Parents = splitPairs(w)
		}
	}
	return nil
}

// splitPairs de-interleaves (hash, parent) pairs in place: hashes first,
// then parents, returning both halves.
func splitPairs(w []uint64) (hs, ps []uint64) {
	n := len(w) / 2
	tmp := make([]uint64, n)
	for i := range n {
		tmp[i] = w[2*i+1]
		w[i] = w[2*i]
	}
	copy(w[n:], tmp)
	return w[:n:n], w[n:]
}

func (k recordKind) String() string {
	switch k {
	case recInsert:
		return "insert"
	case recTruncate:
		return "truncate"
	case recReset:
		return "reset"
	case recLoad:
		return "load"
	case recEntryAdd:
		return "entry_add"
	case recEntryDel:
		return "entry_del"
	case recSnapshot:
		return "snapshot"
	case recTail:
		return "tail"
	}
	return fmt.Sprintf("record(%d)", uint8(k))
}

type recordKind byte
