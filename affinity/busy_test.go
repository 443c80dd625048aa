package affinity

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// trainBusy drives n cold requests through replicas ids in turn, each
// joining 0-3 requests that are already decoding there, on an engine
// whose TTFT is over + tokens/rate + beta*k: what a one-core llama.cpp
// server shows (every request in its batch makes the next prefill's steps
// longer), with beta 0 what a GPU engine shows (decodes ride along free).
// Each TTFT is scaled by 1 ± noise, at random; prompts are 200-999 tokens,
// or fixedTokens when that is above 0. It returns the clock after the last
// one.
func trainBusy(t *testing.T, r *Router, ids []ReplicaID, n int, rate, over, beta, noise float64, fixedTokens int) int64 {
	t.Helper()
	ms := int64(time.Millisecond)
	now := int64(0)
	for i := range n {
		id := ids[i%len(ids)]
		k := (i / len(ids)) % 4
		bg := make([]Flight, k)
		for j := range bg {
			r.Begin(id, &Request{Model: []byte("m"), PromptTokens: 32, Now: now}, nil, &bg[j])
			r.FirstToken(&bg[j], now)
		}
		tokens := 200 + (i*37)%800
		if fixedTokens > 0 {
			tokens = fixedTokens
		}
		var f Flight
		r.Begin(id, &Request{Model: []byte("m"), PromptTokens: tokens, Now: now}, nil, &f)
		h := uint64(i+1) * 0x9e3779b97f4a7c15
		h ^= h >> 31
		jitter := 1 + noise*(2*float64(h%1001)/1000-1)
		first := now + int64((over+float64(tokens)/rate+beta*float64(k))*jitter*1e9)
		r.FirstToken(&f, first)
		end := first + 50*ms
		r.EndWith(&f, end, Outcome{OK: true, CachedTokens: 0, PromptTokens: tokens})
		for j := range bg {
			r.EndWith(&bg[j], end, Outcome{OK: true, CachedTokens: 0, PromptTokens: 32})
		}
		now = end + 100*ms
	}
	return now
}

// TestBusyCostLearned: β, the TTFT each request already on a replica adds
// to a new one's, is learned from the TTFTs the router measures (what the
// TTFT model leaves unexplained, against the busy count) and published per
// pool (/debug/replicas); an engine whose TTFT does not depend on its batch
// learns none.
func TestBusyCostLearned(t *testing.T) {
	const rate, over = 20000.0, 0.010
	for _, beta := range []float64{0.040, 0.010, 0} {
		r, ids := buildRouter(t, Config{}, state{n: 2, rates: []float64{rate, rate}, slots: []int{8, 8}})
		trainBusy(t, r, ids, 300, rate, over, beta, 0, 0)
		text := scrape(t, prometheusRegistry(t, r), []string{"warmpath_affinity_replica_busy_cost_seconds"})
		for _, st := range r.Replicas() {
			if math.Abs(st.BusyCostSeconds-beta) > 0.1*beta+0.001 {
				t.Fatalf("β %g: replica %s learned %.4f s per busy request", beta, st.Name, st.BusyCostSeconds)
			}
			if line := fmt.Sprintf("warmpath_affinity_replica_busy_cost_seconds{replica=%q} %g\n", st.Name, st.BusyCostSeconds); !strings.Contains(text, line) {
				t.Fatalf("metrics:\n%s\nwant %s", text, line)
			}
		}
	}
}

// TestBusyCostMovesTurnOffCrowdedHome: a conversation's replica holds its
// 2,048-token history and has three requests decoding; the other replica
// is idle and would recompute the history (about 0.1 s at 20,000
// tokens/s). On an engine where each of those requests delays a new first
// token by 40 ms (measured: β), the turn is faster on the idle replica;
// where they cost nothing measurable, the floor LoadPenaltySeconds (5 ms
// each) keeps it home. With the constant alone (the old price), the
// crowded home won in both cases.
func TestBusyCostMovesTurnOffCrowdedHome(t *testing.T) {
	const rate, over = 20000.0, 0.010
	for _, tc := range []struct {
		name     string
		beta     float64
		wantHome bool
	}{
		{"batch slows each first token by 40 ms: move", 0.040, false},
		{"batch costs nothing measurable: stay", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ids := buildRouter(t, Config{}, state{n: 2, rates: []float64{rate, rate}, slots: []int{8, 8}})
			now := trainBusy(t, r, ids, 300, rate, over, tc.beta, 0, 0)
			home := ids[0]
			hist := make([]uint64, 32) // 32 blocks of 64 tokens
			for i := range hist {
				hist[i] = 0xc0ffee00 + uint64(i)
			}
			var h Flight
			r.Begin(home, &Request{Model: []byte("m"), PromptTokens: 2048, Hashes: hist, Now: now}, nil, &h)
			r.FirstToken(&h, now+int64(0.1e9))
			r.EndWith(&h, now+int64(0.2e9), Outcome{OK: true, CachedTokens: 0, PromptTokens: 2048})
			now += int64(0.3e9)
			for i := range 3 {
				var f Flight
				r.Begin(home, &Request{Model: []byte("m"), PromptTokens: 64, Hashes: []uint64{0xb0 + uint64(i)}, Now: now}, nil, &f)
				r.FirstToken(&f, now)
			}
			req := &Request{Model: []byte("m"), PromptTokens: 2112, Hashes: append(hist, 0xc0ffeeff), Now: now}
			d := decide(t, r, req)
			if got := d.Ranked[0] == home; got != tc.wantHome {
				t.Fatalf("ranked %v (cached %v, β %.4f), want home first: %v", d.Ranked, d.CachedTokens, r.Replicas()[0].BusyCostSeconds, tc.wantHome)
			}
		})
	}
}

// TestBusyCostNeedsEvidence: β prices load only where the samples show it.
// TTFTs that scatter ±40% whatever the load give none (the slope's lower
// confidence bound is taken); a strong effect under the same scatter is
// still found. Before the prefill rate is a measurement (configured,
// engine-reported or the pool's clean line), the model's error is its
// prior's and no sample is taken.
func TestBusyCostNeedsEvidence(t *testing.T) {
	const rate, over = 20000.0, 0.010
	for _, tc := range []struct {
		name    string
		beta    float64
		lo, hi  float64
		noRates bool
	}{
		{"scatter alone", 0, 0, 0.001, false},
		{"a strong effect in the scatter", 0.040, 0.025, 0.044, false},
		{"no measured rate yet", 0.040, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := state{n: 2, rates: []float64{rate, rate}, slots: []int{8, 8}}
			if tc.noRates {
				s.rates = nil
			}
			r, ids := buildRouter(t, Config{}, s)
			fixed := 0
			if tc.noRates {
				// One prompt size: the clean line never identifies a rate.
				fixed = 600
			}
			trainBusy(t, r, ids, 300, rate, over, tc.beta, 0.4, fixed)
			for _, st := range r.Replicas() {
				if st.BusyCostSeconds < tc.lo || st.BusyCostSeconds > tc.hi {
					t.Fatalf("replica %s: β %.4f s, want [%g, %g]", st.Name, st.BusyCostSeconds, tc.lo, tc.hi)
				}
			}
		})
	}
}
