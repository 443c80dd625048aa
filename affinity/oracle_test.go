package affinity

import (
	"strings"
	"sync/atomic"
	"testing"
)

// fixedOracle answers from a table by replica and counts its calls.
type fixedOracle struct {
	tok   []int
	calls atomic.Int64
	asked []bool // per replica, set when queried
}

func (o *fixedOracle) CachedTokens(id ReplicaID, _ *Request) int {
	o.calls.Add(1)
	if o.asked != nil {
		o.asked[id] = true
	}
	return o.tok[id]
}

func TestCacheOracle(t *testing.T) {
	sys := strings.Repeat("abcdefgh", 2048) // 16 KiB = 4096 tokens
	req := promptReq(t, sys, "question")
	tests := []struct {
		name       string
		policy     string
		tok        []int // oracle answers per replica; nil = no oracle
		warmOn     int   // replica whose index holds the prefix (-1 none)
		wantFirst  int
		wantCached int // Decision.CachedTokens[0]
	}{
		{"index only", "cost", nil, 1, 1, 4096},
		{"oracle overrides a stale index", "cost", []int{0, 0, 3000, 0}, 1, 2, 3000},
		{"prefix policy follows the oracle", "prefix", []int{0, 0, 0, 700}, 1, 3, 700},
		{"oracle answer capped at the prompt", "prefix", []int{0, 1 << 40, 0, 0}, -1, 1, req.PromptTokens},
		{"negative reads as zero", "cost", []int{-5, -5, -5, 100}, -1, 3, 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ids := buildRouter(t, Config{Policy: tc.policy}, state{n: 4})
			if tc.warmOn >= 0 {
				warm(r, ids[tc.warmOn], req)
			}
			if tc.tok != nil {
				r.SetCacheOracle(&fixedOracle{tok: tc.tok})
			}
			d := decide(t, r, req)
			if d.Ranked[0] != ids[tc.wantFirst] || d.CachedTokens[0] != tc.wantCached {
				t.Fatalf("ranked %v cached %v, want %d first with %d cached", d.Ranked, d.CachedTokens, tc.wantFirst, tc.wantCached)
			}
		})
	}
}

func TestCacheOracleOffAndCandidatesOnly(t *testing.T) {
	sys := strings.Repeat("abcdefgh", 2048)
	req := promptReq(t, sys, "question")
	r, ids := buildRouter(t, Config{}, state{n: 4})
	warm(r, ids[1], req)
	o := &fixedOracle{tok: []int{0, 0, 0, 4000}, asked: make([]bool, 4)}
	r.SetCacheOracle(o)
	r.SetHealthy(ids[3], false)
	d := decide(t, r, req)
	if o.asked[3] {
		t.Fatal("oracle asked about an ineligible replica")
	}
	if got := o.calls.Load(); got != 3 {
		t.Fatalf("oracle called %d times for 3 candidates", got)
	}
	if d.CachedTokens[0] != 0 {
		t.Fatalf("oracle says no candidate holds the prefix, decision predicts %d", d.CachedTokens[0])
	}
	// Off again: the index (warm on replica 1, kept up by Begin) answers.
	r.SetCacheOracle(nil)
	d = decide(t, r, req)
	if d.Ranked[0] != ids[1] || d.CachedTokens[0] != 4096 {
		t.Fatalf("oracle off: ranked %v cached %v, want replica 1 with 4096", d.Ranked, d.CachedTokens)
	}
	if got := o.calls.Load(); got != 3 {
		t.Fatalf("oracle called after SetCacheOracle(nil): %d calls", got)
	}
}

// TestCacheOracleZeroAllocs: deciding with an oracle allocates nothing once
// warm (the hook is an interface call per candidate into reused scratch).
func TestCacheOracleZeroAllocs(t *testing.T) {
	r, _ := newTestRouter(t, Config{}, 16)
	tok := make([]int, 16)
	for i := range tok {
		tok[i] = i * 100
	}
	r.SetCacheOracle(&fixedOracle{tok: tok})
	p := NewParser(r.HashConfig())
	body := chatBody("m", longSystem, "first", "answer", "second")
	var (
		pr  Prompt
		req Request
		d   Decision
		f   Flight
	)
	now := int64(1)
	run := func() {
		if err := p.ParseChat(body, &pr); err != nil {
			t.Fatal(err)
		}
		now++
		pr.Fill(&req, now)
		if err := r.Decide(&req, &d); err != nil {
			t.Fatal(err)
		}
		r.Begin(d.Ranked[0], &req, &d, &f)
		r.FirstToken(&f, now)
		r.End(&f, now, -1, true)
	}
	for range 10 {
		run()
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocs per decision with an oracle", n)
	}
}
