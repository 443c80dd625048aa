package affinity

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestSlotsLearnedFromFullBatchScrapes(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	id := ids[0]
	slots := func() int { return r.Replicas()[0].BatchSlots }
	at := int64(0)
	scrape := func(running, waiting int) {
		at++
		r.SetSignals(id, EngineSignals{Running: running, Waiting: waiting, At: at})
	}
	scrape(3, 0)
	if got := slots(); got != 0 {
		t.Fatalf("a batch with no one waiting says nothing about its limit: slots = %d", got)
	}
	// Requests waiting at varying running counts: a token budget or KV
	// limit, not a slot limit.
	for _, run := range []int{5, 9, 7, 12, 6} {
		scrape(run, 3)
	}
	if got := slots(); got != 0 {
		t.Fatalf("waiting at running 5, 9, 7, 12, 6: slots = %d, want 0 (no slot limit)", got)
	}
	r2, ids2 := buildRouter(t, Config{}, state{n: 1})
	r, id = r2, ids2[0]
	slots = func() int { return r.Replicas()[0].BatchSlots }
	scrape(4, 1) // one waiting request can have arrived between two steps
	scrape(4, 1)
	if got := slots(); got != 0 {
		t.Fatalf("a single request waiting: slots = %d, want 0", got)
	}
	r.SetSignals(id, EngineSignals{Running: 4, Waiting: 30, KVUsage: 0.97, At: 50})
	r.SetSignals(id, EngineSignals{Running: 4, Waiting: 30, KVUsage: 0.97, At: 51})
	if got := slots(); got != 0 {
		t.Fatalf("requests waiting while KV is full: slots = %d, want 0 (KV, not slots, holds them)", got)
	}
	scrape(3, 0)
	scrape(4, 18)
	if got := slots(); got != 0 {
		t.Fatalf("one full scrape after a climb: slots = %d, want 0 until another agrees", got)
	}
	scrape(2, 0)
	scrape(4, 6)
	if got := slots(); got != 4 {
		t.Fatalf("running 4 with requests waiting at two scrapes: slots = %d, want 4", got)
	}
	scrape(6, 0)
	if got := slots(); got != 0 {
		t.Fatalf("running 6 disproves a 4-slot limit: slots = %d, want 0", got)
	}
	// A plateau: the scrape before ran as many, this one has requests waiting.
	r3, ids3 := buildRouter(t, Config{}, state{n: 1})
	r3.SetSignals(ids3[0], EngineSignals{Running: 16, At: 1})
	r3.SetSignals(ids3[0], EngineSignals{Running: 16, Waiting: 9, At: 2})
	if got := r3.Replicas()[0].BatchSlots; got != 16 {
		t.Fatalf("plateau at 16 with requests waiting: slots = %d, want 16", got)
	}
	r.SetSignals(id, EngineSignals{Running: 1, BatchSlots: 8, At: 100})
	if got := slots(); got != 8 {
		t.Fatalf("engine-reported slots = %d, want 8", got)
	}
	if err := r.UpdateReplica(id, ReplicaSpec{Name: "r0", Models: []string{"m"}, BatchSlots: 2}); err != nil {
		t.Fatal(err)
	}
	if got := slots(); got != 2 {
		t.Fatalf("configured slots = %d, want 2", got)
	}
}

// hotRequest is one user's short question after a company's shared prompt.
func hotRequest(t *testing.T, system string, user int) *Request {
	return promptReq(t, system, fmt.Sprintf("question %d from user %d?", user*7919, user))
}

// TestHotPrefixSpreadsWhenBatchFull is the seed's one-company case on
// small batches: 24 users share a 2048-token prompt and ask short
// questions at once, three replicas run 4 requests each. The engine's
// scrape shows the home's batch full (running 4, waiting 18). Every request
// routed must not pile on the home while the others idle: the prefix is
// computed once more on each replica the load needs.
func TestHotPrefixSpreadsWhenBatchFull(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 3})
	system := strings.Repeat("company instructions. ", 373)[:8192] // 2048 tokens
	warm(r, ids[0], hotRequest(t, system, 0))
	for _, id := range ids {
		for range 3 { // the batch limit seen at earlier scrapes
			r.SetSignals(id, EngineSignals{Running: 4, Waiting: 18, At: 1})
		}
		r.SetSignals(id, EngineSignals{At: 1})
	}
	per := map[ReplicaID]int{}
	for u := 1; u <= 24; u++ {
		req := hotRequest(t, system, u)
		d := decide(t, r, req)
		var f Flight
		r.Begin(d.Ranked[0], req, &d, &f)
		per[d.Ranked[0]]++
	}
	for _, id := range ids {
		if per[id] < 4 {
			t.Fatalf("replica %d got %d of 24 requests (%v): a full home must hand the hot prefix on", id, per[id], per)
		}
		if per[id] > 12 {
			t.Fatalf("replica %d got %d of 24 (%v)", id, per[id], per)
		}
	}
}

// TestHotPrefixStaysHomeWithFreeSlots: the same traffic at a rate the home's
// batch absorbs keeps it on the home (each replica computing the prefix
// once is only worth it when slots run out).
func TestHotPrefixStaysHomeWithFreeSlots(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 3, slots: []int{64, 64, 64}})
	system := strings.Repeat("company instructions. ", 373)[:8192]
	warm(r, ids[0], hotRequest(t, system, 0))
	for u := 1; u <= 6; u++ {
		req := hotRequest(t, system, u)
		d := decide(t, r, req)
		if d.Ranked[0] != ids[0] {
			t.Fatalf("request %d went to %d, want the home %d", u, d.Ranked[0], ids[0])
		}
		warm(r, d.Ranked[0], req)
	}
}

// fakeEngine is a replica with slots batch slots, a prefill rate and a fixed
// decode time: enough to produce honest TTFTs for the fit.
type fakeEngine struct {
	slots   int
	rate    float64 // prefill tokens/s
	decode  float64 // seconds a request decodes
	free    []float64
	busyTo  float64 // prefill compute is shared: one prefill at a time
	overhed float64
}

// serve returns the request's (first token, end) times for an arrival at
// now with unc uncached tokens: it waits for the earliest free slot.
func (e *fakeEngine) serve(now float64, unc int) (first, end float64) {
	if e.free == nil {
		e.free = make([]float64, e.slots)
	}
	k := 0
	for i, f := range e.free {
		if f < e.free[k] {
			k = i
		}
	}
	start := math.Max(math.Max(now, e.free[k]), e.busyTo) // a slot, then the prefill compute
	first = start + e.overhed + float64(unc)/e.rate
	e.busyTo = first
	end = first + e.decode
	e.free[k] = end
	return first, end
}

// TestRateFitUnderFullBatches: two identical engines (1,000 prefill
// tokens/s, 4 slots, 0.5 s decodes, one prefill at a time) behind one
// router, driven to where their batches are often full. The fit takes each
// TTFT less the predicted slot wait; both fitted rates stay within 4x of the
// truth and the slot time near the real one.
func TestRateFitUnderFullBatches(t *testing.T) {
	r, ids := buildRouter(t, Config{Policy: "round-robin"}, state{n: 2, slots: []int{4, 4}})
	engines := []*fakeEngine{{slots: 4, rate: 1000, decode: 0.5, overhed: 0.01}, {slots: 4, rate: 1000, decode: 0.5, overhed: 0.01}}
	type ev struct {
		f          Flight
		first, end float64
		firstDone  bool
	}
	var open []*ev
	now := 0.0
	ns := func(s float64) int64 { return int64(s * 1e9) }
	for i := range 400 {
		now += 0.075 // ~13 req/s against 2 x 4 slots / 0.6 s: the batches are often full
		for _, e := range open {
			if !e.firstDone && e.first <= now {
				r.FirstToken(&e.f, ns(e.first))
				e.firstDone = true
			}
		}
		kept := open[:0]
		for _, e := range open {
			if e.firstDone && e.end <= now {
				r.End(&e.f, ns(e.end), 0, true)
				continue
			}
			kept = append(kept, e)
		}
		open = kept
		tokens := 20 + (i*37)%180
		req := &Request{Model: []byte("m"), PromptTokens: tokens, Now: ns(now)}
		var d Decision
		if err := r.Decide(req, &d); err != nil {
			t.Fatal(err)
		}
		e := &ev{}
		r.Begin(d.Ranked[0], req, &d, &e.f)
		k := 0
		if d.Ranked[0] == ids[1] {
			k = 1
		}
		e.first, e.end = engines[k].serve(now, tokens)
		open = append(open, e)
	}
	for _, st := range r.Replicas() {
		// Within 4x: the router counts a prefill in progress as wholly
		// ahead of a new request, which biases the fit upward.
		if st.PrefillTokensPerSec < 250 || st.PrefillTokensPerSec > 4000 {
			t.Errorf("%s: fitted prefill rate %.0f tokens/s, true 1000", st.Name, st.PrefillTokensPerSec)
		}
		if st.SlotSeconds < 0.3 || st.SlotSeconds > 1.5 {
			t.Errorf("%s: slot time %.2f s, true about 0.5 + prefill", st.Name, st.SlotSeconds)
		}
		if st.TTFT.Checked == 0 {
			t.Errorf("%s: no prediction checked", st.Name)
		}
	}
}

