package affinity

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// feedEngine runs periods requests on each replica of r, one prefill busy
// period each, with the engine-reported prefill time truth(n, c) for n
// computed tokens after c cached ones; mix(k, i) gives replica k's i-th
// request. The first token comes 5 ms after the prefill (the HTTP and
// sampling around it).
func feedEngine(r *Router, ids []ReplicaID, periods int, truth func(n, c float64) float64, mix func(k, i int) (n, c int)) int64 {
	now := int64(1e9)
	for i := range periods {
		for k, id := range ids {
			n, c := mix(k, i)
			req := &Request{Model: []byte("m"), PromptTokens: n + c, Now: now}
			var f Flight
			r.Begin(id, req, nil, &f)
			sec := truth(float64(n), float64(c))
			ft := now + int64((sec+0.005)*1e9)
			r.FirstToken(&f, ft)
			r.EndWith(&f, ft+1e8, Outcome{OK: true, CachedTokens: c, PromptTokens: n + c, PrefillTokens: n, PrefillSeconds: sec})
			now = ft + 5e9 // far past the grace: each prefill its own period
		}
	}
	return now
}

// TestPrefillShapePricesContext: two identical llama.cpp-like engines whose
// prefill costs more per token after a long cached context (attention),
// one given mostly cold prompts, the other mostly short questions after a
// long shared prompt. A single tokens-per-second rate reads the first
// engine several times faster than the second and prices the same
// question differently on each; the shape fitted over the engines'
// reported prefills prices both alike, and near what the engine takes,
// for the question and for a cold prompt.
func TestPrefillShapePricesContext(t *testing.T) {
	// Seconds for n tokens after c cached: a step's fixed cost, the
	// tokens, their attention pairs and the context read (about the live
	// bench's CPU servers: a 60-token question after 4,096 cached
	// tokens at ~1,900 tokens/s, a cold 2,000-token prompt at ~10,000).
	truth := func(n, c float64) float64 {
		return 0.003 + n*2e-5 + n*(c+n/2)*8e-8 + c*2e-6
	}
	r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
	rng := rand.New(rand.NewPCG(7, 11))
	mix := func(k, i int) (n, c int) {
		cold := rng.IntN(10) < 8 // replica 0: 80% cold prompts
		if k == 1 {
			cold = !cold // replica 1: 80% questions
		}
		if cold {
			return 500 + rng.IntN(2500), 0
		}
		return 30 + rng.IntN(90), 4096
	}
	now := feedEngine(r, ids, 200, truth, mix)
	// What the replicas show: the shape in their status and metrics, near
	// the engine's pairs term (8e-8 s).
	for _, st := range r.Replicas() {
		if sh := st.PrefillShape; !(math.Abs(sh.PerPair/8e-8-1) < 0.25) {
			t.Errorf("%s: shape %+v, want about 8e-8 s per pair", st.Name, sh)
		}
	}
	text := scrape(t, prometheusRegistry(t, r), []string{"warmpath_affinity_replica_prefill_shape_seconds"})
	if strings.Count(text, "warmpath_affinity_replica_prefill_shape_seconds{") != 6 || !strings.Contains(text, `term="pair"`) {
		t.Errorf("metrics:\n%s\nwant three terms for each of two replicas", text)
	}
	for _, tc := range []struct {
		name   string
		unc, c float64
	}{
		{"question after 4,096 cached", 60, 4096},
		{"cold 2,000-token prompt", 2000, 0},
	} {
		want := truth(tc.unc, tc.c) + 0.005
		var pred [2]float64
		for k, id := range ids {
			pred[k] = r.reps[id].predictTTFT(tc.unc, tc.c, now)
		}
		t.Logf("%s: predicted %.4f / %.4f s, engine %.4f s (rates %.0f / %.0f tokens/s)", tc.name, pred[0], pred[1], want,
			r.Replicas()[0].PrefillTokensPerSec, r.Replicas()[1].PrefillTokensPerSec)
		if math.Abs(pred[0]/pred[1]-1) > 0.08 {
			t.Errorf("%s: identical engines priced %.4f and %.4f s: the mix each served sets its price", tc.name, pred[0], pred[1])
		}
		for k := range pred {
			if math.Abs(pred[k]/want-1) > 0.25 {
				t.Errorf("%s: replica %d predicted %.4f s, the engine takes %.4f", tc.name, k, pred[k], want)
			}
		}
	}
}

