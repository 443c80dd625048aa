package affinity

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// newTestRouter builds a router with n replicas named r0..r{n-1} serving "m".
func newTestRouter(t testing.TB, cfg Config, n int) (*Router, []ReplicaID) {
	t.Helper()
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	ids := make([]ReplicaID, n)
	for i := range n {
		id, err := r.AddReplica(ReplicaSpec{Name: fmt.Sprintf("r%d", i), Models: []string{"m"}})
		if err != nil {
			t.Fatalf("AddReplica: %v", err)
		}
		ids[i] = id
	}
	return r, ids
}

// chatBody builds a chat request with a system prompt and user turns.
func chatBody(model, system string, turns ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"messages":[{"role":"system","content":%q}`, model, system)
	for i, u := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":%q}`, role, u)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// request parses body into a Request whose Hashes are a private copy.
func request(t testing.TB, body []byte, now int64) *Request {
	t.Helper()
	p := NewParser(HashConfig{})
	var pr Prompt
	if err := p.ParseChat(body, &pr); err != nil {
		t.Fatalf("ParseChat: %v", err)
	}
	return &Request{Model: append([]byte(nil), pr.Model...), Hashes: append([]uint64(nil), pr.Hashes...),
		PromptTokens: pr.Tokens, Now: now}
}

func TestRouterFlow(t *testing.T) {
	r, ids := newTestRouter(t, Config{}, 4)
	long := strings.Repeat("You are a careful assistant. ", 200)
	req := request(t, chatBody("m", long, "hello"), 1)
	var d Decision
	if err := r.Decide(req, &d); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if len(d.Ranked) != 3 || d.Policy != "cost" {
		t.Fatalf("ranked %v policy %q", d.Ranked, d.Policy)
	}
	for _, c := range d.CachedTokens {
		if c != 0 {
			t.Fatalf("cold index predicts cached %v", d.CachedTokens)
		}
	}
	var f Flight
	r.Begin(d.Ranked[0], req, &d, &f)
	if f.Replica != d.Ranked[0] || f.UncachedTokens != req.PromptTokens {
		t.Fatalf("flight %+v", f)
	}
	r.FirstToken(&f, 2)
	r.End(&f, 3, -1, true)

	// Same system prompt, new turn: the warm replica must win.
	req2 := request(t, chatBody("m", long, "hello", "hi!", "tell me more"), 4)
	if err := r.Decide(req2, &d); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.CachedTokens[0] == 0 {
		t.Fatalf("warm replica not predicted: %v %v", d.Ranked, d.CachedTokens)
	}
	st := r.Replicas()
	if len(st) != len(ids) || st[0].InFlight != 0 || st[0].PendingPrefillTokens != 0 {
		t.Fatalf("status %+v", st[0])
	}
	if _, err := r.AddReplica(ReplicaSpec{Name: "r0", Models: []string{"m"}}); err == nil {
		t.Fatal("duplicate name accepted")
	}
	if err := r.Decide(&Request{Model: []byte("nope")}, &d); !errors.Is(err, ErrModelNotFound) {
		t.Fatalf("unknown model: %v", err)
	}
	for _, id := range ids {
		r.SetHealthy(id, false)
	}
	if err := r.Decide(req, &d); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("all unhealthy: %v", err)
	}
}

// TestHotRecordSize: the per-candidate record a decision reads is four
// cache lines (README "Decision layout"); a field added past them costs
// every candidate a fifth.
func TestHotRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(repHot{}); n != 256 {
		t.Fatalf("repHot is %d bytes, want 256", n)
	}
}