func TestEngineReportedPrefillRate(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	for i := range 20 {
		req := &Request{Model: []byte("m"), PromptTokens: 500, Now: int64(i) * 1e9}
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		r.FirstToken(&f, req.Now+3e8) // 0.3 s to the first token, 0.25 s of it prefill
		r.EndWith(&f, req.Now+8e8, Outcome{OK: true, CachedTokens: 0, PrefillTokens: 500, PrefillSeconds: 0.25, DecodeSeconds: 0.5})
	}
	st := r.Replicas()[0]
	if math.Abs(st.PrefillTokensPerSec-2000) > 1 || math.Abs(st.EnginePrefillRate-2000) > 1 {
		t.Fatalf("rate %.1f (engine %.1f), want the engine's 2000 tokens/s", st.PrefillTokensPerSec, st.EnginePrefillRate)
	}
	if math.Abs(st.OverheadSeconds-0.05) > 0.01 {
		t.Fatalf("overhead %.3f s, want 0.05 (0.3 s TTFT - 0.25 s prefill)", st.OverheadSeconds)
	}
	if math.Abs(st.SlotSeconds-0.5) > 0.01 {
		t.Fatalf("slot time %.3f s, want the engine's decode, 0.5", st.SlotSeconds)
	}
}

// TestPoorPredictionsLeanToLoad: a replica whose predicted cache hits do
// not materialise (the engine reports none of them cached) loses the
// trust in its predicted hits, so a busy warm replica no longer beats an
// idle cold one; while its hits come true it does.
func TestPoorPredictionsLeanToLoad(t *testing.T) {
	sys := strings.Repeat("abcdefgh", 1024) // 2048 tokens
	build := func(realised float64) (*Router, []ReplicaID) {
		r, ids := buildRouter(t, Config{}, state{n: 2, inFlight: []int{6, 0}})
		for i := range 40 {
			req := promptReq(t, sys, fmt.Sprintf("q%d", i))
			req.Now = int64(i+1) * 1e9
			var f Flight
			r.Begin(ids[0], req, nil, &f)
			cached := int(realised * float64(f.PromptTokens-f.UncachedTokens))
			ttft := int64(float64(f.PromptTokens-cached) / DefaultPrefillTokensPerSec * 1e9) // what the engine took
			r.FirstToken(&f, req.Now+ttft)
			r.End(&f, req.Now+ttft+1e6, cached, true)
		}
		return r, ids
	}
	good, gids := build(1)
	if c := good.Replicas()[0].Confidence; c != 1 {
		t.Fatalf("hits as predicted: confidence %.2f, want 1", c)
	}
	if d := decide(t, good, promptReq(t, sys, "new")); d.Ranked[0] != gids[0] {
		t.Fatalf("trusted warm home lost to an idle cold replica: %v", d.Ranked)
	}
	bad, bids := build(0)
	if c := bad.Replicas()[0].Confidence; c != 0 {
		t.Fatalf("no predicted hit realised: confidence %.2f, want 0", c)
	}
	if d := decide(t, bad, promptReq(t, sys, "new")); d.Ranked[0] != bids[1] {
		t.Fatalf("untrusted busy home still won: %v", d.Ranked)
	}
	if st := good.Replicas()[0].TTFT; st.Checked == 0 {
		t.Fatalf("no TTFT prediction checked: %+v", st)
	}
}

// TestBacklogSpreadsBeforeSlotsAreKnown: before any scrape shows the
// engine's batch limit, requests waiting on the home far beyond their
// predicted TTFT (its batch is full, the router cannot know why) make it
// full: the next request with the same prefix goes to a replica with no
// backlog; while the pending requests are on time it stays home.
func TestBacklogSpreadsBeforeSlotsAreKnown(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 3})
	system := strings.Repeat("company instructions. ", 373)[:8192]
	warm(r, ids[0], hotRequest(t, system, 0))
	for u := 1; u <= 20; u++ {
		req := hotRequest(t, system, u)
		var f Flight
		r.Begin(ids[0], req, nil, &f) // pending: no first token yet
	}
	soon := hotRequest(t, system, 100)
	soon.Now += 1e6 // 1 ms later: on time
	if d := decide(t, r, soon); d.Ranked[0] != ids[0] {
		t.Fatalf("pending requests on time: went to %d, want the home", d.Ranked[0])
	}
	late := hotRequest(t, system, 101)
	late.Now += 2e9 // 2 s later, every pending request far past its prediction
	if d := decide(t, r, late); d.Ranked[0] == ids[0] {
		t.Fatalf("home's requests 2 s behind their predictions, still ranked first: %v", d.Ranked)
	}
}

// TestBacklogIsTheOldestRequest: a burst just sent to a replica whose
// oldest request waits far past its prediction does not make the replica
// look less late. Averaged over every pending request, the fresh ones
// pulled the backlog down as they arrived, so a late replica drew the rest
// of the burst (the simulator's 16-slot fleet at one-company's peak: 13
// requests in a row onto the replica just sent the most, TTFT 0.4 s).
func TestBacklogIsTheOldestRequest(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 3})
	system := strings.Repeat("company instructions. ", 373)[:8192]
	warm(r, ids[0], hotRequest(t, system, 0))
	var old Flight
	r.Begin(ids[0], hotRequest(t, system, 1), nil, &old) // waits from t0 on
	for u := 2; u <= 9; u++ {                            // a burst 0.5 s later, just begun
		req := hotRequest(t, system, u)
		req.Now += 5e8
		var f Flight
		r.Begin(ids[0], req, nil, &f)
	}
	late := hotRequest(t, system, 100)
	late.Now += 5e8 + 1e6
	if d := decide(t, r, late); d.Ranked[0] == ids[0] {
		t.Fatalf("home's oldest request 0.5 s behind its prediction, ranked first: %v", d.Ranked)
	}
	// Once the oldest has its first token, the burst is on time.
	r.FirstToken(&old, late.Now)
	if d := decide(t, r, late); d.Ranked[0] != ids[0] {
		t.Fatalf("every pending request on time: went to %d, want the home", d.Ranked[0])
	}
}

// TestPendQueueFront: the backlog's front is the oldest request still
// awaiting its first token, whatever order they get them in (an engine that
// prefills slots in slot order, a request ended without one), through the
// queue's growth past its first size.
func TestPendQueueFront(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	p := r.rep(ids[0])
	const n = 40
	fs := make([]*Flight, n)
	for i := range fs {
		fs[i] = &Flight{}
		r.Begin(ids[0], &Request{Model: []byte("m"), PromptTokens: 64, Now: int64(1000 + i)}, nil, fs[i])
	}
	rng := rand.New(rand.NewPCG(3, 4))
	done := make([]bool, n)
	for _, i := range rng.Perm(n) {
		if i%3 == 0 {
			r.End(fs[i], 5000, -1, false) // no first token
		} else {
			r.FirstToken(fs[i], 5000)
		}
		done[i] = true
		want := int64(0)
		for j := range done {
			if !done[j] {
				want = int64(1000+j) - p.pendBase.Load() + 1
				break
			}
		}
		if got := p.pendHead.Load(); got != want {
			t.Fatalf("after request %d left: front %d, want %d", i, got, want)
		}
	}
	if p.pendLo != p.pendHi {
		t.Fatalf("queue not empty: %d..%d", p.pendLo, p.pendHi)
	}
}

// TestEngineBusyCountsOnlyTheExcess: the engine's running count is as old
// as its scrape; the router's own count is current. A replica whose
// requests finished since the scrape is not still busy with them.
func TestEngineBusyCountsOnlyTheExcess(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2})
	begin := func(id ReplicaID, n int) []*Flight {
		var fs []*Flight
		for range n {
			f := &Flight{}
			r.Begin(id, &Request{Model: []byte("m"), PromptTokens: 64, Now: 1}, nil, f)
			r.FirstToken(f, 1)
			fs = append(fs, f)
		}
		return fs
	}
	f0 := begin(ids[0], 10)
	begin(ids[1], 4)
	r.SetSignals(ids[0], EngineSignals{Running: 10, At: 1})
	r.SetSignals(ids[1], EngineSignals{Running: 4, At: 1})
	for _, f := range f0[:8] {
		r.End(f, 2, -1, true)
	}
	req := promptReq(t, "cold", "q")
	req.Now = 3
	if d := decide(t, r, req); d.Ranked[0] != ids[0] {
		t.Fatalf("replica 0 runs 2 now (10 at the scrape, 8 finished since), replica 1 runs 4: ranked %v", d.Ranked)
	}
	// Another router's 5 requests the scrape saw on replica 1 still count.
	r.SetSignals(ids[1], EngineSignals{Running: 9, At: 3})
	r.SetSignals(ids[0], EngineSignals{Running: 2, At: 3})
	req.Now = 4
	if d := decide(t, r, req); d.Ranked[0] != ids[0] {
		t.Fatalf("replica 1 carries 5 requests of another router: ranked %v", d.Ranked)
	}
}

