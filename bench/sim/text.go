package sim

import (
	"sync"
	"unsafe"

	"github.com/warmpath/warmpath/bench/workload"
)

// textCache is one run's view of segment text: a segment's bytes are a pure
// function of its id and length (workload.AppendSegment), and a suite
// simulates every workload about a hundred times (each policy at each
// load), so the text of every segment is generated once per process and
// kept in sharedText across runs. The run's own map holds what it has
// already fetched, so a segment used again costs no lock.
type textCache struct {
	text map[segKey][]byte
	// record makes appendSegment append each segment's stored text (nil
	// if the store did not keep it) to segs
	record bool
	segs   [][]byte
}

type segKey struct {
	id     uint64
	tokens int
}

func newTextCache() *textCache {
	return &textCache{text: map[segKey][]byte{}}
}

// appendSegment appends s's text, the same bytes as workload.AppendSegment.
func (c *textCache) appendSegment(dst []byte, s workload.Segment) []byte {
	k := segKey{s.ID, s.Tokens}
	t, ok := c.text[k]
	if !ok {
		if t = sharedText.get(k); t == nil {
			n := len(dst)
			dst = workload.AppendSegment(dst, s)
			t = sharedText.put(k, dst[n:])
			if t != nil {
				c.text[k] = t
			}
			if c.record {
				c.segs = append(c.segs, t)
			}
			return dst
		}
		c.text[k] = t
	}
	if c.record {
		c.segs = append(c.segs, t)
	}
	return append(dst, t...)
}

// appendMessage appends message m's text.
func (c *textCache) appendMessage(dst []byte, m *workload.Message) []byte {
	for _, s := range m.Segments {
		dst = c.appendSegment(dst, s)
	}
	return dst
}

// maxSharedText bounds the text kept across runs. A full store is dropped
// and refilled: a suite simulates one workload after another, so the store
// follows the current one (runs still holding the old text keep it alive
// until they end). The benchmark's long-prompt traces need 10-90 MiB each.
const maxSharedText = 256 << 20

// textChunk is the size of the store's backing arrays: segments are packed
// into them, so the store is a few large allocations the GC need not scan.
const textChunk = 4 << 20

// textStore is segment text shared by every run of the process, safe for
// concurrent runs (a suite runs several at once).
type textStore struct {
	mu    sync.RWMutex
	m     map[segKey][]byte
	chunk []byte // the free tail of the current backing array
	bytes int
	limit int // maxSharedText; tests make it small
}

var sharedText = newTextStore(maxSharedText)

func newTextStore(limit int) *textStore {
	return &textStore{m: map[segKey][]byte{}, limit: limit}
}

// get returns k's text, nil if the store does not have it.
func (s *textStore) get(k segKey) []byte {
	s.mu.RLock()
	t := s.m[k]
	s.mu.RUnlock()
	return t
}

// put stores a copy of k's text t and returns it (the stored copy, which
// never changes), or nil for an empty text.
func (s *textStore) put(k segKey, t []byte) []byte {
	if len(t) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[k]; ok { // another run stored it meanwhile
		return old
	}
	if s.bytes+len(t) > s.limit {
		s.m, s.chunk, s.bytes = map[segKey][]byte{}, nil, 0
	}
	if len(t) > len(s.chunk) {
		s.chunk = make([]byte, max(textChunk, len(t)))
	}
	c := s.chunk[:len(t):len(t)]
	copy(c, t)
	s.chunk = s.chunk[len(t):]
	s.m[k] = c
	s.bytes += len(t)
	return c
}

// transient views b as a string without copying, for a call that only
// reads it (enginesim.AppendChatPrompt copies the content it renders). b
// must not change while the string is in use.
func transient(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
