package enginesim

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// testTiming has round numbers so expected times are easy to write.
var testTiming = Timing{
	StepBase:        time.Millisecond,
	PerPrefillToken: 10 * time.Microsecond,
	PerDecodeSeq:    100 * time.Microsecond,
	PerContextToken: 0,
}

func newTestEngine(t testing.TB, mutate func(*Config)) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Timing = testTiming
	cfg.NumGPUBlocks = 1024
	if mutate != nil {
		mutate(&cfg)
	}
	e, err := NewEngine(cfg)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	return e
}

// recorder counts events and checks their order.
type recorder struct {
	t        testing.TB
	tokens   map[*Request]int
	finished []*Request
}

func newRecorder(t testing.TB) *recorder { return &recorder{t: t, tokens: map[*Request]int{}} }

func (o *recorder) OnToken(r *Request, at int64) {
	o.tokens[r]++
	if o.tokens[r] != r.OutputTokens {
		o.t.Errorf("request %d: event %d but OutputTokens %d", r.ID, o.tokens[r], r.OutputTokens)
	}
}

func (o *recorder) OnFinish(r *Request, at int64) {
	if r.OutputTokens != r.OutputTarget || r.FinishedAt != at {
		o.t.Errorf("request %d finished with %d/%d tokens at %d (FinishedAt %d)", r.ID, r.OutputTokens, r.OutputTarget, at, r.FinishedAt)
	}
	o.finished = append(o.finished, r)
}

var _ Observer = (*recorder)(nil)

// drain runs the engine until it is idle and returns the final time.
func drain(t testing.TB, e *Engine, obs Observer) int64 {
	t.Helper()
	var now int64
	for i := 0; ; i++ {
		next := e.NextEventTime()
		if next == NoEvent {
			return now
		}
		if i > 1_000_000 {
			t.Fatal("engine did not drain")
		}
		if next < now {
			t.Fatalf("NextEventTime %d went back before %d", next, now)
		}
		now = next
		e.Advance(now, obs)
	}
}

// prompt returns n tokens (4n bytes) of text derived from tag: prompts with
// the same tag share their leading tokens.
func prompt(tag string, n int) []byte {
	var b []byte
	for i := 0; len(b) < 4*n; i++ {
		b = fmt.Appendf(b, "%s%06d|", tag, i)
	}
	return b[:4*n]
}

func submit(t testing.TB, e *Engine, r *Request, now int64) {
	t.Helper()
	if err := e.Submit(r, now); err != nil {
		t.Fatalf("Submit(%d): %v", r.ID, err)
	}
}

func TestPrefixReuse(t *testing.T) {
	shared, tests := prefixCases()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, nil)
			rec := newRecorder(t)
			a := &Request{ID: 1, Prompt: shared, MaxTokens: 1}
			submit(t, e, a, 0)
			now := drain(t, e, rec)
			if a.CachedTokens != 0 {
				t.Fatalf("cold request cached %d tokens", a.CachedTokens)
			}
			b := &Request{ID: 2, Prompt: tc.second, Adapter: tc.adapter, CacheSalt: tc.salt, MaxTokens: 1}
			submit(t, e, b, now)
			drain(t, e, rec)
			if b.CachedTokens != tc.want {
				t.Errorf("CachedTokens = %d, want %d", b.CachedTokens, tc.want)
			}
			st := e.Stats()
			if st.PrefixHits != uint64(tc.want) || st.PrefixQueries != uint64(a.PromptTokens+b.PromptTokens) {
				t.Errorf("prefix stats hits=%d queries=%d, want %d and %d", st.PrefixHits, st.PrefixQueries, tc.want, a.PromptTokens+b.PromptTokens)
			}
		})
	}
}

func TestPrefixCachingDisabled(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.DisablePrefixCaching = true })
	p := prompt("sys", 160)
	a, b := &Request{ID: 1, Prompt: p, MaxTokens: 1}, &Request{ID: 2, Prompt: p, MaxTokens: 1}
	submit(t, e, a, 0)
	now := drain(t, e, nil)
	submit(t, e, b, now)
	drain(t, e, nil)
	if b.CachedTokens != 0 || b.TTFT() != a.TTFT() {
		t.Errorf("caching off: cached=%d ttft %v vs %v", b.CachedTokens, b.TTFT(), a.TTFT())
	}
}