// TestNewReplicaPricedLikeTheFleet: a replica that has served nothing is
// priced with the fleet's fitted prefill model, not the configured default
// (10,000 tokens/s, 5x slower than this fleet): a replica added to a warm
// fleet is chosen for a cold prompt as soon as it is the idle one, and so
// learns its own rate.
func TestNewReplicaPricedLikeTheFleet(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	const rate = 50000.0 // the fleet's engines: 50,000 tokens/s, 20 ms overhead
	for i := range 40 {
		unc := 200 + 100*(i%10)
		req := &Request{Model: []byte("m"), PromptTokens: unc, Now: int64(i) * 1e9}
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		ttft := 0.02 + float64(unc)/rate
		r.FirstToken(&f, req.Now+int64(ttft*1e9))
		r.EndWith(&f, req.Now+int64(ttft*1e9)+1e8, Outcome{OK: true, CachedTokens: 0})
	}
	fitted := r.Replicas()[0].PrefillTokensPerSec
	if fitted < rate/2 || fitted > rate*2 {
		t.Fatalf("fitted rate %.0f tokens/s, want about %.0f", fitted, rate)
	}
	id, err := r.AddReplica(ReplicaSpec{Name: "new", Models: []string{"m"}})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Model: []byte("m"), PromptTokens: 4000, Now: 41e9}
	var f Flight
	r.Begin(id, req, nil, &f)
	defer r.End(&f, 42e9, 0, true)
	// The fleet's model predicts 0.02 + 4000/50000 = 0.1 s; the default
	// rate would say 0.4 s.
	if p := f.PredictedTTFT(); p < 0.05 || p > 0.2 {
		t.Fatalf("new replica's predicted TTFT for 4,000 cold tokens %.3f s, want the fleet's ~0.1 s", p)
	}
	// A replica with a configured rate keeps it.
	cfgd, err := r.AddReplica(ReplicaSpec{Name: "configured", Models: []string{"m"}, PrefillTokensPerSec: 8000})
	if err != nil {
		t.Fatal(err)
	}
	var g Flight
	r.Begin(cfgd, &Request{Model: []byte("m"), PromptTokens: 4000, Now: 41e9}, nil, &g)
	defer r.End(&g, 42e9, 0, true)
	if p := g.PredictedTTFT(); p < 0.45 || p > 0.6 {
		t.Fatalf("configured replica's predicted TTFT %.3f s, want 4000/8000 = 0.5 s", p)
	}
}

// TestPendingPrefillCountsUntrustedHitsAsWork: on a replica whose predicted
// hits never come true (an engine without prefix caching), the prefill
// queued there counts the whole prompt, not the part the index thinks is
// cached, so its queue is priced as the work it is.
func TestPendingPrefillCountsUntrustedHitsAsWork(t *testing.T) {
	sys := strings.Repeat("abcdefgh", 1024) // 2048 tokens
	r, ids := buildRouter(t, Config{}, state{n: 1})
	for i := range 60 {
		req := promptReq(t, sys, fmt.Sprintf("q%d", i))
		req.Now = int64(i+1) * 1e9
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		r.FirstToken(&f, req.Now+2e8)
		r.End(&f, req.Now+3e8, 0, true) // the engine never has the prefix cached
	}
	if c := r.Replicas()[0].Confidence; c > 0.05 {
		t.Fatalf("confidence %.2f after 60 unrealised hits", c)
	}
	req := promptReq(t, sys, "next")
	req.Now = 70e9
	var f Flight
	r.Begin(ids[0], req, nil, &f)
	defer r.End(&f, 71e9, 0, true)
	if f.UncachedTokens < req.PromptTokens*9/10 {
		t.Fatalf("uncached %d of %d prompt tokens: an untrusted hit counted as no work", f.UncachedTokens, req.PromptTokens)
	}
	if p := r.Replicas()[0].PendingPrefillTokens; p < req.PromptTokens*9/10 {
		t.Fatalf("pending prefill %d tokens, want about the whole %d-token prompt", p, req.PromptTokens)
	}
}

// TestFitPoisonedUnderLoadDoesNotStrandAnIdleReplica: two identical
// replicas, one of whose TTFTs were measured while its engine queued work
// the router did not route (another router's burst), so its own line says
// it is 40x slower than the other. Idle now, it is still the better place
// for a cold prompt than the other replica with 12,000 tokens of prefill
// queued: the cost policy prices both with the pooled model of the
// replicas serving the model, not with a fit that cannot be identified
// under load. Priced with its own fit, the cold prompt joined the queue.
func TestFitPoisonedUnderLoadDoesNotStrandAnIdleReplica(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2})
	feed := func(id ReplicaID, rate float64, from int) {
		for i := range 40 {
			unc := 200 + 100*(i%10)
			req := &Request{Model: []byte("m"), PromptTokens: unc, Now: int64(from+i) * 1e9}
			var f Flight
			r.Begin(id, req, nil, &f)
			ttft := 0.02 + float64(unc)/rate
			r.FirstToken(&f, req.Now+int64(ttft*1e9))
			r.EndWith(&f, req.Now+int64(ttft*1e9)+1e8, Outcome{OK: true, CachedTokens: 0})
		}
	}
	feed(ids[0], 500, 0)     // measured behind an unseen queue
	feed(ids[1], 20000, 100) // measured idle
	if own := r.Replicas()[0].PrefillTokensPerSec; own > 2000 {
		t.Fatalf("replica 0's own fitted rate %.0f tokens/s, want it poisoned (about 500)", own)
	}
	now := int64(200e9)
	for range 3 { // 3 x 4,000 cold tokens queued for prefill on replica 1
		var f Flight
		r.Begin(ids[1], &Request{Model: []byte("m"), PromptTokens: 4000, Now: now}, nil, &f)
	}
	req := promptReq(t, "a cold prompt", "question")
	req.PromptTokens, req.Now = 4000, now+1e6
	if d := decide(t, r, req); d.Ranked[0] != ids[0] {
		t.Fatalf("idle replica 0 (poisoned fit) vs replica 1 with 12,000 tokens queued: ranked %v", d.Ranked)
	}
}

// TestPrefillPoolIsPerModel: replicas serving another model (a larger one,
// 10x slower to prefill) do not pool with this model's: each is priced with
// its own model's pool.
func TestPrefillPoolIsPerModel(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	big, err := r.AddReplica(ReplicaSpec{Name: "big", Models: []string{"big"}})
	if err != nil {
		t.Fatal(err)
	}
	feed := func(id ReplicaID, model string, rate float64) {
		for i := range 40 {
			unc := 200 + 100*(i%10)
			req := &Request{Model: []byte(model), PromptTokens: unc, Now: int64(i) * 1e9}
			var f Flight
			r.Begin(id, req, nil, &f)
			ttft := 0.02 + float64(unc)/rate
			r.FirstToken(&f, req.Now+int64(ttft*1e9))
			r.EndWith(&f, req.Now+int64(ttft*1e9)+1e8, Outcome{OK: true, CachedTokens: 0})
		}
	}
	feed(ids[0], "m", 50000)
	feed(big, "big", 5000)
	predict := func(id ReplicaID, model string) float64 {
		var f Flight
		r.Begin(id, &Request{Model: []byte(model), PromptTokens: 4000, Now: 100e9}, nil, &f)
		defer r.End(&f, 101e9, 0, true)
		return f.PredictedTTFT()
	}
	if p := predict(ids[0], "m"); p > 0.2 {
		t.Fatalf("m's replica: predicted %.3f s for 4,000 cold tokens, want ~0.1 s (its pool: 50,000 tokens/s)", p)
	}
	if p := predict(big, "big"); p < 0.5 {
		t.Fatalf("big's replica: predicted %.3f s for 4,000 cold tokens, want ~0.8 s (its pool: 5,000 tokens/s)", p)
	}
}

// TestUnlearnedReplicaTakesItsPoolsSlots: replica 0's scrapes showed a
// 4-slot batch limit; replica 1, serving the same model, has shown none yet
// (the burst on it came within one scrape interval). With 8 requests on
// replica 1 and 4 on replica 0, replica 1 is the worse place: it has the
// same limit, and more requests wait for a slot there. Without the pool's
// limit replica 1 had no slot term and took the request.
func TestUnlearnedReplicaTakesItsPoolsSlots(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2})
	r.SetSignals(ids[0], EngineSignals{Running: 4, Waiting: 3, At: 1})
	r.SetSignals(ids[0], EngineSignals{Running: 4, Waiting: 3, At: 2})
	if got := r.Replicas()[0].BatchSlots; got != 4 {
		t.Fatalf("replica 0 learned %d slots, want 4", got)
	}
	// Requests of this router only: the scrapes are stale by now.
	for i, n := range []int{4, 8} {
		for range n {
			var f Flight
			r.Begin(ids[i], &Request{Model: []byte("m"), PromptTokens: 64, Now: 100e9}, nil, &f)
			r.FirstToken(&f, 100e9+1e6)
		}
	}
	req := promptReq(t, "short", "question")
	req.Now = 100e9 + 2e6
	if d := decide(t, r, req); d.Ranked[0] != ids[0] {
		t.Fatalf("4 requests on 4 slots vs 8 on a replica of the same model: ranked %v", d.Ranked)
	}
}

// TestConfidenceStartsFromThePool: on engines without prefix caching the
// replicas' predicted hits never come true, and their confidence fell to 0;
// a replica whose first requests have not finished yet (a burst queued
// there) takes its pool's confidence, not full trust: its queued
// cold prompts count as the work they are.
func TestConfidenceStartsFromThePool(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2})
	system := strings.Repeat("company instructions. ", 373)[:8192]
	for u := range 20 { // replica 0: every predicted hit reported uncached
		req := hotRequest(t, system, u)
		req.Now = int64(u) * 1e9
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		r.FirstToken(&f, req.Now+1e8)
		r.EndWith(&f, req.Now+2e8, Outcome{OK: true, CachedTokens: 0})
	}
	if c := r.Replicas()[0].Confidence; c > 0.2 {
		t.Fatalf("replica 0's confidence %.2f after 20 unrealised hits, want near 0", c)
	}
	first := hotRequest(t, system, 100)
	first.Now = 30e9
	var f0 Flight
	r.Begin(ids[1], first, nil, &f0) // replica 1 now holds the prompt in the index
	req := hotRequest(t, system, 101)
	req.Now = 30e9 + 1e6
	var f Flight
	r.Begin(ids[1], req, nil, &f)
	if f.UncachedTokens < req.PromptTokens/2 {
		t.Fatalf("replica 1 with no finished request of its own counts %d of %d tokens uncached, want the pool's distrust (most of them)", f.UncachedTokens, req.PromptTokens)
	}
}

