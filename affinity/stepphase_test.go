package affinity

import (
	"math"
	"testing"
)

// TestStepClock: the clock takes a step's length from one stream's gaps
// (a second read within a step skipped, a stall counted as four steps at
// most) and prices the wait for the running step against half a step:
// +s/2 just after a step end, -s/2 just before the next, -s/2 on an idle
// engine, +s/2 once the step has outlasted s (a long prefill); nothing
// while it knows no step or the steps vary.
func TestStepClock(t *testing.T) {
	const ms = int64(1e6)
	var c stepClock
	if got := c.phaseAdj(5*ms, 1); got != 0 {
		t.Fatalf("no step known: phase %v, want 0", got)
	}
	for range 50 {
		c.sample(0.010)
		c.sample(0.001) // two reads of one step's events
	}
	if s, d := c.step(); math.Abs(s-0.010) > 1e-6 || d > 1e-3 {
		t.Fatalf("steady 10 ms steps: step %v, deviation %v", s, d)
	}
	c.mark(100 * ms)
	c.mark(90 * ms) // an older event read late: the clock keeps the latest
	for _, tc := range []struct {
		now, busy int64
		want      float64
	}{
		{100 * ms, 1, 0.005},
		{105 * ms, 1, 0},
		{109 * ms, 1, -0.004},
		{111 * ms, 1, 0.005}, // past a step without an end: a long one
		{99 * ms, 1, 0.005},  // an event stamped after the decision's clock
		{105 * ms, 0, -0.005},
	} {
		if got := c.phaseAdj(tc.now, tc.busy); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("now %d ms, busy %d: phase %v, want %v", tc.now/ms, tc.busy, got, tc.want)
		}
	}
	var stall stepClock
	stall.sample(0.010)
	stall.sample(1.0)
	if s, _ := stall.step(); math.Abs(s-(0.010+stepWeight*(0.040-0.010))) > 1e-6 {
		t.Errorf("a 1 s stall after 10 ms steps: step %v, want it counted as 40 ms", s)
	}
	var varied stepClock
	for range 100 {
		varied.sample(0.010)
		varied.sample(0.040) // a prefill every other step
	}
	varied.mark(100 * ms)
	if _, d := varied.step(); d <= stepSteady {
		t.Fatalf("10 and 40 ms steps: deviation %v, want above %v", d, stepSteady)
	}
	if got := varied.phaseAdj(109*ms, 1); got != 0 {
		t.Errorf("varied steps: phase %v, want 0", got)
	}
}

// stepWorld: two identical replicas, each running one stream begun and
// first answered at the same times, whose events came every 10 ms: r0's
// last at 100 ms, r1's at 100 ms less lag. A warm-up request ended on
// each first: on r0 the prompt warm (the first two blocks of
// chainOf(0, 0x9900, 0, 8)), on r1 another of the same length.
func stepWorld(t *testing.T, spec ReplicaSpec, lag int64) (*Router, [2]ReplicaID) {
	t.Helper()
	r, ids := twoReplicas(t, spec, EngineSignals{})
	const ms = int64(1e6)
	for i, id := range ids {
		warm := new(Flight)
		h := chainOf(0, 0x9900, 0, 2)
		if i == 1 {
			h = chainOf(0, 0x9800, 0, 2)
		}
		r.Begin(id, &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: 1 * ms}, nil, warm)
		r.FirstToken(warm, 2*ms)
		r.EndWith(warm, 3*ms, Outcome{OK: true, CachedTokens: -1})
	}
	for i, id := range ids {
		f := new(Flight)
		h := chainOf(0, 0x5e00+uint64(i), 0, 4)
		r.Begin(id, &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: 10 * ms}, nil, f)
		r.FirstToken(f, 30*ms)
		end := 100 * ms
		if i == 1 {
			end -= lag
		}
		for at := end - 60*ms; at <= end; at += 10 * ms {
			r.Token(f, at)
		}
	}
	return r, ids
}