func TestLRUEviction(t *testing.T) {
	// 8 blocks; each prompt is 4 blocks (64 tokens) and generates 1 token.
	e := newTestEngine(t, func(c *Config) { c.NumGPUBlocks = 8 })
	run := func(tag string, id uint64) *Request {
		t.Helper()
		r := &Request{ID: id, Prompt: prompt(tag, 64), MaxTokens: 1}
		submit(t, e, r, drain(t, e, nil))
		drain(t, e, nil)
		return r
	}
	run("a", 1)
	run("b", 2)
	if got := e.Stats().UsedBlocks; got != 0 {
		t.Fatalf("UsedBlocks after finish = %d, want 0 (freed but cached)", got)
	}
	if b := run("b", 3); b.CachedTokens != 48 {
		t.Fatalf("b again: cached %d, want 48", b.CachedTokens)
	}
	// b's rerun recomputed its last block into the LRU head: a's last block.
	if ev := e.Stats().Evictions; ev != 1 {
		t.Errorf("evictions = %d, want 1", ev)
	}
	// c needs 4 fresh blocks: the least recently freed are a's other three
	// and b's original last block.
	run("c", 4)
	if ev := e.Stats().Evictions; ev != 5 {
		t.Errorf("evictions = %d, want 5", ev)
	}
	if b := run("b", 5); b.CachedTokens != 48 {
		t.Errorf("b after c: cached %d, want 48 (b was used more recently than a)", b.CachedTokens)
	}
	if a := run("a", 6); a.CachedTokens != 0 {
		t.Errorf("a after c: cached %d, want 0 (evicted)", a.CachedTokens)
	}
}

func TestCapacity(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.NumGPUBlocks = 8; c.MaxModelLen = 1000 })
	tests := []struct {
		name string
		r    Request
		want error
	}{
		{"fits exactly", Request{Prompt: prompt("x", 100), MaxTokens: 29}, nil},
		{"one token too many for the cache", Request{Prompt: prompt("x", 100), MaxTokens: 30}, ErrKVCapacity},
		{"over max_model_len", Request{Prompt: prompt("x", 990), MaxTokens: 20}, ErrPromptTooLong},
		{"empty prompt", Request{MaxTokens: 1}, ErrEmptyPrompt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			if err := e.Submit(&r, 0); err != tc.want {
				t.Fatalf("Submit = %v, want %v", err, tc.want)
			}
			if tc.want == nil {
				drain(t, e, nil)
				if r.OutputTokens != r.MaxTokens {
					t.Errorf("generated %d, want %d", r.OutputTokens, r.MaxTokens)
				}
			}
		})
	}
	// Many requests at once never use more than the capacity.
	var rs []*Request
	for i := range 20 {
		r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint(i), 40), MaxTokens: 50}
		submit(t, e, r, 0)
		rs = append(rs, r)
	}
	for e.NextEventTime() != NoEvent {
		e.Advance(e.NextEventTime(), nil)
		if st := e.Stats(); st.UsedBlocks > st.TotalBlocks || st.KVUsage() > 1 {
			t.Fatalf("used %d of %d blocks", st.UsedBlocks, st.TotalBlocks)
		}
	}
	for _, r := range rs {
		if r.Finish != FinishLength || r.OutputTokens != 50 {
			t.Errorf("request %d: finish %v after %d tokens", r.ID, r.Finish, r.OutputTokens)
		}
	}
}

func TestBatching(t *testing.T) {
	e := newTestEngine(t, nil)
	rec := newRecorder(t)
	var rs []*Request
	for i := range 4 {
		r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint("p", i), 100), MaxTokens: 10}
		submit(t, e, r, 0)
		rs = append(rs, r)
	}
	drain(t, e, rec)
	// One prefill step for all four, then 9 decode steps of 4 sequences.
	prefill := int64(time.Millisecond + 400*10*time.Microsecond)
	decode := int64(time.Millisecond + 4*100*time.Microsecond)
	for _, r := range rs {
		if r.FirstTokenAt != prefill {
			t.Errorf("request %d first token at %d, want %d (batched prefill)", r.ID, r.FirstTokenAt, prefill)
		}
		if want := prefill + 9*decode; r.FinishedAt != want {
			t.Errorf("request %d finished at %d, want %d", r.ID, r.FinishedAt, want)
		}
	}
	if st := e.Stats(); st.Steps != 10 || st.GenerationTokens != 40 || len(rec.finished) != 4 {
		t.Errorf("steps=%d tokens=%d finished=%d, want 10, 40, 4", st.Steps, st.GenerationTokens, len(rec.finished))
	}
}

