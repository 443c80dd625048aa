package sim

import (
	"unsafe"

	"github.com/warmpath/warmpath/bench/workload"
)

// textCache keeps the synthetic text of segments the simulator has seen
// more than once (system prompts, documents, a trace's shared blocks), so a
// shared prefix is generated once per run, not once per request. A segment
// is cached on its second use, so one-off questions cost a key, not their
// text; at most maxTextCache bytes are kept, then new segments are
// generated each time.
type textCache struct {
	seen  map[segKey]struct{}
	text  map[segKey][]byte
	bytes int
}

type segKey struct {
	id     uint64
	tokens int
}

const maxTextCache = 64 << 20

func newTextCache() *textCache {
	return &textCache{seen: map[segKey]struct{}{}, text: map[segKey][]byte{}}
}

// appendSegment appends s's text, the same bytes as workload.AppendSegment.
func (c *textCache) appendSegment(dst []byte, s workload.Segment) []byte {
	k := segKey{s.ID, s.Tokens}
	if t, ok := c.text[k]; ok {
		return append(dst, t...)
	}
	n := len(dst)
	dst = workload.AppendSegment(dst, s)
	if _, again := c.seen[k]; !again {
		c.seen[k] = struct{}{}
	} else if c.bytes+len(dst)-n <= maxTextCache {
		c.text[k] = append([]byte(nil), dst[n:]...)
		c.bytes += len(dst) - n
		delete(c.seen, k)
	}
	return dst
}

// appendMessage appends message m's text.
func (c *textCache) appendMessage(dst []byte, m *workload.Message) []byte {
	for _, s := range m.Segments {
		dst = c.appendSegment(dst, s)
	}
	return dst
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