// TestOlderBatchFreesFirst: two replicas of 4 slots, both full with this
// router's decoding requests; replica 0's batch began decoding 0.9 s ago,
// replica 1's 50 ms ago (slot time 1 s). A new request waits for a slot
// either way, and replica 0's is the nearer: its batch is almost done. A
// count of requests (and the uniform slot-wait rate) sees a tie.
func TestOlderBatchFreesFirst(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
	ms := int64(time.Millisecond)
	fill := func(id ReplicaID, begin, first int64, tag string) []*Flight {
		var fs []*Flight
		for i := range 4 {
			req := promptReq(t, fmt.Sprintf("%s %d", tag, i), "u")
			req.Now = begin
			f := new(Flight)
			r.Begin(id, req, nil, f)
			r.FirstToken(f, first)
			fs = append(fs, f)
		}
		return fs
	}
	fill(ids[0], 0, 100*ms, "old batch")
	late := fill(ids[1], 900*ms, 950*ms, "new batch")
	req := promptReq(t, "a new conversation", "u")
	req.Now = 1000 * ms
	for range 40 {
		if d := decide(t, r, req); d.Ranked[0] != ids[0] {
			t.Fatalf("ranked %v: the batch that started 50 ms ago looked as near a free slot as the one 0.9 s in", d.Ranked)
		}
	}
	// Once replica 1's requests end, its slots are free: it wins.
	for _, f := range late {
		r.End(f, 1000*ms, -1, true)
	}
	if d := decide(t, r, req); d.Ranked[0] != ids[1] {
		t.Fatalf("ranked %v: replica 1 has free slots", d.Ranked)
	}
}

// TestUnknownLimitPricedPastMostRun: engines that never ran more than 4
// requests and, when running 4, at times had one waiting: too little for
// learnSlots to learn a limit (it wants two or more waiting, twice). The
// home of a hot prefix holds 4 of this router's requests, each decoding for
// seconds; a fifth there would likely wait for one to finish, so it goes to
// an idle replica and computes the prefix there. Once a scrape shows the
// home running 5, the engine has shown room for a fifth: the home is
// preferred again.
func TestUnknownLimitPricedPastMostRun(t *testing.T) {
	t.Run("queue at the largest batch", func(t *testing.T) { unknownLimit(t, 1) })
	// An engine without a limit: nobody waits at 4 running, so the home
	// keeps its prefix's traffic.
	t.Run("no queue", func(t *testing.T) { unknownLimit(t, 0) })
}

// TestSuspectedLimitPricedAsMeasured: engines that, running 4 requests,
// at times had one waiting, so a fifth request on the home is priced a
// share of the wait a limit at 4 would cause (slotRisk). Which share is
// what the requests that met that count measured: where each waited about
// as long as the limit predicted, the whole wait; where each got its first
// token as soon as its prefill allowed, the count was no limit and the
// wait is priced at next to nothing.
func TestSuspectedLimitPricedAsMeasured(t *testing.T) {
	for _, waited := range []bool{true, false} {
		t.Run(fmt.Sprintf("waited=%v", waited), func(t *testing.T) {
			r, ids, system := homeAtFourRunning(t, 50, 8000, -1, 7000, 1)
			ms := int64(time.Millisecond)
			now := 9000 * ms
			for u := 1; u <= 4; u++ { // four decoding for seconds
				req := hotRequest(t, system, u)
				req.Now = now
				var f Flight
				r.Begin(ids[0], req, nil, &f)
				r.FirstToken(&f, now+ms)
			}
			h := r.hotOf(ids[0])
			for u := 5; u < 5+2*riskMin; u++ {
				now += 20 * ms
				req := hotRequest(t, system, u)
				req.Now = now
				var f Flight
				r.Begin(ids[0], req, nil, &f)
				if !(f.riskWait > 0) {
					t.Fatalf("request %d found 4 on a replica seen queueing at 4: no wait probed", u)
				}
				first := now + int64(f.predTTFT*1e9)
				if waited {
					first += int64(f.riskWait * 1e9)
				}
				r.FirstToken(&f, first)
				r.End(&f, first+ms, 2048, true)
				now = first + ms
			}
			share := h.slotRisk(0, 4, now) / h.slotWaitSlots(4, 4, now)
			if st := r.Replicas()[0]; st.SuspectedBatchSlots != 4 || math.Abs(st.SlotRiskShare-share) > 1e-9 {
				t.Fatalf("status: suspected slots %d share %.3f, want 4 and %.3f", st.SuspectedBatchSlots, st.SlotRiskShare, share)
			}
			text := scrape(t, prometheusRegistry(t, r), []string{"warmpath_affinity_replica_suspected_batch_slots", "warmpath_affinity_replica_slot_risk_share"})
			st := r.Replicas()[0]
			for _, line := range []string{fmt.Sprintf("warmpath_affinity_replica_suspected_batch_slots{replica=%q} 4\n", st.Name),
				fmt.Sprintf("warmpath_affinity_replica_slot_risk_share{replica=%q} %g\n", st.Name, st.SlotRiskShare)} {
				if !strings.Contains(text, line) {
					t.Fatalf("metrics:\n%s\nwant %s", text, line)
				}
			}
			switch {
			case waited && share < 0.8:
				t.Fatalf("priced %.2f of the wait of a limit every request there waited for", share)
			case !waited && share > 0.2:
				t.Fatalf("priced %.2f of the wait of a count no request there waited at", share)
			}
		})
	}
}

// homeAtFourRunning is three replicas whose home (ids[0]) served one
// request of a 2,048-token system prompt (first token at firstMS, end at
// endMS, the engine reporting cached tokens), then three scrapes of each,
// from scrapeMS on, running 4 with waiting requests waiting.
func homeAtFourRunning(t *testing.T, firstMS, endMS int64, cached int, scrapeMS int64, waiting int) (*Router, []ReplicaID, string) {
	t.Helper()
	r, ids := buildRouter(t, Config{}, state{n: 3})
	ms := int64(time.Millisecond)
	system := strings.Repeat("company instructions. ", 373)[:8192] // 2048 tokens
	var f0 Flight
	r.Begin(ids[0], hotRequest(t, system, 0), nil, &f0)
	r.FirstToken(&f0, firstMS*ms)
	r.End(&f0, endMS*ms, cached, true)
	for _, id := range ids {
		for i := range 3 {
			r.SetSignals(id, EngineSignals{Running: 4, Waiting: waiting, At: (scrapeMS + int64(300*i)) * ms})
			r.SetSignals(id, EngineSignals{Running: 2, At: (scrapeMS + int64(100+300*i)) * ms})
		}
	}
	return r, ids, system
}

func unknownLimit(t *testing.T, waiting int) {
	// The home's first request: a long decode (8 s in its slot); a
	// request waiting at 4 running, at times.
	r, ids, system := homeAtFourRunning(t, 50, 8000, -1, 7000, waiting)
	ms := int64(time.Millisecond)
	if st := r.Replicas(); st[0].BatchSlots != 0 {
		t.Fatalf("a limit was learned (%d): the case needs none", st[0].BatchSlots)
	}
	for u := 1; u <= 4; u++ {
		req := hotRequest(t, system, u)
		req.Now = 9000 * ms
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		r.FirstToken(&f, 9001*ms) // as fast as a hit
	}
	req := hotRequest(t, system, 5)
	req.Now = 9100 * ms
	switch d := decide(t, r, req); {
	case waiting > 0 && d.Ranked[0] == ids[0]:
		t.Fatalf("ranked %v: a fifth request joined four decoding ones on an engine seen queueing at 4", d.Ranked)
	case waiting == 0 && d.Ranked[0] != ids[0]:
		t.Fatalf("ranked %v: the home holds the prefix and nothing says its engine queues", d.Ranked)
	}
	r.SetSignals(ids[0], EngineSignals{Running: 5, At: 9060 * ms})
	r.SetSignals(ids[0], EngineSignals{Running: 4, At: 9100 * ms})
	if d := decide(t, r, req); d.Ranked[0] != ids[0] {
		t.Fatalf("ranked %v: the home has shown it runs 5 at once, and holds the prefix", d.Ranked)
	}
}

// TestLateFirstTokensShowAnUnknownLimit: scrapes a second apart saw the
// home run 4 requests but never caught one waiting. Requests that then
// found 4 already there and got their first token only as another
// finished (a second past a cache hit's prediction, half the slot time)
// are the limit showing itself: the next such request goes to an idle
// replica. Where those first tokens come on time, the engine has no limit
// at 4 and the home keeps its prefix's traffic; where they come late by
// the prefill of a predicted hit the engine did not have, they were late
// for that, not for a slot.
func TestLateFirstTokensShowAnUnknownLimit(t *testing.T) {
	t.Run("late", func(t *testing.T) { lateAtLargestBatch(t, "late") })
	t.Run("on time", func(t *testing.T) { lateAtLargestBatch(t, "on time") })
	t.Run("missed hit", func(t *testing.T) { lateAtLargestBatch(t, "missed hit") })
}