func TestMaxNumSeqs(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.MaxNumSeqs = 2 })
	var rs []*Request
	for i := range 4 {
		r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint("p", i), 100), MaxTokens: 5}
		submit(t, e, r, 0)
		rs = append(rs, r)
	}
	e.Advance(0, nil) // plan the first step
	if st := e.Stats(); st.Running != 2 || st.Waiting != 2 {
		t.Fatalf("running=%d waiting=%d, want 2 and 2", st.Running, st.Waiting)
	}
	drain(t, e, nil)
	if !(rs[2].ScheduledAt >= rs[0].FinishedAt && rs[3].ScheduledAt >= rs[1].FinishedAt) {
		t.Errorf("queued requests started before a slot freed: %d %d vs %d %d", rs[2].ScheduledAt, rs[3].ScheduledAt, rs[0].FinishedAt, rs[1].FinishedAt)
	}
}

func TestTokenBudgetChunkedPrefill(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.MaxNumBatchedTokens = 128 })
	long := &Request{ID: 1, Prompt: prompt("long", 300), MaxTokens: 3}
	submit(t, e, long, 0)
	drain(t, e, nil)
	// Chunks of 128, 128, 44: three steps, each paying the base.
	want := 3*time.Millisecond + 300*10*time.Microsecond
	if long.TTFT() != want {
		t.Errorf("chunked TTFT = %v, want %v", long.TTFT(), want)
	}
	// A decoding request shares the budget: while it decodes, the long
	// prompt gets 127 tokens per step instead of 128.
	e2 := newTestEngine(t, func(c *Config) { c.MaxNumBatchedTokens = 128 })
	dec := &Request{ID: 2, Prompt: prompt("short", 10), MaxTokens: 100}
	submit(t, e2, dec, 0)
	e2.Advance(0, nil)
	e2.Advance(e2.NextEventTime(), nil) // dec's prefill done, now decoding
	start := e2.NextEventTime()
	long2 := &Request{ID: 3, Prompt: prompt("long", 300), MaxTokens: 3}
	submit(t, e2, long2, start)
	for long2.OutputTokens == 0 {
		e2.Advance(e2.NextEventTime(), nil)
	}
	// 127 + 127 + 46: three steps, each with one decode.
	want2 := 3*(time.Millisecond+100*time.Microsecond) + 300*10*time.Microsecond
	if long2.TTFT() != want2 {
		t.Errorf("TTFT next to a decode = %v, want %v", long2.TTFT(), want2)
	}
}

func TestPreemption(t *testing.T) {
	// 10 blocks; two requests of 2 prompt blocks growing to 8 blocks each.
	e := newTestEngine(t, func(c *Config) { c.NumGPUBlocks = 10 })
	rec := newRecorder(t)
	a := &Request{ID: 1, Prompt: prompt("a", 32), MaxTokens: 90}
	b := &Request{ID: 2, Prompt: prompt("b", 32), MaxTokens: 90}
	submit(t, e, a, 0)
	submit(t, e, b, 0)
	drain(t, e, rec)
	if e.Stats().Preemptions == 0 || b.Preemptions == 0 {
		t.Fatalf("no preemption: stats %d, b %d", e.Stats().Preemptions, b.Preemptions)
	}
	if a.Preemptions != 0 {
		t.Errorf("a (first come) was preempted %d times", a.Preemptions)
	}
	for _, r := range []*Request{a, b} {
		if r.Finish != FinishLength || r.OutputTokens != 90 || rec.tokens[r] != 90 {
			t.Errorf("request %d: %v after %d tokens (%d events)", r.ID, r.Finish, r.OutputTokens, rec.tokens[r])
		}
	}
	if a.FinishedAt >= b.FinishedAt {
		t.Errorf("a finished at %d, not before b at %d", a.FinishedAt, b.FinishedAt)
	}
	if st := e.Stats(); st.UsedBlocks != 0 {
		t.Errorf("blocks leaked: %d used", st.UsedBlocks)
	}
}

