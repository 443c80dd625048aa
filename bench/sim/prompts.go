package sim

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/workload"
)

// hashStore keeps, across runs, what the simulator makes of every request
// whose prompt is made of workload segments alone (no engine answers of
// earlier turns): its segments' text, in order, and its engine prompt's
// chained block hashes (enginesim.Request.BlockHashes). Such a prompt is a
// pure function of the request's roles and segments and the block size,
// and a suite replays each workload about a hundred times; one lookup per
// request replaces one per segment. A request is keyed by that description
// (appendPromptDesc), compared in full on a hit. Safe for concurrent runs.
type hashStore struct {
	mu    sync.RWMutex
	m     map[uint64]*hashEntry
	bytes int
	limit int // maxSharedHashes; tests make it small
}

type hashEntry struct {
	desc   []byte
	hashes []uint64
	// the engine prompt's length and its bytes after its last full block:
	// with hashes, all the engine reads of it (enginesim.Request.PromptBytes)
	promptBytes int
	tail        []byte
	// text is each segment's text (sharedText's), in message order; nil
	// when the text store kept not all of them
	text [][]byte
	// parsed is what the router's parser made of the request's chat body
	// for one model and hash configuration (the last parsed; nil before
	// the first)
	parsed atomic.Pointer[parsedPrompt]
}

// parsedPrompt is the part of affinity.Prompt a simulated router's Request
// takes (its model, block hashes and token estimate) for a request whose
// body is a pure function of its model and its entry's segments (its
// max_tokens and stream flag change neither), as ParseChat returned it,
// and how long that parse took (one run's wall time, which every later
// run counts in Result.DecideNanos). The parse is the router's own code on the
// body it would receive; a suite replays each workload about a hundred
// times, and this keeps the answer of the first (TestParsedPromptIsParse).
type parsedPrompt struct {
	cfg    affinity.HashConfig
	model  []byte
	hashes []uint64
	tokens int
	nanos  int64 // the parse's wall time, the router CPU a decision counts
}

// parsedFor returns e's parsed prompt for cfg and model, nil if it holds
// another's or none.
func (e *hashEntry) parsedFor(cfg affinity.HashConfig, model string) *parsedPrompt {
	if pp := e.parsed.Load(); pp != nil && pp.cfg == cfg && string(pp.model) == model {
		return pp
	}
	return nil
}

// keepParsed stores a copy of what the parser made of e's body (pr, for
// cfg), which took nanos.
func (e *hashEntry) keepParsed(cfg affinity.HashConfig, pr *affinity.Prompt, nanos int64) {
	e.parsed.Store(&parsedPrompt{cfg: cfg, model: slices.Clone(pr.Model), hashes: slices.Clone(pr.Hashes), tokens: pr.Tokens, nanos: nanos})
}

// maxSharedHashes bounds the store; a full store is dropped and refilled,
// as sharedText. The benchmark's long-prompt traces need 6-32 MiB each.
// The routers' kept parses (hashEntry.parsed) are not counted: about a
// quarter more (a router block is 64 tokens, an engine's 16).
const maxSharedHashes = 256 << 20

var sharedHashes = newHashStore(maxSharedHashes)

func newHashStore(limit int) *hashStore {
	return &hashStore{m: map[uint64]*hashEntry{}, limit: limit}
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

// get returns the entry stored for desc, nil if none. It never changes.
func (s *hashStore) get(desc []byte) *hashEntry {
	k := xxh3.Hash(desc)
	s.mu.RLock()
	e := s.m[k]
	s.mu.RUnlock()
	if e == nil || !bytes.Equal(e.desc, desc) {
		return nil
	}
	return e
}

// put stores desc's hashes, segment texts and engine prompt's length and
// tail (copies of the slices; text is left out if any is nil) and returns
// the entry, or nil when there are no hashes or another description holds
// the key. The texts' bytes are the text store's and count there.
func (s *hashStore) put(desc []byte, hashes []uint64, text [][]byte, promptBytes int, tail []byte) *hashEntry {
	if len(hashes) == 0 {
		return nil
	}
	k := xxh3.Hash(desc)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[k]; ok {
		if bytes.Equal(e.desc, desc) {
			return e
		}
		return nil
	}
	size := len(desc) + 8*len(hashes) + 24*len(text) + len(tail)
	if s.bytes+size > s.limit {
		s.m, s.bytes = map[uint64]*hashEntry{}, 0
	}
	e := &hashEntry{desc: append([]byte(nil), desc...), hashes: append([]uint64(nil), hashes...),
		promptBytes: promptBytes, tail: append([]byte(nil), tail...)}
	if !slices.ContainsFunc(text, func(t []byte) bool { return t == nil }) {
		e.text = slices.Clone(text)
	}
	s.m[k] = e
	s.bytes += size
	return e
}