func lateAtLargestBatch(t *testing.T, mode string) {
	// 2,048 tokens at 10,000 a second, a 2 s slot time; no scrape shows
	// a request waiting.
	r, ids, system := homeAtFourRunning(t, 200, 2200, 0, 3000, 0)
	ms := int64(time.Millisecond)
	var run []*Flight
	now := 4000 * ms
	for u := 1; u <= 4; u++ {
		req := hotRequest(t, system, u)
		req.Now = now
		f := new(Flight)
		r.Begin(ids[0], req, nil, f)
		r.FirstToken(f, now+10*ms)
		run = append(run, f)
	}
	now += 100 * ms
	for u := 5; u <= 6; u++ { // two waits: slotRiskSeen
		req := hotRequest(t, system, u)
		req.Now = now
		f := new(Flight)
		if d := decide(t, r, req); mode != "missed hit" && d.Ranked[0] != ids[0] {
			t.Fatalf("request %d ranked %v: nothing has shown a limit yet, the home holds the prefix", u, d.Ranked)
		}
		r.Begin(ids[0], req, nil, f)
		first, cached := now+10*ms, 2048
		switch mode {
		case "late":
			first = now + 1000*ms
		case "missed hit": // the whole prompt's prefill, more than a tenth of the slot time
			first = now + 10*ms + int64(float64(f.PromptTokens)/r.Replicas()[0].PrefillTokensPerSec*1e9)
			cached = 0
		}
		// The oldest running request finishes; the new one's first token
		// follows (at once where a slot was free, else as it frees one).
		r.End(run[0], first-ms, 0, true)
		r.FirstToken(f, first)
		r.End(f, first+5*ms, cached, true)
		run = append(run[1:], f)
		now = first + 10*ms
		// Three running and the one just ended: the next finds four again.
		g := new(Flight)
		refill := hotRequest(t, system, 100+u)
		refill.Now = now
		r.Begin(ids[0], refill, nil, g)
		r.FirstToken(g, now+ms)
		run = append(run, g)
		now += 10 * ms
	}
	if mode == "missed hit" {
		if w := r.rep(ids[0]).model.waitAtMax; w != 0 {
			t.Fatalf("%d first tokens late by the prefill of a missed hit read as waits for a slot", w)
		}
		return
	}
	req := hotRequest(t, system, 9)
	req.Now = now
	switch d := decide(t, r, req); {
	case mode == "late" && d.Ranked[0] == ids[0]:
		t.Fatalf("ranked %v: a fifth request joined four on a home whose fifth requests waited for a slot", d.Ranked)
	case mode == "on time" && d.Ranked[0] != ids[0]:
		t.Fatalf("ranked %v: the home answered its fifth requests on time and holds the prefix", d.Ranked)
	}
}

// TestEarlyHitJudgedAtFirstToken: a start-up burst of one shared prompt on
// engines whose caching is unknown to the router. No request has finished,
// so the engines have reported no cached tokens yet; what the router has is
// each first token. Where they come as late as a full prefill (no prefix
// cache), the predicted hits are discounted after a few, and the burst
// stops piling onto the replica that saw the prompt first; where they come
// as fast as a hit, the home keeps the burst.
func TestEarlyHitJudgedAtFirstToken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		caching bool
	}{{"no prefix cache", false}, {"prefix cache", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const rate = 10000.0
			r, ids := buildRouter(t, Config{}, state{n: 3, rates: []float64{rate, rate, rate}})
			system := strings.Repeat("company instructions. ", 373)[:8192] // 2048 tokens
			warm(r, ids[0], hotRequest(t, system, 0))
			now := int64(time.Second)
			home := 0
			for u := 1; u <= 10; u++ {
				req := hotRequest(t, system, u)
				req.Now = now
				d := decide(t, r, req)
				var f Flight
				r.Begin(d.Ranked[0], req, &d, &f)
				unc := req.PromptTokens
				if tc.caching && d.CachedTokens[0] > 0 {
					unc -= d.CachedTokens[0]
				}
				now += int64(float64(unc) / rate * 1e9)
				r.FirstToken(&f, now) // decodes on; nothing ends
				if d.Ranked[0] == ids[0] {
					home++
				}
			}
			switch {
			case !tc.caching && home > 7:
				t.Fatalf("%d of 10 went to the home: first tokens as late as full prefills did not discount its predicted hits", home)
			case tc.caching && home < 10:
				t.Fatalf("%d of 10 went to the home: hits that came true were discounted", home)
			}
		})
	}
}

// TestPrefillRateFromEngineTokens: a chat fleet where most turns are cache
// hits of a long history and a few are cold. The router's token estimate
// (bytes / 4) misses each prompt by up to 15% either way, the engine
// reports its own prompt and cached tokens, and TTFT is 10 ms (plus up to
// 8 ms of step alignment) + uncached / 25,000 tokens/s. Taken as the
// router's prompt less the engine's cached tokens, a hit's uncached count
// is off by hundreds of tokens (a tenth of the history) and the rate reads
// several times too fast. With the engine's counts converted into the
// router's tokens (Outcome.inRouterTokens), a cold 3,000-token prompt is
// predicted within 10% of its 0.13 s.
func TestPrefillRateFromEngineTokens(t *testing.T) {
	const rate, over = 25000.0, 0.010
	r, ids := buildRouter(t, Config{}, state{n: 4})
	rng := uint64(7)
	next := func() float64 { // deterministic uniform [0, 1)
		rng = rng*6364136223846793005 + 1442695040888963407
		return float64(rng>>11) / (1 << 53)
	}
	now := int64(0)
	for i := range 600 {
		prompt := 3000 + int(next()*600) // engine tokens
		cached := (prompt - 100 - int(next()*200)) / 16 * 16
		if i%40 == 0 {
			cached = 0
		}
		est := int(float64(prompt) * (0.85 + 0.3*next()))
		req := &Request{Model: []byte("m"), PromptTokens: est, Now: now}
		var f Flight
		r.Begin(ids[i%len(ids)], req, nil, &f)
		ttft := over + 0.008*next() + float64(prompt-cached)/rate
		r.FirstToken(&f, now+int64(ttft*1e9))
		r.EndWith(&f, now+int64(ttft*1e9)+1e8, Outcome{OK: true, CachedTokens: cached, PromptTokens: prompt})
		now += int64(ttft*1e9) + 2e8
	}
	var f Flight
	r.Begin(ids[0], &Request{Model: []byte("m"), PromptTokens: 3000, Now: now}, nil, &f)
	defer r.End(&f, now+1e9, 0, true)
	want := over + 0.004 + 3000/rate
	if p := f.PredictedTTFT(); math.Abs(p/want-1) > 0.1 {
		t.Fatalf("predicted %.3f s for a cold 3,000-token prompt on an idle replica, want %.3f s within 10%%", p, want)
	}
}

// TestPrefillRateFromUnqueuedRequests: every other request begins while
// one is still pending whose prompt the router did not know was cached, so
// the router counts 2,000 tokens of prefill queued ahead of it that the
// engine never computes. Those requests' TTFTs say nothing about the
// prefill rate (their x is the router's guess); fitted with the others
// they flatten the line and a cold prompt looks several times cheaper than
// it is. The pool's line takes only requests that met no queue.
func TestPrefillRateFromUnqueuedRequests(t *testing.T) {
	const rate, over = 20000.0, 0.010
	r, ids := buildRouter(t, Config{}, state{n: 2})
	now := int64(0)
	ms := int64(time.Millisecond)
	for i := range 300 {
		id := ids[i%2]
		own := 100 + (i*37)%900 // engine-reported uncached tokens of b
		var a, b Flight
		r.Begin(id, &Request{Model: []byte("m"), PromptTokens: 2000, Now: now}, nil, &a)
		r.Begin(id, &Request{Model: []byte("m"), PromptTokens: 3000, Now: now + ms}, nil, &b)
		aOwn := 50 + (i*53)%1000 // a: the rest of its 2,000 tokens cached
		aFirst := now + int64((over+float64(aOwn)/rate)*1e9)
		r.FirstToken(&a, aFirst)
		bFirst := aFirst + int64((over+float64(own)/rate)*1e9)
		r.FirstToken(&b, bFirst)
		r.EndWith(&a, bFirst+ms, Outcome{OK: true, CachedTokens: 2000 - aOwn, PromptTokens: 2000})
		r.EndWith(&b, bFirst+2*ms, Outcome{OK: true, CachedTokens: 3000 - own, PromptTokens: 3000})
		now = bFirst + 100*ms
	}
	checkColdPrediction(t, r, ids[0], now, 4000, over+4000/rate, 0.15)
}

// TestPrefillRateSkipsPossibleSlotWaits: an engine whose batch limit the
// router has not learned (scrapes have shown it running 2 at once, never
// with requests waiting). A third request joining two decoding ones waits
// for one of them to finish: half a second, however short its prefill.
// Read as prefill, such waits make short prompts look as slow as long
// ones and the line flat. The pool's line skips requests that joined as
// many busy requests as the replica was ever seen running, and keeps those
// that found fewer (here the only ones whose prompts vary in length).
func TestPrefillRateSkipsPossibleSlotWaits(t *testing.T) {
	const rate, over = 20000.0, 0.010
	r, ids := buildRouter(t, Config{}, state{n: 1})
	ms := int64(time.Millisecond)
	r.SetSignals(ids[0], EngineSignals{Running: 2, At: 0})
	now := 10 * ms
	for i := range 300 {
		own := 50 + (i*53)%1500
		m := func(tokens int) *Request { return &Request{Model: []byte("m"), PromptTokens: tokens, Now: now} }
		var a, b, c Flight
		r.Begin(ids[0], m(100), nil, &a) // alone
		aFirst := now + int64((over+100/rate)*1e9)
		r.FirstToken(&a, aFirst)
		now = aFirst
		r.Begin(ids[0], m(own), nil, &b) // beside a: a slot is free (2 seen running)
		r.FirstToken(&b, now+int64((over+float64(own)/rate)*1e9))
		now += int64((over+float64(own)/rate)*1e9) + 20*ms
		r.Begin(ids[0], m(100+own/4), nil, &c) // the third: waits for a's slot
		r.EndWith(&a, now+500*ms, Outcome{OK: true, CachedTokens: 0, PromptTokens: 100})
		r.FirstToken(&c, now+500*ms+int64((over+float64(100+own/4)/rate)*1e9))
		r.EndWith(&b, now+600*ms, Outcome{OK: true, CachedTokens: 0, PromptTokens: own})
		r.EndWith(&c, now+700*ms, Outcome{OK: true, CachedTokens: 0, PromptTokens: 100 + own/4})
		now += time.Second.Nanoseconds()
	}
	checkColdPrediction(t, r, ids[0], now, 4000, over+4000/rate, 0.15)
}