// TestPrefillShapePooledAtEachSpeed: the shape is the pool's, priced at
// each replica's speed. A server whose requests all extend one cached
// prompt (its context and pairs move with its tokens: no shape of its
// own is identifiable) is priced like its identical twin, whose mix
// shows the terms; a server whose engine runs twice as slow is priced
// about twice as high.
func TestPrefillShapePooledAtEachSpeed(t *testing.T) {
	truth := func(n, c float64) float64 {
		return 0.003 + n*2e-5 + n*(c+n/2)*8e-8 + c*2e-6
	}
	for _, slow := range []float64{1, 2} {
		r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
		rng := rand.New(rand.NewPCG(9, uint64(slow)))
		mix := func(k, i int) (n, c int) {
			if k == 1 || rng.IntN(2) == 0 {
				return 30 + rng.IntN(90), 4096 // replica 1: nothing else
			}
			if rng.IntN(2) == 0 {
				return 500 + rng.IntN(2500), 0
			}
			return 30 + rng.IntN(300), rng.IntN(4096)
		}
		k := 0 // the replica the next period is fed for (feedEngine's order)
		scaled := func(n, c float64) float64 {
			sec := truth(n, c)
			if k == 1 {
				sec *= slow
			}
			k = 1 - k
			return sec
		}
		now := feedEngine(r, ids, 200, scaled, mix)
		var pred [2]float64
		for k, id := range ids {
			pred[k] = r.reps[id].predictTTFT(60, 4096, now)
		}
		want := truth(60, 4096) + 0.005
		t.Logf("twice as slow %v: a question predicted %.4f / %.4f s (engine %.4f / %.4f), speeds %.2f / %.2f", slow == 2,
			pred[0], pred[1], want, slow*truth(60, 4096)+0.005, r.reps[ids[0]].speed(), r.reps[ids[1]].speed())
		for k := range pred {
			if !r.Replicas()[k].PrefillShape.Priced() {
				t.Errorf("slow %g: replica %d not priced by shape", slow, k)
			}
		}
		if ratio := pred[1] / pred[0]; slow == 1 && math.Abs(ratio-1) > 0.08 || slow == 2 && !(ratio > 1.6 && ratio < 2.4) {
			t.Errorf("slow %g: priced %.4f and %.4f s, ratio %.2f", slow, pred[0], pred[1], ratio)
		}
		if math.Abs(pred[0]/want-1) > 0.25 {
			t.Errorf("slow %g: replica 0 predicted %.4f s, the engine takes %.4f", slow, pred[0], want)
		}
	}
}

// TestPrefillShapeContextCapped: in a workload that shares nothing, every
// request finds a few template tokens cached or none, and whatever tells
// the two kinds apart lands in the context's own term (here 3 ms more
// with 4 tokens cached: 0.75 ms a token). Priced per token past the
// contexts the fit saw, a question after a 4,096-token prompt would cost
// seconds; priced up to them, it costs its tokens and pairs.
func TestPrefillShapeContextCapped(t *testing.T) {
	truth := func(n, c float64) float64 {
		sec := 0.003 + n*4e-5 + shapePairs(n, c)*4e-8
		if c > 0 {
			sec += 0.003
		}
		return sec
	}
	r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
	rng := rand.New(rand.NewPCG(4, 4))
	mix := func(k, i int) (n, c int) {
		return 256 + rng.IntN(1792), 4 * rng.IntN(2)
	}
	now := feedEngine(r, ids, 200, truth, mix)
	sh := r.Replicas()[0].PrefillShape
	if !sh.Priced() || !(sh.PerContextToken > 1e-4) || sh.ContextTokensMax != 4 {
		t.Fatalf("shape %+v: want the context's term fitted on contexts of up to 4 tokens", sh)
	}
	got := r.reps[ids[0]].predictTTFT(60, 4096, now)
	want := truth(60, 4096) + 0.005
	t.Logf("shape %+v; a question after 4,096 cached priced %.4f s, the engine's %.4f", sh, got, want)
	if !(got < 2*want) {
		t.Errorf("a question after 4,096 cached tokens priced %.4f s: the context's term extended past what was fitted", got)
	}
}