// TestCostTakesTheStepEndingFirst: between two replicas alike in load and
// cache, the cost policy sends a request to the one whose running step
// ends first (r1: its last event 8 ms ago of a 10 ms step, r0's 0.5 ms
// ago), whichever replica that is; with no_step_phase it is a coin toss.
func TestCostTakesTheStepEndingFirst(t *testing.T) {
	const ms = int64(1e6)
	spec := ReplicaSpec{PrefillTokensPerSec: 2000}
	for _, lag := range []int64{8 * ms, -8 * ms} {
		r, ids := stepWorld(t, spec, lag)
		want := ids[1]
		now := 100*ms + ms/2
		if lag < 0 {
			want, now = ids[0], 108*ms+ms/2
		}
		// firstChoices decides 40 new prompts (their chains seeded from
		// base) at now and counts each replica ranked first.
		firstChoices := func(base uint64) map[ReplicaID]int {
			t.Helper()
			firsts := map[ReplicaID]int{}
			for i := range 40 {
				h := chainOf(0, base+uint64(i), 0, 8)
				d := new(Decision)
				if err := r.Decide(&Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: now}, d); err != nil {
					t.Fatal(err)
				}
				firsts[d.Ranked[0]]++
			}
			return firsts
		}
		firsts := firstChoices(0x7700)
		if firsts[want] != 40 {
			t.Errorf("lag %d ms: first choices %v, want all 40 on %v (its step ends first)", lag/ms, firsts, want)
		}
		cfg := r.Config()
		cfg.NoStepPhase = true
		if err := r.Retune(cfg); err != nil {
			t.Fatal(err)
		}
		if firsts = firstChoices(0x7800); len(firsts) != 2 {
			t.Errorf("no_step_phase, lag %d ms: first choices %v, want both replicas (a tie)", lag/ms, firsts)
		}
	}
}

// TestStepPhaseLeavesAWarmerReplica: the phase is priced only among the
// replicas that would compute as little as the best. r0 holds the
// request's first two blocks and is at the start of its step, r1 holds
// nothing and is at the end of its own: the blocks are worth less than the
// phase here (a fast prefill), yet the request stays on r0, since moving a
// prompt off the replica that holds more of it for where a step is spreads
// its history and costs the next requests that share it.
func TestStepPhaseLeavesAWarmerReplica(t *testing.T) {
	const ms = int64(1e6)
	r, ids := stepWorld(t, ReplicaSpec{PrefillTokensPerSec: 1e6}, 8*ms)
	h := chainOf(0, 0x9900, 0, 8)
	d := new(Decision)
	if err := r.Decide(&Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: 100*ms + ms/2}, d); err != nil {
		t.Fatal(err)
	}
	if d.Ranked[0] != ids[0] || d.CachedTokens[0] != 2*r.bt {
		t.Fatalf("ranked %v (cached %v), want r0 first with its two blocks", d.Ranked, d.CachedTokens)
	}
}

// TestTokenSamplesQuietSteps: a gap between a stream's events is a step's
// length only where no request routed to the replica awaited its first
// token when the step began; a step that ran a prefill is not sampled.
func TestTokenSamplesQuietSteps(t *testing.T) {
	const ms = int64(1e6)
	r, ids := twoReplicas(t, ReplicaSpec{PrefillTokensPerSec: 2000}, EngineSignals{})
	f := new(Flight)
	r.Begin(ids[0], &Request{Model: []byte("m"), Hashes: chainOf(0, 0xa100, 0, 2), PromptTokens: 2 * r.bt, Now: ms}, nil, f)
	r.FirstToken(f, 10*ms)
	r.Token(f, 10*ms)
	queued := new(Flight) // awaits its first token from 15 ms on
	r.Begin(ids[0], &Request{Model: []byte("m"), Hashes: chainOf(0, 0xa200, 0, 2), PromptTokens: 2 * r.bt, Now: 15 * ms}, nil, queued)
	r.Token(f, 20*ms) // quiet at 10 ms: sampled
	h := r.hotOf(ids[0])
	if s := h.stepSeconds(); math.Abs(s-0.010) > 1e-9 {
		t.Fatalf("step %v after one quiet 10 ms gap, want 0.010", s)
	}
	r.FirstToken(queued, 55*ms)
	r.Token(f, 60*ms) // the step from 20 ms ran the queued prefill: skipped
	r.Token(f, 72*ms) // nothing awaited a first token at 60 ms: sampled
	if s, want := h.stepSeconds(), 0.010+stepWeight*(0.012-0.010); math.Abs(s-want) > 1e-9 {
		t.Fatalf("step %v after a quiet 12 ms gap, want %v", s, want)
	}
	if at := h.step.at.Load(); at != 72*ms {
		t.Fatalf("last step end %d, want 72 ms", at)
	}
}