// TestHitsJudgedInRouterTokens: a tokenizer denser than the router's
// bytes / 4 estimate (0.9 engine tokens per router token). Every predicted
// hit comes true, so the replica keeps full trust in its hits: compared
// as reported, the engine's cached tokens fall 10% short of every
// prediction, the confidence settles at 0.9, and a tenth of each cached
// prefix is priced as prefill.
func TestHitsJudgedInRouterTokens(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	system := strings.Repeat("company instructions. ", 373)[:8192] // 2048 router tokens
	warm(r, ids[0], hotRequest(t, system, 0))
	for u := 1; u <= 40; u++ {
		req := hotRequest(t, system, u)
		req.Now = int64(u) * int64(time.Second)
		d := decide(t, r, req)
		var f Flight
		r.Begin(ids[0], req, &d, &f)
		r.FirstToken(&f, req.Now+int64(20*time.Millisecond))
		engine := func(n int) int { return int(math.Round(0.9 * float64(n))) }
		r.EndWith(&f, req.Now+int64(500*time.Millisecond), Outcome{OK: true,
			CachedTokens: engine(d.CachedTokens[0]), PromptTokens: engine(req.PromptTokens)})
	}
	if c := r.Replicas()[0].Confidence; c < 0.99 {
		t.Fatalf("confidence %.3f after 40 hits that all came true, in a tokenizer 0.9x the estimate", c)
	}
}

// TestPrefillRateAfterSlowFirstAnswer: each engine's first answer takes 3 s
// (warm-up); every later one 10 ms + tokens / 20,000 tokens/s. The first
// answers stay out of the pool's line, which a plain average over its
// first samples would carry for hundreds of them.
func TestPrefillRateAfterSlowFirstAnswer(t *testing.T) {
	const rate, over = 20000.0, 0.010
	r, ids := buildRouter(t, Config{}, state{n: 2})
	now := int64(0)
	for i := range 80 {
		own := 100 + (i*53)%2000
		var f Flight
		r.Begin(ids[i%2], &Request{Model: []byte("m"), PromptTokens: own, Now: now}, nil, &f)
		ttft := over + float64(own)/rate
		if i < 2 {
			ttft = 3
		}
		r.FirstToken(&f, now+int64(ttft*1e9))
		r.EndWith(&f, now+int64(ttft*1e9)+1e8, Outcome{OK: true, CachedTokens: 0, PromptTokens: own})
		now += int64(ttft*1e9) + 2e8
	}
	checkColdPrediction(t, r, ids[0], now, 4000, over+4000/rate, 0.15)
}

// TestInRouterTokens: an engine's counts scaled by the router's estimate
// over the engine's prompt, from usage or llama.cpp's cache_n + prompt_n;
// a ratio past a tokenizer's spread is left as reported.
func TestInRouterTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     Outcome
		router int
		want   Outcome
	}{
		{"usage", Outcome{CachedTokens: 900, PromptTokens: 1000}, 1100, Outcome{CachedTokens: 990, PromptTokens: 1100}},
		{"llama.cpp timings", Outcome{CachedTokens: 900, PrefillTokens: 100, PrefillSeconds: 0.1}, 1100,
			Outcome{CachedTokens: 990, PrefillTokens: 110, PrefillSeconds: 0.1, PromptTokens: 1100}},
		{"no more than the prompt", Outcome{CachedTokens: 1200, PromptTokens: 1000}, 1100, Outcome{CachedTokens: 1100, PromptTokens: 1100}},
		{"ratio past a tokenizer's spread", Outcome{CachedTokens: 900, PromptTokens: 1000}, 500, Outcome{CachedTokens: 900}},
		{"no engine count", Outcome{CachedTokens: 900}, 1100, Outcome{CachedTokens: 900}},
		{"unknown cached", Outcome{CachedTokens: -1, PromptTokens: 1000}, 1100, Outcome{CachedTokens: -1, PromptTokens: 1100}},
	} {
		o := tc.in
		o.inRouterTokens(tc.router)
		if o != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, o, tc.want)
		}
	}
}

// checkColdPrediction begins a cold prompt of tokens on idle replica id
// at now and checks its predicted TTFT is want within tol (a share).
func checkColdPrediction(t *testing.T, r *Router, id ReplicaID, now int64, tokens int, want, tol float64) {
	t.Helper()
	var f Flight
	r.Begin(id, &Request{Model: []byte("m"), PromptTokens: tokens, Now: now}, nil, &f)
	defer r.End(&f, now+1e9, 0, true)
	if p := f.PredictedTTFT(); math.Abs(p/want-1) > tol {
		t.Fatalf("predicted %.3f s for a cold %d-token prompt on an idle replica, want %.3f s within %.0f%%", p, tokens, want, tol*100)
	}
}

// TestEngineRateFromSharedBatches: an engine that prefills its slots'
// prompts in shared batch steps (llama.cpp: each step takes up to 2,048
// prompt tokens, slot by slot, and costs a fixed 5 ms plus its tokens at
// 8,000 tokens/s) reports each prompt's prefill as the wall time of the
// steps it was in. Mostly short prompts, now and then a long one, often
// overlapping: the estimate is the engine's marginal 8,000 tokens/s within
// a quarter, where an EWMA of the per-request rates (the estimate before
// busy periods) is off by more (0.6x here).
func TestEngineRateFromSharedBatches(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1})
	type job struct {
		f      Flight
		left   int
		start  float64
		arrive float64
		tokens int
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var jobs []*job
	at := 0.0
	for range 400 {
		at += rng.ExpFloat64() * 0.25
		n := 40 + rng.IntN(60)
		if rng.IntN(8) == 0 {
			n = 2000 + rng.IntN(3000)
		}
		jobs = append(jobs, &job{arrive: at, tokens: n, left: n, start: -1})
	}
	const step0, rate, budget = 0.005, 8000.0, 2048
	now, next := 0.0, 0
	var active []*job
	ns := func(s float64) int64 { return int64(s * 1e9) }
	var old float64
	for next < len(jobs) || len(active) > 0 {
		for next < len(jobs) && jobs[next].arrive <= now {
			j := jobs[next]
			req := &Request{Model: []byte("m"), PromptTokens: j.tokens, Now: ns(j.arrive)}
			r.Begin(ids[0], req, nil, &j.f)
			active = append(active, j)
			next++
		}
		if len(active) == 0 {
			now = jobs[next].arrive
			continue
		}
		take := 0
		for _, j := range active {
			if take == budget {
				break
			}
			k := min(j.left, budget-take)
			take += k
			j.left -= k
			if j.start < 0 {
				j.start = now
			}
		}
		now += step0 + float64(take)/rate
		keep := active[:0]
		for _, j := range active {
			if j.left > 0 {
				keep = append(keep, j)
				continue
			}
			sec := now - j.start
			r.FirstToken(&j.f, ns(now))
			r.EndWith(&j.f, ns(now)+1e8, Outcome{OK: true, CachedTokens: 0, PrefillTokens: j.tokens, PrefillSeconds: sec})
			if j.tokens >= 16 { // what the EWMA of per-request rates took
				if old == 0 {
					old = float64(j.tokens) / sec
				} else {
					old += 0.1 * (min(max(float64(j.tokens)/sec, old/4), old*4) - old)
				}
			}
		}
		active = keep
	}
	got := r.Replicas()[0].EnginePrefillRate
	t.Logf("engine rate %.0f tokens/s; an EWMA of per-request rates: %.0f", got, old)
	if got < 0.75*rate || got > 1.25*rate {
		t.Fatalf("engine rate %.0f tokens/s, want the engine's %.0f within a quarter", got, rate)
	}
	if old >= 0.75*rate {
		t.Fatalf("an EWMA of per-request rates gives %.0f tokens/s: the test no longer shares batches", old)
	}
}

// TestEnginePeriodsMergeOutOfOrder: prefill intervals reported in the
// order their requests finished decoding, not the order they prefilled,
// still merge into one busy period, which closes only once a prefill
// begins more than the grace after it ended.
func TestEnginePeriodsMergeOutOfOrder(t *testing.T) {
	var e enginePeriods
	const grace = 100
	// the second prefill reports first
	if d := e.add(enginePeriod{start: 50, end: 80, tokens: 10, pairs: 100, ctx: 7, ctxMax: 7}, grace); len(d) != 0 {
		t.Fatalf("closed %v early", d)
	}
	if d := e.add(enginePeriod{start: 0, end: 60, tokens: 20, pairs: 200, ctx: 0, ctxMax: 0}, grace); len(d) != 0 {
		t.Fatalf("closed %v early", d)
	}
	if d := e.add(enginePeriod{start: 150, end: 160, tokens: 5, pairs: 50, ctx: 1}, grace); len(d) != 0 { // within the grace of 80
		t.Fatalf("closed %v within the grace", d)
	}
	d := e.add(enginePeriod{start: 300, end: 310, tokens: 5}, grace)
	want0 := enginePeriod{start: 0, end: 80, tokens: 30, pairs: 300, ctx: 7, ctxMax: 7}
	want1 := enginePeriod{start: 150, end: 160, tokens: 5, pairs: 50, ctx: 1}
	if len(d) != 2 || d[0] != want0 || d[1] != want1 {
		t.Fatalf("closed %v, want [%v %v]", d, want0, want1)
	}
}

