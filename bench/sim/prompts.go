package sim

import (
	"bytes"
	"encoding/binary"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/warmpath/warmpath/bench/workload"
)

// hashStore keeps the engine prompt's chained block hashes
// (enginesim.Request.BlockHashes) of every request whose prompt is made of
// workload segments alone (no engine answers of earlier turns), across
// runs: such a prompt is a pure function of the request's roles and
// segments and the block size, and a suite replays each workload about a
// hundred times. A request is keyed by that description (promptDesc),
// compared in full on a hit. Safe for concurrent runs.
type hashStore struct {
	mu    sync.RWMutex
	m     map[uint64]hashEntry
	bytes int
	limit int // maxSharedHashes; tests make it small
}

type hashEntry struct {
	desc   []byte
	hashes []uint64
}

// maxSharedHashes bounds the store; a full store is dropped and refilled,
// as sharedText. The benchmark's long-prompt traces need 6-32 MiB each.
const maxSharedHashes = 256 << 20

var sharedHashes = newHashStore(maxSharedHashes)

func newHashStore(limit int) *hashStore {
	return &hashStore{m: map[uint64]hashEntry{}, limit: limit}
}

// appendPromptDesc appends what r's engine prompt is made of: the block
// size, then each message's role and segments.
func appendPromptDesc(dst []byte, r *workload.Request, blockSize int) []byte {
	dst = binary.AppendUvarint(dst, uint64(blockSize))
	for i := range r.Messages {
		m := &r.Messages[i]
		dst = append(dst, byte(m.Role))
		dst = binary.AppendUvarint(dst, uint64(len(m.Segments)))
		for _, s := range m.Segments {
			dst = binary.LittleEndian.AppendUint64(dst, s.ID)
			dst = binary.AppendUvarint(dst, uint64(s.Tokens))
		}
	}
	return dst
}

// get returns the hashes stored for desc, nil if none.
func (s *hashStore) get(desc []byte) []uint64 {
	k := xxh3.Hash(desc)
	s.mu.RLock()
	e, ok := s.m[k]
	s.mu.RUnlock()
	if !ok || !bytes.Equal(e.desc, desc) {
		return nil
	}
	return e.hashes
}

// put stores a copy of desc's hashes and returns it (never changed), or
// nil when there are none or another description holds the key.
func (s *hashStore) put(desc []byte, hashes []uint64) []uint64 {
	if len(hashes) == 0 {
		return nil
	}
	k := xxh3.Hash(desc)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[k]; ok {
		if bytes.Equal(e.desc, desc) {
			return e.hashes
		}
		return nil
	}
	size := len(desc) + 8*len(hashes)
	if s.bytes+size > s.limit {
		s.m, s.bytes = map[uint64]hashEntry{}, 0
	}
	e := hashEntry{desc: append([]byte(nil), desc...), hashes: append([]uint64(nil), hashes...)}
	s.m[k] = e
	s.bytes += size
	return e.hashes
}