func TestCachedPrefixShortensTTFTByModelledAmount(t *testing.T) {
	// the linear terms only: TestPrefillAttentionTerm covers the quadratic one
	lin := DefaultTiming()
	lin.PerPrefillKPairs = 0
	e := newTestEngine(t, func(c *Config) { c.Timing = lin })
	sys := prompt("system", 2000)
	a := &Request{ID: 1, Prompt: append(append([]byte(nil), sys...), prompt("q1", 50)...), MaxTokens: 20}
	b := &Request{ID: 2, Prompt: append(append([]byte(nil), sys...), prompt("q2", 50)...), MaxTokens: 20}
	submit(t, e, a, 0)
	now := drain(t, e, nil)
	submit(t, e, b, now)
	drain(t, e, nil)
	if b.CachedTokens != 2000 {
		t.Fatalf("cached %d, want 2000", b.CachedTokens)
	}
	tm := lin
	if want := tm.StepBase + time.Duration(a.PromptTokens)*tm.PerPrefillToken; a.TTFT() != want {
		t.Errorf("cold TTFT %v, want %v", a.TTFT(), want)
	}
	if got, want := a.TTFT()-b.TTFT(), time.Duration(b.CachedTokens)*tm.PerPrefillToken; got != want {
		t.Errorf("TTFT saving %v, want cached×PerPrefillToken = %v", got, want)
	}
}

func TestQueueingGrowsTTFTUnderOverload(t *testing.T) {
	run := func(gap time.Duration) []time.Duration {
		e := newTestEngine(t, func(c *Config) { c.Timing = DefaultTiming(); c.MaxNumSeqs = 16 })
		var rs []*Request
		now := int64(0)
		for i := range 64 {
			r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint("u", i), 1000), MaxTokens: 200}
			e.Advance(now, nil)
			submit(t, e, r, now)
			rs = append(rs, r)
			now += int64(gap)
		}
		drain(t, e, nil)
		out := make([]time.Duration, len(rs))
		for i, r := range rs {
			out[i] = r.TTFT()
		}
		return out
	}
	light := run(5 * time.Second) // each request alone
	heavy := run(time.Millisecond)
	for i := range light {
		if light[i] != light[0] {
			t.Fatalf("light load TTFT varies: %v vs %v", light[i], light[0])
		}
	}
	if !(heavy[63] > heavy[31] && heavy[31] > heavy[15] && heavy[15] > light[0]) {
		t.Errorf("overload TTFT does not grow: light %v, heavy #15 %v #31 %v #63 %v", light[0], heavy[15], heavy[31], heavy[63])
	}
}

func TestDeterministic(t *testing.T) {
	run := func(seed uint64) string {
		e := newTestEngine(t, func(c *Config) { c.Seed = seed; c.NumGPUBlocks = 200; c.MaxNumSeqs = 8 })
		var rs []*Request
		rec := newRecorder(t)
		for i := range 40 {
			r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint("s", i%5), 50+i*7)}
			e.Advance(int64(i)*int64(3*time.Millisecond), rec)
			submit(t, e, r, int64(i)*int64(3*time.Millisecond))
			rs = append(rs, r)
		}
		drain(t, e, rec)
		if len(rec.finished) != len(rs) {
			t.Errorf("%d of %d finished", len(rec.finished), len(rs))
		}
		var b bytes.Buffer
		for _, r := range rs {
			fmt.Fprintf(&b, "%d %d %d %d %d %d %v %q\n", r.ID, r.CachedTokens, r.OutputTokens, r.FirstTokenAt, r.FinishedAt, r.Preemptions, r.Finish, r.AppendOutput(nil, 0, 5))
		}
		return b.String()
	}
	a, b, c := run(7), run(7), run(8)
	if a != b {
		t.Errorf("same seed, different runs:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("different seeds gave identical runs")
	}
}

func TestAbortAndReset(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.MaxNumSeqs = 1 })
	a := &Request{ID: 1, Prompt: prompt("a", 64), MaxTokens: 50}
	b := &Request{ID: 2, Prompt: prompt("b", 64), MaxTokens: 50}
	submit(t, e, a, 0)
	submit(t, e, b, 0)
	e.Advance(0, nil)
	if !e.Abort(b, 0) || b.Finish != FinishAbort || e.Stats().Waiting != 0 {
		t.Fatalf("abort waiting: finish %v, waiting %d", b.Finish, e.Stats().Waiting)
	}
	if !e.Abort(a, 0) || e.Stats().UsedBlocks != 0 || e.Stats().Running != 0 {
		t.Fatalf("abort running: %+v", e.Stats())
	}
	if e.Abort(a, 0) {
		t.Error("second abort reported true")
	}
	drain(t, e, newRecorder(t)) // the in-progress step completes without events
	// Resubmit, then Reset mid-flight: cache wiped.
	submit(t, e, a, 0)
	drain(t, e, nil)
	c := &Request{ID: 3, Prompt: prompt("a", 64), MaxTokens: 50}
	submit(t, e, c, 0)
	e.Advance(0, nil)
	e.Reset()
	if st := e.Stats(); st.Running+st.Waiting+st.UsedBlocks != 0 || e.NextEventTime() != NoEvent {
		t.Fatalf("after reset: %+v", st)
	}
	d := &Request{ID: 4, Prompt: prompt("a", 64), MaxTokens: 1}
	submit(t, e, d, 0)
	drain(t, e, nil)
	if d.CachedTokens != 0 {
		t.Errorf("cache survived reset: %d cached", d.CachedTokens)
	}
}