// TestEngineRateShrinksTowardPool: two replicas of one model whose engines
// report 4,000 and 2,000 tokens/s. After a few busy periods each, the rates
// they are priced with are nearer each other than their own estimates (a
// few periods are noise as much as speed), and so are their overheads
// (the second's first tokens come 0.2 s after its engine's prefill);
// after 200 periods each, the slower one is priced near its own rate.
func TestEngineRateShrinksTowardPool(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2})
	speeds := []float64{4000, 2000}
	extra := []float64{0, 0.2} // the second's first tokens come 0.2 s after its prefill
	now := int64(1e9)
	feed := func(periods int) {
		for i := range periods {
			for k, id := range ids {
				tokens := 500 + 1500*(i%3)
				req := &Request{Model: []byte("m"), PromptTokens: tokens, Now: now}
				var f Flight
				r.Begin(id, req, nil, &f)
				sec := 0.02 + float64(tokens)/speeds[k]
				ft := now + int64((sec+extra[k])*1e9)
				r.FirstToken(&f, ft)
				r.EndWith(&f, ft+1e8, Outcome{OK: true, CachedTokens: 0, PrefillTokens: tokens, PrefillSeconds: sec})
				now = ft + 5e9 // far past the grace: each prefill its own period
			}
		}
	}
	priced := func() (own, got [2]float64) {
		for i, st := range r.Replicas() {
			own[i], got[i] = st.EnginePrefillRate, st.PrefillTokensPerSec
		}
		return
	}
	feed(4)
	own, got := priced()
	t.Logf("after 4 periods: own %.0f / %.0f, priced %.0f / %.0f", own[0], own[1], got[0], got[1])
	if !(own[0]/own[1] > 1.5) {
		t.Fatalf("own rates %.0f / %.0f: the engines' speeds not measured", own[0], own[1])
	}
	if !(got[0]/got[1] < 0.8*own[0]/own[1]) || !(got[1] > own[1]) || !(got[0] < own[0]) {
		t.Fatalf("priced %.0f / %.0f, not drawn toward each other from %.0f / %.0f", got[0], got[1], own[0], own[1])
	}
	overs := func() (own, got [2]float64) {
		for i, id := range ids {
			own[i], got[i] = r.reps[id].model.ownOver, r.Replicas()[i].OverheadSeconds
		}
		return
	}
	ownO, gotO := overs()
	t.Logf("overheads: own %.3f / %.3f, priced %.3f / %.3f", ownO[0], ownO[1], gotO[0], gotO[1])
	if !(gotO[1] < ownO[1]-0.05) || !(gotO[0] > ownO[0]) {
		t.Fatalf("overheads priced %.3f / %.3f, not drawn toward each other from %.3f / %.3f", gotO[0], gotO[1], ownO[0], ownO[1])
	}
	feed(196)
	own, got = priced()
	t.Logf("after 200 periods: own %.0f / %.0f, priced %.0f / %.0f", own[0], own[1], got[0], got[1])
	if !(got[1] < 1.2*own[1]) || !(got[0]/got[1] > 1.6) {
		t.Fatalf("priced %.0f / %.0f after 200 periods each, want near own %.0f / %.0f", got[0], got[1], own[0], own[1])
	}
}

// TestSlotTimeGrowsWithSharing: engines whose slot time grows with the
// requests sharing them (a one-core llama.cpp server decodes each of four
// requests' tokens several times slower than one's) teach the pool σ, and
// a full batch's wait is priced from the slot time at a full batch, not
// from the mean over light and busy moments; engines whose slot time does
// not grow leave σ at 0.
func TestSlotTimeGrowsWithSharing(t *testing.T) {
	const base = 0.05 // seconds a request holds a slot alone
	for _, sigma := range []float64{0, 1, 3} {
		t.Run(fmt.Sprintf("sigma %g", sigma), func(t *testing.T) {
			r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
			rng := rand.New(rand.NewPCG(3, uint64(sigma*10)))
			s := int64(time.Second)
			now := s
			n := 0
			// Groups of 1 to 4 requests on replica 0 at once, begun and
			// ended together: each shares the engine with k-1 others for
			// its whole life. (Counts at Begin and End alone would say
			// (k-1)/2 on average: 0 for the first begun, k-1 for the last.)
			for g := range 120 {
				k := 1 + rng.IntN(4)
				fs := make([]*Flight, k)
				for i := range fs {
					req := promptReq(t, fmt.Sprintf("group %d request %d", g, i), "u")
					req.Now = now
					fs[i] = new(Flight)
					r.Begin(ids[0], req, nil, fs[i])
					r.FirstToken(fs[i], now+s/100)
					n++
				}
				slot := base * (1 + sigma*float64(k-1)) // the decode, after the first token
				for _, f := range fs {
					r.EndWith(f, now+s/100+int64(slot*1e9), Outcome{OK: true, CachedTokens: 0, PromptTokens: f.PromptTokens,
						PrefillTokens: f.PromptTokens, PrefillSeconds: 0.01, DecodeSeconds: slot})
				}
				now += 2 * s
			}
			h := r.hotOf(ids[0])
			got := h.fleetPrefill.slotLoad()
			if sigma == 0 && got > 0.05 || sigma > 0 && (got < 0.7*sigma || got > 1.1*sigma) {
				t.Fatalf("σ %.3f learned from %d requests, want about %g", got, n, sigma)
			}
			if d := h.slotSeconds(); d < 0.8*base || d > 1.2*base {
				t.Fatalf("slot time alone %.3fs, want about %gs", d, base)
			}
			// Four requests just began decoding on replica 0: a fifth waits
			// for the first of them to end, about 2/5 of a full batch's
			// slot time (slotWaitRaw's order statistics).
			for i := range 4 {
				req := promptReq(t, fmt.Sprintf("full batch %d", i), "u")
				req.Now = now
				f := new(Flight)
				r.Begin(ids[0], req, nil, f)
				r.FirstToken(f, now)
			}
			req := promptReq(t, "the fifth", "u")
			req.Now = now
			f := new(Flight)
			r.Begin(ids[0], req, nil, f)
			full := base * (1 + sigma*3)
			if want := 2 * full / 5; f.slotWait < 0.75*want || f.slotWait > 1.25*want {
				t.Fatalf("a full batch's wait priced %.3fs, want about %.3fs (2/5 of %.3fs)", f.slotWait, want, full)
			}
		})
	}
}

// TestSharedDuringIsTimeAveraged: a request's sharing is the time average
// of the others on its replica over its life, not a count at its Begin
// or End: A runs 2 s, B joins for its second second, so A shared with 0.5
// on average (counts at its Begin and End: 0 and 1).
func TestSharedDuringIsTimeAveraged(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1, slots: []int{4}})
	s := int64(time.Second)
	begin := func(tag string, at int64) *Flight {
		req := promptReq(t, tag, "u")
		req.Now = at
		f := new(Flight)
		r.Begin(ids[0], req, nil, f)
		return f
	}
	a := begin("a", s)
	b := begin("b", 2*s)
	r.End(a, 3*s, -1, true)
	if x := r.rep(ids[0]).sharedDuring(a, 3*s); math.Abs(x-0.5) > 1e-9 {
		t.Fatalf("A shared with %.3f on average, want 0.5", x)
	}
	r.End(b, 4*s, -1, true)
	if x := r.rep(ids[0]).sharedDuring(b, 4*s); math.Abs(x-0.5) > 1e-9 {
		t.Fatalf("B shared with %.3f on average, want 0.5", x)
	}
}

// TestOverheadSkipsSharedPrefills: a cold prompt that began alone but met
// three more cold prompts before its first token (a burst) took about
// four times its time alone, sharing the engine's steps with them; its
// time is not a clean sample of the replica's overhead, which stays what
// requests that ran alone show (50 ms), so the replica's cached questions
// are not priced several times their cost after every burst.
func TestOverheadSkipsSharedPrefills(t *testing.T) {
	const (
		over = 0.05   // seconds to a first token besides prefill
		rate = 6500.0 // the engine's prefill tokens/s
	)
	r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
	s := int64(time.Second)
	now := s
	alone := func(i, tokens int) {
		req := &Request{Model: []byte("m"), PromptTokens: tokens, Now: now}
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		sec := float64(tokens) / rate
		ft := now + int64((over+sec)*1e9)
		r.FirstToken(&f, ft)
		r.EndWith(&f, ft+s/10, Outcome{OK: true, CachedTokens: 0, PromptTokens: tokens, PrefillTokens: tokens, PrefillSeconds: sec, DecodeSeconds: 0.1})
		now = ft + 2*s
	}
	for i := range 30 {
		alone(i, 64+32*(i%4))
	}
	before := r.Replicas()[0].OverheadSeconds
	if math.Abs(before-over) > 0.01 {
		t.Fatalf("overhead %.3f s from requests alone, want %g", before, over)
	}
	// Bursts: four cold prompts of 4,096 tokens begun 50 ms apart, their
	// prefills sharing the engine's steps, so the first one's first token
	// comes when all four are done.
	const cold = 4096
	for b := range 5 {
		fs := make([]*Flight, 4)
		for i := range fs {
			req := &Request{Model: []byte("m"), PromptTokens: cold, Now: now + int64(i)*s/20}
			fs[i] = new(Flight)
			r.Begin(ids[0], req, nil, fs[i])
		}
		all := over + 4*cold/rate
		for i, f := range fs {
			ft := now + int64((all-float64(3-i)*0.01)*1e9)
			r.FirstToken(f, ft)
			r.EndWith(f, ft+s/10, Outcome{OK: true, CachedTokens: 0, PromptTokens: cold, PrefillTokens: cold,
				PrefillSeconds: all - over, DecodeSeconds: 0.1})
		}
		now += 5 * s
		if got := r.Replicas()[0].OverheadSeconds; got > 1.5*over {
			t.Fatalf("after burst %d: overhead %.3f s (was %.3f): the first prompt of the burst, begun alone but shared, "+
				"taken as a clean sample", b+1, got, before)
		}
	}
}

