package enginesim

import (
	"fmt"
	"testing"
	"time"
)

// TestPreemptedRequestCountsItsHitOnce: a request that is preempted and
// re-admitted hits its own recomputed blocks on re-admission; its reported
// cached tokens (usage.prompt_tokens_details.cached_tokens) and the
// per-request counters keep the hit of its first scheduling only.
func TestPreemptedRequestCountsItsHitOnce(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.NumGPUBlocks = 12 })
	shared := prompt("shared", 32) // 2 blocks
	warm := &Request{ID: 1, Prompt: append(append([]byte(nil), shared...), prompt("w", 16)...), MaxTokens: 1}
	submit(t, e, warm, 0)
	now := drain(t, e, nil)
	a := &Request{ID: 2, Prompt: append(append([]byte(nil), shared...), prompt("a", 16)...), MaxTokens: 90}
	b := &Request{ID: 3, Prompt: append(append([]byte(nil), shared...), prompt("b", 16)...), MaxTokens: 90}
	submit(t, e, a, now)
	submit(t, e, b, now)
	drain(t, e, nil)
	st := e.Stats()
	if b.Preemptions == 0 {
		t.Fatalf("b was not preempted (stats %+v)", st)
	}
	for _, r := range []*Request{a, b} {
		if r.CachedTokens != 32 {
			t.Errorf("request %d: cached %d tokens, want the shared 32 of its first scheduling", r.ID, r.CachedTokens)
		}
	}
	wantCached := uint64(warm.CachedTokens + a.CachedTokens + b.CachedTokens)
	wantPrompt := uint64(warm.PromptTokens + a.PromptTokens + b.PromptTokens)
	if st.FirstCachedTokens != wantCached || st.FirstPromptTokens != wantPrompt {
		t.Errorf("per-request counters %d/%d, want %d/%d", st.FirstCachedTokens, st.FirstPromptTokens, wantCached, wantPrompt)
	}
	if st.PrefixHits <= st.FirstCachedTokens {
		t.Errorf("admission counter %d hits not above the per-request %d: the re-admission's own blocks were not counted there", st.PrefixHits, st.FirstCachedTokens)
	}
}

// TestPrefillAttentionTerm: a prefill chunk of n tokens after c computed
// ones costs n×c + n(n+1)/2 attention pairs at PerPrefillKPairs per 1000,
// on top of the linear per-token cost; so a cold prompt's attention part
// grows 4x when the prompt doubles, and a cached prefix still costs
// attention reads for the new tokens.
func TestPrefillAttentionTerm(t *testing.T) {
	tm := DefaultTiming()
	ttft := func(cachedPrefix, n int) (time.Duration, *Request) {
		return afterPrefix(t, tm, 1<<17, cachedPrefix, n) // one step: no chunking
	}
	pairsCost := func(c, n int) time.Duration {
		return time.Duration((int64(n)*int64(c) + int64(n)*int64(n+1)/2) * int64(tm.PerPrefillKPairs) / 1000)
	}
	for _, tc := range []struct{ cached, n int }{{0, 8192}, {0, 16384}, {0, 32768}, {4096, 64}} {
		t.Run(fmt.Sprintf("cached=%d/new=%d", tc.cached, tc.n), func(t *testing.T) {
			got, r := ttft(tc.cached, tc.n)
			if r.CachedTokens != tc.cached {
				t.Fatalf("cached %d, want %d", r.CachedTokens, tc.cached)
			}
			n := r.PromptTokens - r.CachedTokens
			want := tm.StepBase + time.Duration(n)*tm.PerPrefillToken + pairsCost(r.CachedTokens, n)
			if got != want {
				t.Errorf("TTFT %v, want %v", got, want)
			}
		})
	}
	// attention share of a cold prompt: 4x per doubling, ~13% at 8k, ~67% at 32k
	a8, _ := ttft(0, 8192)
	a16, _ := ttft(0, 16384)
	lin := func(n int) time.Duration { return tm.StepBase + time.Duration(n)*tm.PerPrefillToken }
	q8, q16 := a8-lin(8192), a16-lin(16384)
	if r := float64(q16) / float64(q8); r < 3.99 || r > 4.01 {
		t.Errorf("attention part 8k %v, 16k %v: ratio %.3f, want 4", q8, q16, r)
	}
	if share := float64(q8) / float64(lin(8192)-tm.StepBase); share < 0.10 || share > 0.16 {
		t.Errorf("8k-token cold prompt: attention adds %.0f%% to the linear prefill, want ~13%%", 100*share)
	}
}