// TestPrefillShapeLinearEngineKeepsRate: an engine whose prefill is linear
// in the tokens it computes, whatever they extend (a GPU engine at
// moderate lengths), gives no shape: its prefill stays priced at its
// rate.
func TestPrefillShapeLinearEngineKeepsRate(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
	rng := rand.New(rand.NewPCG(5, 3))
	truth := func(n, c float64) float64 {
		// 5,000 tokens/s, and a tenth either way of noise
		return (0.003 + n/5000) * (0.9 + 0.2*rng.Float64())
	}
	mix := func(k, i int) (n, c int) {
		if rng.IntN(2) == 0 {
			return 500 + rng.IntN(2500), 0
		}
		return 30 + rng.IntN(90), 1024 + rng.IntN(4096)
	}
	now := feedEngine(r, ids, 200, truth, mix)
	for k, id := range ids {
		p := r.reps[id]
		if _, ok := p.fleetPrefill.shapeC.load(); ok || r.Replicas()[k].PrefillShape.Priced() {
			t.Errorf("replica %d: a shape prices a linear engine", k)
		}
		rate, _ := p.prefill()
		if got, want := p.prefillSeconds(2000, 0, 1/rate), 2000/rate; math.Abs(got/want-1) > 1e-12 {
			t.Errorf("replica %d: 2,000 tokens priced %.4f s, the rate gives %.4f", k, got, want)
		}
		t.Logf("replica %d: rate %.0f tokens/s, question priced %.4f s", k, rate, p.predictTTFT(60, 4096, now))
	}
	if text := scrape(t, prometheusRegistry(t, r), []string{"warmpath_affinity_replica_prefill_shape_seconds"}); text != "" {
		t.Errorf("metrics show a shape:\n%s", text)
	}
}

// TestPrefillShapeFit: the fit recovers the coefficients of exact
// samples, leaves a term that does not vary out, and gives no shape
// where the context terms explain nothing the tokens do not.
func TestPrefillShapeFit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s prefillShape
	for range 300 {
		n, c := float64(10+rng.IntN(3000)), float64(rng.IntN(2)*(1000+rng.IntN(4000)))
		x := shapeTermsOf(n, shapePairs(n, c), c)
		s.add(x, 0.004+3e-5*n+6e-8*shapePairs(n, c)+1e-6*c, engineLineWeight)
	}
	coef, _, ok := s.solve()
	want := [shapeTerms]float64{3e-5 * 1e3, 6e-8 * 1e6, 1e-6 * 1e3}
	if !ok {
		t.Fatal("no shape from exact samples")
	}
	for i := range coef {
		if math.Abs(coef[i]/want[i]-1) > 1e-6 {
			t.Errorf("term %d: %g, want %g", i, coef[i], want[i])
		}
	}
	// Nothing cached ever: c does not vary and is left out.
	var cold prefillShape
	for range 100 {
		n := float64(10 + rng.IntN(3000))
		cold.add(shapeTermsOf(n, shapePairs(n, 0), 0), 0.004+3e-5*n+6e-8*shapePairs(n, 0), engineLineWeight)
	}
	coef, _, ok = cold.solve()
	if !ok || coef[2] != 0 || math.Abs(coef[1]/6e-2-1) > 1e-6 {
		t.Errorf("cold prompts only: %v (ok %v), want the pairs' 0.06 and no context term", coef, ok)
	}
	// Every request extends the same cached prompt but two cold ones (the
	// one-company workload's warm-up on a llama.cpp server): context and
	// pairs move with the tokens, and a free intercept fits a large
	// negative one that the priced terms make up for; kept at 0 or more,
	// a question is priced near what it took.
	var one prefillShape
	q := func(n float64) float64 { return 0.004 + 3e-5*n + 6e-8*shapePairs(n, 4109) + 1e-6*4109 }
	for i := range 40 {
		n, c := float64(40+rng.IntN(40)), 4109.0
		y := q(n) * (0.9 + 0.2*rng.Float64())
		if i == 0 || i == 2 {
			n, c, y = 4164, 0, 0.55
		}
		one.add(shapeTermsOf(n, shapePairs(n, c), c), y, engineLineWeight)
	}
	if coef, _, ok := one.solve(); ok {
		sp := shapePrice{c: coef, ctxMax: 4109}
		if got, want := sp.seconds(60, 4109), q(60); !(got < 1.5*want) {
			t.Errorf("one cached prompt: a question priced %.4f s, takes %.4f (shape %v)", got, want, coef)
		}
	}
	// Linear in tokens: no shape.
	var lin prefillShape
	for range 100 {
		n, c := float64(10+rng.IntN(3000)), float64(rng.IntN(4000))
		lin.add(shapeTermsOf(n, shapePairs(n, c), c), 0.004+3e-5*n, engineLineWeight)
	}
	if coef, _, ok := lin.solve(); ok {
		t.Errorf("linear engine: shape %v", coef)
	}
}
