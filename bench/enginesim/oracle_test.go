package enginesim

import "testing"

// TestCachedPrefixTokens: the read-only query predicts exactly the hit the
// engine then reports when the request is scheduled.
func TestCachedPrefixTokens(t *testing.T) {
	shared, tests := prefixCases()
	tests = append(tests,
		prefixCase{"shorter than a block", shared[:4*10], "", "", 0},
		prefixCase{"empty prompt", nil, "", "", 0})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, nil)
			if got := e.CachedPrefixTokens(shared, "", ""); got != 0 {
				t.Fatalf("cold engine holds %d tokens", got)
			}
			submit(t, e, &Request{ID: 1, Prompt: shared, MaxTokens: 1}, 0)
			now := drain(t, e, nil)
			before := e.Stats()
			got := e.CachedPrefixTokens(tc.second, tc.adapter, tc.salt)
			if got != tc.want {
				t.Fatalf("CachedPrefixTokens = %d, want %d", got, tc.want)
			}
			if e.Stats() != before {
				t.Fatal("the query changed engine counters")
			}
			if len(tc.second) == 0 {
				return
			}
			b := &Request{ID: 2, Prompt: tc.second, Adapter: tc.adapter, CacheSalt: tc.salt, MaxTokens: 1}
			submit(t, e, b, now)
			drain(t, e, nil)
			if b.CachedTokens != got {
				t.Fatalf("engine reported %d cached tokens, query said %d", b.CachedTokens, got)
			}
		})
	}
}

// TestCachedPrefixTokensAfterEviction: once LRU eviction takes a prompt's
// blocks (tails first), the query says so, unlike a router's speculative
// index, and the engine agrees when the prompt comes back.
func TestCachedPrefixTokensAfterEviction(t *testing.T) {
	tests := []struct {
		name  string
		other int // tokens of the request that evicts
		want  int
	}{
		{"19 of 20 blocks taken: a's first block survives", 304, 16},
		{"all 20 blocks taken", 320, 0},
		{"10 free blocks suffice: nothing evicted", 160, 144},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, func(c *Config) { c.NumGPUBlocks = 20 })
			a := prompt("a", 160) // 10 blocks
			submit(t, e, &Request{ID: 1, Prompt: a, MaxTokens: 1}, 0)
			now := drain(t, e, nil)
			if got := e.CachedPrefixTokens(a, "", ""); got != 144 {
				t.Fatalf("after a: %d, want 144", got)
			}
			submit(t, e, &Request{ID: 2, Prompt: prompt("b", tc.other), MaxTokens: 1}, now)
			now = drain(t, e, nil)
			got := e.CachedPrefixTokens(a, "", "")
			if got != tc.want {
				t.Fatalf("after b: %d, want %d", got, tc.want)
			}
			again := &Request{ID: 3, Prompt: a, MaxTokens: 1}
			submit(t, e, again, now)
			drain(t, e, nil)
			if again.CachedTokens != got {
				t.Fatalf("engine reported %d, query said %d", again.CachedTokens, got)
			}
		})
	}
}

func TestCachedPrefixTokensZeroAllocs(t *testing.T) {
	e := newTestEngine(t, nil)
	p := prompt("sys", 4096)
	submit(t, e, &Request{ID: 1, Prompt: p, MaxTokens: 1}, 0)
	drain(t, e, nil)
	if n := testing.AllocsPerRun(50, func() { e.CachedPrefixTokens(p, "lora-a", "") }); n != 0 {
		t.Fatalf("%v allocs per query", n)
	}
}

// TestCachedPrefixTokensInFlight: blocks of a request already submitted
// (waiting or running) count, as the engine computes them first.
func TestCachedPrefixTokensInFlight(t *testing.T) {
	e := newTestEngine(t, nil)
	shared := prompt("sys", 160)
	longer := append(append([]byte(nil), shared...), prompt("more", 64)...) // 14 blocks
	submit(t, e, &Request{ID: 1, Prompt: longer, MaxTokens: 4}, 0)
	if got := e.CachedPrefixTokens(shared, "", ""); got != 144 {
		t.Fatalf("waiting request's blocks: %d, want 144", got)
	}
	if got := e.CachedPrefixTokens(longer, "lora-a", ""); got != 0 {
		t.Fatalf("other adapter: %d, want 0", got)
	}
	e.Advance(e.NextEventTime(), nil) // first step: running
	if got := e.CachedPrefixTokens(longer, "", ""); got != 208 {
		t.Fatalf("running request's blocks: %d, want 208", got)
	}
	b := &Request{ID: 2, Prompt: longer, MaxTokens: 1}
	submit(t, e, b, e.NextEventTime())
	drain(t, e, nil)
	if b.CachedTokens != 208 {
		t.Fatalf("engine reported %d", b.CachedTokens)
	}
}