// TestPrefillChunkTerms: each sequence prefilling in a step costs
// PerPrefillChunk, plus PerChunkContextToken for every token in its context
// before the chunk: a short question after a long cached prefix pays for
// that prefix beyond its pairs, a cold prompt split into chunks pays once a
// chunk, its later chunks for the chunks before them.
func TestPrefillChunkTerms(t *testing.T) {
	tm := DefaultTiming()
	tm.PerPrefillChunk, tm.PerChunkContextToken = 2*time.Millisecond, 800*time.Nanosecond
	const budget = 2048
	ttft := func(cachedPrefix, n int) (time.Duration, *Request) {
		return afterPrefix(t, tm, budget, cachedPrefix, n)
	}
	for _, tc := range []struct{ cached, n int }{{0, 16}, {4096, 16}, {0, 5000}} {
		t.Run(fmt.Sprintf("cached=%d/new=%d", tc.cached, tc.n), func(t *testing.T) {
			got, r := ttft(tc.cached, tc.n)
			if r.CachedTokens != tc.cached {
				t.Fatalf("cached %d, want %d", r.CachedTokens, tc.cached)
			}
			// one step per chunk of at most budget tokens, each after what
			// the steps before it computed
			var want time.Duration
			for c := r.CachedTokens; c < r.PromptTokens; c += budget {
				n := min(r.PromptTokens-c, budget)
				want += tm.StepBase + time.Duration(n)*tm.PerPrefillToken +
					time.Duration((int64(n)*int64(c)+int64(n)*int64(n+1)/2)*int64(tm.PerPrefillKPairs)/1000) +
					tm.PerPrefillChunk + time.Duration(c)*tm.PerChunkContextToken
			}
			if got != want {
				t.Errorf("TTFT %v, want %v", got, want)
			}
		})
	}
	// the prefix's reads: what 4,096 cached tokens add to a 16-token
	// question beyond its pairs
	short, _ := ttft(0, 16)
	long, r := ttft(4096, 16)
	n := int64(r.PromptTokens - r.CachedTokens)
	extraPairs := time.Duration(n * int64(r.CachedTokens) * int64(tm.PerPrefillKPairs) / 1000)
	if d := long - short - extraPairs; d < time.Duration(4096)*tm.PerChunkContextToken-time.Microsecond || d > time.Duration(4096)*tm.PerChunkContextToken+time.Microsecond {
		t.Errorf("4,096 cached tokens add %v beyond their pairs, want %v", d, time.Duration(4096)*tm.PerChunkContextToken)
	}
}

// afterPrefix runs, on a fresh engine of timing tm and a step budget of
// budget tokens, a request of cachedPrefix tokens (none if 0) and then one
// of the same prefix and n more, and returns the second's TTFT and itself.
func afterPrefix(t *testing.T, tm Timing, budget, cachedPrefix, n int) (time.Duration, *Request) {
	t.Helper()
	e := newTestEngine(t, func(c *Config) {
		c.Timing = tm
		c.NumGPUBlocks = 20000
		c.MaxNumBatchedTokens = budget
	})
	var now int64
	pre := prompt("doc", cachedPrefix)
	if cachedPrefix > 0 {
		submit(t, e, &Request{ID: 1, Prompt: pre, MaxTokens: 1}, 0)
		now = drain(t, e, nil)
	}
	r := &Request{ID: 2, Prompt: append(append([]byte(nil), pre...), prompt("q", n)...), MaxTokens: 1}
	submit(t, e, r, now)
	drain(t, e, nil)
	return r.TTFT(), r
}

// TestSlotModel is llama.cpp's server: each slot keeps its last request's
// tokens and a request reuses only the slot it lands in; with more distinct
// prompts than slots, the least recently used slot's cache is lost.
func TestSlotModel(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.Slots = 2; c.NumGPUBlocks = 2 * 64 })
	sys := func(tag string) []byte { return prompt(tag, 256) }
	var now int64
	run := func(id uint64, tag, q string) *Request {
		t.Helper()
		r := &Request{ID: id, Prompt: append(sys(tag), prompt(q, 16)...), MaxTokens: 4}
		submit(t, e, r, now)
		now = drain(t, e, nil)
		return r
	}
	if r := run(1, "A", "q1"); r.CachedTokens != 0 {
		t.Fatalf("cold request cached %d", r.CachedTokens)
	}
	run(2, "B", "q2") // the other (least recently used, empty) slot
	if r := run(3, "A", "q3"); r.CachedTokens != 256 {
		t.Errorf("A again: cached %d, want 256 (its slot kept A)", r.CachedTokens)
	}
	run(4, "C", "q4") // evicts B's slot (least recently used)
	if r := run(5, "B", "q5"); r.CachedTokens != 0 {
		t.Errorf("B after C: cached %d, want 0 (B's slot now holds C)", r.CachedTokens)
	}
	if r := run(6, "A", "q6"); r.CachedTokens != 0 {
		t.Errorf("A: cached %d, want 0 (B took A's slot, then the least recently used)", r.CachedTokens)
	}
	// two requests at once take both slots; a third waits for one
	a := &Request{ID: 7, Prompt: append(sys("A"), prompt("x", 16)...), MaxTokens: 50}
	b := &Request{ID: 8, Prompt: append(sys("A"), prompt("y", 16)...), MaxTokens: 50}
	c := &Request{ID: 9, Prompt: append(sys("A"), prompt("z", 16)...), MaxTokens: 50}
	for _, r := range []*Request{a, b, c} {
		submit(t, e, r, now)
	}
	drain(t, e, nil)
	if a.CachedTokens != 256 {
		t.Errorf("first concurrent A: cached %d, want 256", a.CachedTokens)
	}
	if b.ScheduledAt != a.ScheduledAt || c.ScheduledAt <= a.ScheduledAt {
		t.Errorf("scheduled at %d, %d, %d: want two at once, the third later", a.ScheduledAt, b.ScheduledAt, c.ScheduledAt)
	}
	if e.Stats().Preemptions != 0 {
		t.Errorf("slot model preempted %d times", e.Stats().Preemptions)
	}
	too := &Request{ID: 10, Prompt: prompt("long", 64*16), MaxTokens: 2}
	if err := e.Submit(too, now); err != ErrKVCapacity {
		t.Errorf("prompt longer than a slot's context: %v, want ErrKVCapacity", err)
	}
}