func TestChatTemplateSharing(t *testing.T) {
	sys := Message{Role: "system", Content: "You are a helpful assistant. Be brief."}
	p1 := AppendChatPrompt(nil, []Message{{Role: "user", Content: "hi"}, sys}, nil)
	p2 := AppendChatPrompt(nil, []Message{sys, {Role: "user", Content: "hello there"}}, nil)
	if len(p1)%4 != 0 || len(p2)%4 != 0 {
		t.Fatalf("prompts not token aligned: %d %d", len(p1), len(p2))
	}
	sysLen := len(AppendChatPrompt(nil, []Message{sys}, nil)) - len(appendHeader(nil, "assistant"))
	if !bytes.Equal(p1[:sysLen], p2[:sysLen]) {
		t.Errorf("system message not rendered first:\n%q\n%q", p1, p2)
	}
	// Multi-turn: the answer sent back reuses the generated blocks.
	e := newTestEngine(t, nil)
	turn1 := []Message{{Role: "system", Content: string(prompt("sys", 100))}, {Role: "user", Content: "question one"}}
	r1 := &Request{ID: 1, Prompt: AppendChatPrompt(nil, turn1, nil)}
	submit(t, e, r1, 0)
	now := drain(t, e, nil)
	answer := string(r1.AppendOutput(nil, 0, r1.OutputTokens))
	turn2 := append(turn1, Message{Role: "assistant", Content: answer}, Message{Role: "user", Content: "and two?"})
	r2 := &Request{ID: 2, Prompt: AppendChatPrompt(nil, turn2, nil), MaxTokens: 1}
	if !bytes.HasPrefix(r2.Prompt, r1.Prompt) {
		t.Fatal("turn 2 prompt does not extend turn 1")
	}
	submit(t, e, r2, now)
	drain(t, e, nil)
	kv := r1.PromptTokens + r1.OutputTokens - 1 // the last token's KV is never computed
	if want := kv / 16 * 16; r2.CachedTokens != want {
		t.Errorf("turn 2 cached %d tokens, want %d (prompt %d + answer %d)", r2.CachedTokens, want, r1.PromptTokens, r1.OutputTokens)
	}
}

func TestSteadyStateAllocs(t *testing.T) {
	e := newTestEngine(t, nil)
	p := prompt("sys", 500)
	reqs := make([]Request, 8)
	cycle := func() {
		for i := range reqs {
			reqs[i] = Request{ID: uint64(i), Prompt: p, MaxTokens: 40}
			if err := e.Submit(&reqs[i], 0); err != nil {
				t.Fatal(err)
			}
		}
		for e.NextEventTime() != NoEvent {
			e.Advance(e.NextEventTime(), nil)
		}
	}
	cycle()
	if n := testing.AllocsPerRun(20, cycle); n != 0 {
		t.Errorf("steady-state submit+advance allocates %v times per cycle", n)
	}
}

// chainer resubmits each finished request from OnFinish (the next turn),
// checking that time never runs backwards.
type chainer struct {
	t     *testing.T
	e     *Engine
	turns map[*Request]int
	last  int64
}

func (c *chainer) OnToken(r *Request, at int64) {
	if at < c.last || at < r.Arrival {
		c.t.Errorf("event at %d after %d (arrival %d)", at, c.last, r.Arrival)
	}
	c.last = at
}

func (c *chainer) OnFinish(r *Request, at int64) {
	c.turns[r]++
	if c.turns[r] < 3 {
		r.Prompt = append(append([]byte(nil), r.Prompt...), prompt("next", 20)...)
		if err := c.e.Submit(r, at); err != nil {
			c.t.Errorf("resubmit from OnFinish: %v", err)
		}
	}
}

