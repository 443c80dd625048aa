package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// BytesPerToken is the text density the generators assume when they turn a
// token count into bytes: about four bytes of English per token, the same
// assumption the router's prefix hashing and the simulated engine make.
const BytesPerToken = 4

// Segment is a run of prompt text named by an id: equal ids give equal bytes
// (AppendSegment), so two requests that share leading segments share a prompt
// prefix byte for byte. Tokens is its length in tokens.
type Segment struct {
	ID     uint64
	Tokens int
}

// Role of a message in a chat request.
type Role uint8

const (
	System Role = iota
	User
	Assistant
)

func (r Role) String() string {
	switch r {
	case System:
		return "system"
	case User:
		return "user"
	default:
		return "assistant"
	}
}

// Message is one chat message made of segments.
type Message struct {
	Role     Role
	Segments []Segment
}

// Request is one generated request: when it arrives, what it says, how much it
// asks to generate, and who sends it.
type Request struct {
	ID           int
	Arrival      int64  // nanoseconds from the start of the run
	Model        string // model name
	Messages     []Message
	OutputTokens int
	Group        int // prefix group (shared-prefix shapes); -1 when none
	Conversation int // conversation id (multi-turn); -1 when none
	Turn         int // turn number within the conversation, from 0
	Client       int // the sending client (a source address in the live bench)
}

// PromptTokens is the sum of the request's segment tokens.
func (r *Request) PromptTokens() int {
	n := 0
	for i := range r.Messages {
		for _, s := range r.Messages[i].Segments {
			n += s.Tokens
		}
	}
	return n
}

// Workload is a named, generated list of requests sorted by arrival.
type Workload struct {
	Name     string
	Params   string // the parameters that made it, for reports
	Requests []Request
}

// Duration is the arrival time of the last request.
func (w *Workload) Duration() int64 {
	if len(w.Requests) == 0 {
		return 0
	}
	return w.Requests[len(w.Requests)-1].Arrival
}

// ScaleRate rescales the arrival times so the mean rate becomes rps requests
// per second, keeping the shape of the arrival process (bursts stay bursts).
// Multi-turn think times scale with it.
func (w *Workload) ScaleRate(rps float64) {
	if len(w.Requests) < 2 || rps <= 0 {
		return
	}
	cur := float64(len(w.Requests)-1) / (float64(w.Duration()) / 1e9)
	if cur <= 0 || math.IsInf(cur, 0) {
		return
	}
	f := cur / rps
	for i := range w.Requests {
		w.Requests[i].Arrival = int64(float64(w.Requests[i].Arrival) * f)
	}
}

func (w *Workload) sortByArrival() {
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].Arrival < w.Requests[j].Arrival })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
}

// poisson returns n arrival times of a Poisson process of the given rate.
func poisson(rng *rand.Rand, n int, rps float64) []int64 {
	out := make([]int64, n)
	t := 0.0
	for i := range out {
		out[i] = int64(t * 1e9)
		t += rng.ExpFloat64() / rps
	}
	return out
}

// segID derives a segment id from a namespace, a seed and indices, so that the
// ids of different generators and seeds never collide by accident.
func segID(ns string, seed uint64, a, b int) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(ns); i++ {
		h = (h ^ uint64(ns[i])) * 1099511628211
	}
	h = mix(h ^ seed)
	h = mix(h ^ uint64(a)<<32 ^ uint64(uint32(b)))
	return h
}

func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func params(kv ...any) string {
	b := make([]byte, 0, 64)
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%v=%v", kv[i], kv[i+1])
	}
	return string(b)
}