// TestSlotModelHostCache: with llama.cpp's host prompt cache
// (CacheRAMTokens), a slot given to an unrelated prompt first saves its
// own there, and a later request that finds no slot sharing enough loads
// it back; without the cache that prompt is lost.
func TestSlotModelHostCache(t *testing.T) {
	for _, ram := range []int{0, 1024} {
		e := newTestEngine(t, func(c *Config) { c.Slots = 2; c.NumGPUBlocks = 2 * 64; c.CacheRAMTokens = ram })
		var now int64
		run := func(id uint64, tag, q string) *Request {
			t.Helper()
			r := &Request{ID: id, Prompt: append(prompt(tag, 256), prompt(q, 16)...), MaxTokens: 4}
			submit(t, e, r, now)
			now = drain(t, e, nil)
			return r
		}
		run(1, "A", "q1")
		run(2, "B", "q2") // the other, empty slot: nothing to save
		run(3, "C", "q3") // A's slot, the least recently used: A saved
		want := 0
		if ram > 0 {
			want = 256
		}
		if r := run(4, "A", "q4"); r.CachedTokens != want {
			t.Errorf("cache-ram %d: A after C took its slot: cached %d, want %d", ram, r.CachedTokens, want)
		}
		// A's slot-mate B was saved to make room, and A, loaded, left
		// the cache (server_prompt_cache::load erases what it loads).
		if ram > 0 && (len(e.ram) != 1 || e.ramBlocks != len(e.ram[0]) || e.ram[0][0] == e.ram[0][1]) {
			t.Errorf("host cache after A's load: %d prompts, %d blocks; want B's alone", len(e.ram), e.ramBlocks)
		}
	}
}

// TestSlotModelHostCacheRules: the host cache keeps llama.cpp's rules: a
// cached prompt sharing under a quarter of itself with the request is not
// loaded, one a new save covers leaves, a save makes room by evicting the
// oldest, and a prompt over the whole budget is not saved.
func TestSlotModelHostCacheRules(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.Slots = 1; c.NumGPUBlocks = 64; c.CacheRAMTokens = 10 * 16 })
	// chain(tag, shared, n): n blocks, the first shared of them common
	// to every chain, the rest the tag's own
	chain := func(tag uint64, shared, n int) []uint64 {
		h := make([]uint64, n)
		for i := range h {
			h[i] = uint64(i+1)<<8 | 1
			if i >= shared {
				h[i] = uint64(i+1)<<8 | tag
			}
		}
		return h
	}
	e.ramSave(chain(2, 8, 8))
	s := &seq{hashes: chain(3, 1, 8)} // shares 1 of the saved prompt's 8 blocks
	if at, k := e.ramBest(s, nil); at != -1 || k != 0 {
		t.Errorf("an eighth shared: loaded %d (%d blocks), want none", at, k)
	}
	s.hashes = chain(4, 2, 8) // shares 2 of 8: a quarter
	if at, k := e.ramBest(s, nil); at != 0 || k != 2 {
		t.Errorf("a quarter shared: loaded %d (%d blocks), want entry 0, 2 blocks", at, k)
	}
	e.ramSave(chain(2, 9, 9)) // covers the first save
	if len(e.ram) != 1 || e.ramBlocks != 9 {
		t.Errorf("after a covering save: %d prompts, %d blocks; want 1, 9", len(e.ram), e.ramBlocks)
	}
	e.ramSave(chain(5, 0, 6))
	if len(e.ram) != 1 || e.ramBlocks != 6 {
		t.Errorf("6 blocks more in a 10-block cache holding 9: %d prompts, %d blocks; want the oldest gone to make room", len(e.ram), e.ramBlocks)
	}
	e.ramSave(chain(6, 0, 12))
	if len(e.ram) != 1 || e.ramBlocks != 6 {
		t.Errorf("a 12-block save in a 10-block cache: %d prompts, %d blocks; want it refused, the 6 kept", len(e.ram), e.ramBlocks)
	}
}