func TestResubmitFromObserver(t *testing.T) {
	e := newTestEngine(t, nil)
	c := &chainer{t: t, e: e, turns: map[*Request]int{}}
	var rs []*Request
	for i := range 5 {
		r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint("chat", i), 64), MaxTokens: 5 + i}
		submit(t, e, r, int64(i)*int64(time.Millisecond))
		rs = append(rs, r)
	}
	drain(t, e, c)
	for _, r := range rs {
		if c.turns[r] != 3 || r.Finish != FinishLength {
			t.Errorf("request %d: %d turns, finish %v", r.ID, c.turns[r], r.Finish)
		}
		if r.CachedTokens < 64 {
			t.Errorf("request %d: third turn cached %d tokens, want >= 64 (earlier turns)", r.ID, r.CachedTokens)
		}
	}
}

func TestOutputVocabulary(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range words {
		if len(w) != BytesPerToken || seen[w] || w == eosText {
			t.Errorf("word %q: every word must be one distinct %d-byte token", w, BytesPerToken)
		}
		seen[w] = true
	}
}

// TestPromptReusableAfterSubmit: the engine reads a request's prompt only in
// Submit, so overwriting the buffer afterwards changes nothing. The next
// turn (the prompt, its partial last block, then the answer) hits the first
// turn's blocks, generated ones included, exactly as when the buffer is
// left alone.
func TestPromptReusableAfterSubmit(t *testing.T) {
	run := func(scribble bool) (cached int, answer string) {
		e := newTestEngine(t, nil)
		obs := newRecorder(t)
		p := prompt("turn", 999) // 62 full blocks and 7 tokens
		buf := append([]byte(nil), p...)
		r1 := &Request{ID: 1, Prompt: buf, MaxTokens: 40}
		submit(t, e, r1, 0)
		if scribble {
			for i := range buf {
				buf[i] = 'x'
			}
		}
		now := drain(t, e, obs)
		out := r1.AppendOutput(nil, 0, r1.OutputTokens)
		next := append(append([]byte(nil), p...), out...)
		r2 := &Request{ID: 2, Prompt: append(next, prompt("q", 64)...), MaxTokens: 1}
		submit(t, e, r2, now)
		drain(t, e, obs)
		return r2.CachedTokens, string(out)
	}
	c0, a0 := run(false)
	c1, a1 := run(true)
	if c0 != c1 || a0 != a1 {
		t.Fatalf("prompt overwritten after Submit: next turn cached %d, answer %q; untouched: %d, %q", c1, a1, c0, a0)
	}
	// the hit covers the partial block and the answer's full blocks
	if c0 <= 999/16*16 {
		t.Fatalf("next turn cached %d tokens: the first turn's last partial block and answer did not hit", c0)
	}
}

// TestReleasedCacheIsFresh: an engine built on the KV cache a released
// engine gave back (Release) runs exactly as one built on a new cache,
// though the cache it inherits is full of the first engine's blocks.
func TestReleasedCacheIsFresh(t *testing.T) {
	mutate := func(c *Config) { c.NumGPUBlocks = 97; c.MaxNumSeqs = 8; c.OutputLen.Max = 64 }
	run := func(e *Engine) string {
		var b bytes.Buffer
		rec := newRecorder(t)
		var rs []*Request
		for i := range 40 {
			r := &Request{ID: uint64(i), Prompt: prompt(fmt.Sprint("s", i%5), 50+i*7)}
			e.Advance(int64(i)*int64(3*time.Millisecond), rec)
			submit(t, e, r, int64(i)*int64(3*time.Millisecond))
			rs = append(rs, r)
		}
		drain(t, e, rec)
		for _, r := range rs {
			fmt.Fprintf(&b, "%d %d %d %d %d %v\n", r.ID, r.CachedTokens, r.FirstTokenAt, r.FinishedAt, r.Preemptions, r.Finish)
		}
		fmt.Fprintf(&b, "%+v\n", e.Stats())
		return b.String()
	}
	first := newTestEngine(t, mutate)
	want := run(first)
	if first.Stats().Evictions == 0 || first.Stats().Preemptions == 0 {
		t.Fatalf("the first engine should evict and preempt: %+v", first.Stats())
	}
	pool := first.pool
	first.Release()
	second := newTestEngine(t, mutate)
	if second.pool != pool {
		t.Fatal("the second engine did not take the released cache")
	}
	if got := run(second); got != want {
		t.Errorf("engine on a released cache:\n%s\nfresh engine:\n%s", got, want)
	}
}