// TestPrefillingBatchHasItsDecodesAhead: a full 4-slot replica whose
// requests (this router's) have not had a first token has every decode
// ahead of it: a fifth request waits for the first of four fresh slot
// times (2/5 of one, as for a batch that just began decoding), not the
// quarter of one an undated batch is priced at. Before, a burst of cold
// prompts made their replica look nearer a free slot than one whose
// batch had decoded for a while, and the rest of the burst went there.
func TestPrefillingBatchHasItsDecodesAhead(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1, slots: []int{4}})
	h := r.hotOf(ids[0])
	storeF(&h.slotSec, 1)
	for i := range 4 {
		req := promptReq(t, fmt.Sprintf("cold prompt %d", i), "u")
		r.Begin(ids[0], req, nil, new(Flight))
	}
	if got, want := h.slotWait(4, 0), 2.0/5; math.Abs(got-want) > 1e-9 {
		t.Fatalf("a fifth request waits %.3f s for a slot, want %.3f (the first of four whole slot times)", got, want)
	}
}

// TestSlotFitSeparatesPrefill: decodes that share the engine with x
// others and, on some engines, wait through the prefill the engine ran
// for others meanwhile (pre seconds). The two come together in bursts,
// but not always in step; the pool's fit tells them apart: γ near 1
// where decodes wait through the others' prefill (llama.cpp's steps), 0
// where they do not, σ the growth per request in both, and D_r the time
// alone. With the prefill in D_r, the replica that met the last burst
// had a slot time several times its identical neighbour's.
func TestSlotFitSeparatesPrefill(t *testing.T) {
	const base, sigma = 0.1, 0.5
	for _, gamma := range []float64{0, 1} {
		t.Run(fmt.Sprintf("gamma %g", gamma), func(t *testing.T) {
			r, ids := buildRouter(t, Config{}, state{n: 1, slots: []int{4}})
			p := r.reps[ids[0]]
			rng := rand.New(rand.NewPCG(7, uint64(gamma)))
			for range 400 {
				x := float64(rng.IntN(4))                // others on the engine
				pre := float64(rng.IntN(int(x)+1)) * 0.5 // of which some prefilled 0.5 s each meanwhile
				sec := base*(1+sigma*x) + gamma*pre      // the decode
				sec *= 1 + 0.1*(rng.Float64()-0.5)       // and some noise
				p.sampleSlot(sec, x, pre, true)
			}
			h := r.hotOf(ids[0])
			gotS, gotG := h.fleetPrefill.slotLoad(), h.fleetPrefill.slotPrefillShare()
			t.Logf("σ %.3f, γ %.3f, D_r %.3f", gotS, gotG, h.slotSeconds())
			if gotG < gamma-0.25 || gotG > gamma+0.1 {
				t.Fatalf("γ %.3f, want about %g", gotG, gamma)
			}
			if gotS < 0.6*sigma || gotS > 1.2*sigma {
				t.Fatalf("σ %.3f, want about %g", gotS, sigma)
			}
			if d := h.slotSeconds(); d < 0.8*base || d > 1.25*base {
				t.Fatalf("D_r %.3f s, want about %g (the decode alone)", d, base)
			}
		})
	}
}

// TestDecodeSampleLessOthersPrefill: a question decodes for 0.1 s alone
// plus the 0.5 s its engine spent prefilling a cold prompt that arrived
// meanwhile (2,000 tokens at 4,000 tokens/s). Where the pool has learned
// that decodes wait through such prefill (γ 1), the question's sample
// gives D_r its 0.1 s, not 0.6.
func TestDecodeSampleLessOthersPrefill(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 1, slots: []int{4}, rates: []float64{4000}})
	h := r.hotOf(ids[0])
	storeF(&h.fleetPrefill.slotPrefill, 1)
	s := int64(time.Second)
	now := s
	for i := range 40 {
		q := &Request{Model: []byte("m"), PromptTokens: 40, Now: now}
		var fq, fc Flight
		r.Begin(ids[0], q, nil, &fq)
		r.FirstToken(&fq, now+s/50)
		if i%2 == 0 {
			// A cold prompt begins and is prefilled while the question decodes.
			c := &Request{Model: []byte("m"), PromptTokens: 2000, Now: now + s/20}
			r.Begin(ids[0], c, nil, &fc)
			r.FirstToken(&fc, now+s/20+s/2)
		}
		dec := 0.1
		if i%2 == 0 {
			dec += 0.5
		}
		end := now + s/50 + int64(dec*1e9)
		r.End(&fq, end, 0, true)
		if i%2 == 0 {
			// Not a sample: a decode of unknown length.
			fc.FirstTokenAt = 0
			r.End(&fc, end, -1, false)
		}
		now += 5 * s
	}
	if d := h.slotSeconds(); d < 0.08 || d > 0.13 {
		t.Fatalf("D_r %.3f s, want about 0.1 (the decode less the others' prefill it waited through)", d)
	}
}

// TestSlotTimeDrawnTowardPool: two identical replicas decode in 0.1 s;
// the last five requests of one of them met a burst and decoded for a
// second, then only the other served. The first's own estimate keeps the
// burst (no traffic moves it), but the slot time it is priced with is
// drawn toward the pool's, which its neighbour's samples brought back.
func TestSlotTimeDrawnTowardPool(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}})
	ps := []*replica{r.reps[ids[0]], r.reps[ids[1]]}
	for range 40 {
		ps[0].sampleSlot(0.1, 0, 0, true)
		ps[1].sampleSlot(0.1, 0, 0, true)
	}
	for range 5 {
		ps[1].sampleSlot(1, 0, 0, true)
	}
	for range 40 {
		ps[0].sampleSlot(0.1, 0, 0, true)
	}
	own := loadF(&ps[1].slotSec)
	d0, d1 := ps[0].slotSeconds(), ps[1].slotSeconds()
	t.Logf("own %.3f, priced %.3f / %.3f", own, d0, d1)
	if own < 0.4 {
		t.Fatalf("own estimate %.3f after the burst, want it kept (about 0.47)", own)
	}
	if d1 > 0.6*own || d1 < d0 || math.Abs(d0-0.1) > 0.01 {
		t.Fatalf("priced %.3f / %.3f, want the burst's replica drawn toward the pool's 0.1 from its own %.3f", d0, d1, own)
	}
}

// TestBurstPrefillIsOnePeriod: four cold prompts prefilled together on a
// llama.cpp-like server (one 3.2 s busy period at 5,000 tokens/s) report
// their prefills at their Ends, which come a second apart (each decode
// waits through the others' prefill and shares the engine), and a short
// request's report comes in between. Their intervals still join one busy
// period: the grace for a late report is the replica's Begin-to-End
// time, not its slot time alone (a decode of 0.1 s), under which each
// late report made a period of its own, 4,000 tokens in 3.2 s, and read
// the server as four times slower than it is.
func TestBurstPrefillIsOnePeriod(t *testing.T) {
	const rate = 5000.0
	r, ids := buildRouter(t, Config{}, state{n: 1, slots: []int{4}})
	s := int64(time.Second)
	now := s
	one := func(tokens int, begin, first, end int64) {
		req := &Request{Model: []byte("m"), PromptTokens: tokens, Now: begin}
		var f Flight
		r.Begin(ids[0], req, nil, &f)
		r.FirstToken(&f, first)
		r.EndWith(&f, end, Outcome{OK: true, CachedTokens: 0, PromptTokens: tokens, PrefillTokens: tokens,
			PrefillSeconds: float64(first-begin) / 1e9, DecodeSeconds: float64(end-first) / 1e9})
	}
	for i := range 6 { // requests alone: 250-1,000 tokens, 0.1 s decodes; too few periods for the line
		tokens := 250 * (1 + i%4)
		first := now + int64(float64(tokens)/rate*1e9)
		one(tokens, now, first, first+s/10)
		now = first + 2*s
	}
	before := r.Replicas()[0].EnginePrefillRate
	fs := make([]Flight, 4)
	for i := range fs {
		r.Begin(ids[0], &Request{Model: []byte("m"), PromptTokens: 4000, Now: now}, nil, &fs[i])
	}
	done := now + int64(4*4000/rate*1e9) // the four prefills end together
	for i := range fs {
		r.FirstToken(&fs[i], done)
	}
	for i := range fs {
		end := done + s/10 + int64(i)*s // Ends a second apart
		r.EndWith(&fs[i], end, Outcome{OK: true, CachedTokens: 0, PromptTokens: 4000, PrefillTokens: 4000,
			PrefillSeconds: float64(done-now) / 1e9, DecodeSeconds: float64(end-done) / 1e9})
		if i == 0 {
			// A short request begun after the burst reports first.
			one(250, done+s/2, done+s/2+s/20, done+s/2+s/20+s/10)
		}
	}
	now = done + 6*s
	for range 3 { // later requests close the burst's period
		first := now + int64(500/rate*1e9)
		one(500, now, first, first+s/10)
		now = first + 2*s
	}
	after := r.Replicas()[0].EnginePrefillRate
	t.Logf("engine rate %.0f before the burst, %.0f after", before, after)
	if after < 0.8*rate {
		t.Fatalf("engine rate %.0f tokens/s after the burst (%.0f before), want about %.0f: the burst's late reports made periods of their own",
			after, before, rate)
	}
}
