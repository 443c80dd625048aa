package affinity

import (
	"math"
	"slices"
	"testing"
)

// refCostRank is the cost policy as the formula in policy_cost.go writes
// it, every candidate scored in full, three passes and View.RankLowest:
// the reference the pruned ranking must match, score for score.
func refCostRank(p *CostPolicy, v *View, req *Request, d *Decision) {
	if p.cfg.MaxScan > 0 {
		v.Sample(p.cfg.MaxScan)
	}
	cfg := &p.cfg
	t := float64(req.PromptTokens)
	v.match()
	m := v.ms.m
	var otok []int32
	if v.oracle {
		otok = v.otok
	}
	bt := float64(v.r.bt)
	credit := 0.0
	if otok == nil {
		credit = loadF(&v.r.contCredit)
	}
	now, maxAge := req.Now, int64(cfg.SignalMaxAge)
	cands := v.Candidates()
	type cand struct {
		cached, unc, own, pre, pen, kvPen float64
		queuedReqs                        int64
		kv, full                          bool
	}
	cs := make([]cand, len(cands))
	best := 0.0
	home := -1
	var l Load
	for i, id := range cands {
		rp := v.r.reps[id]
		c := 0.0
		switch {
		case otok != nil:
			c = min(float64(otok[id]), t)
		case int(id) < len(m) && m[id] > 0:
			c = min(float64(m[id])*bt, t)
			if credit > 0 && int(m[id]) < len(req.Hashes) && v.r.finishedTail(req.Hashes[m[id]-1], id) {
				c = min(c+credit, t)
				home = i
			}
		}
		best = max(best, c)
		rp.queueLoad(&l, now, maxAge)
		busy := int64(l.Busy())
		backlog := rp.backlog(now)
		rate, over := rp.prefill()
		inv := 1 / rate
		e := &cs[i]
		e.cached = c
		e.queuedReqs = int64(l.QueuedRequests())
		e.full = refFull(rp.repHot, busy, backlog, now)
		e.unc = max(t-rp.confidence()*c, 0)
		e.own = rp.prefillSeconds(e.unc, t-e.unc, inv) // (T - c_r C_r) / P_r, or the engine's shape
		e.pre = over + max(rp.slotRisk(rp.slots(), busy, now), backlog) + l.QueuedTokens()*inv
		e.pen = max(cfg.LoadPenaltySeconds, rp.busyCost()) * float64(busy) * rp.invWeight
		u := l.KVUsage + e.unc*l.kvInvCap // U_r after this request's uncached tokens
		e.kv = u > cfg.KVHighWater
		if e.kv {
			e.kvPen = cfg.KVPenaltySeconds * (u - cfg.KVHighWater) / (1 - cfg.KVHighWater)
		}
	}
	// a continuation whose home has room for as many again: busy
	// requests at their measured cost
	if home >= 0 && refRoom(v.r.reps[cands[home]].repHot, now, maxAge) {
		for i, id := range cands {
			rp := v.r.reps[id]
			rp.queueLoad(&l, now, maxAge)
			cs[i].pen = rp.busyCost() * float64(l.Busy()) * rp.invWeight
		}
	}
	var coldQueued, cold int64
	homesFull := best > 0
	for i := range cs {
		if cs[i].cached < best/2 || best == 0 {
			coldQueued += cs[i].queuedReqs
			cold++
		} else if !cs[i].full {
			homesFull = false
		}
	}
	typical := 0.0
	if cold > 0 {
		typical = float64(coldQueued) / float64(cold)
	}
	sc := v.Scores()
	for i := range cs {
		e := &cs[i]
		x := 1 + max(float64(e.queuedReqs), typical)
		if homesFull && !e.full {
			x = 1
		}
		est := e.pre + x*e.own + e.pen
		if e.kv {
			est += e.kvPen
		}
		sc[i] = est
	}
	v.RankLowest(d)
}

// refRoom is roomAtHome as its comment writes it.
func refRoom(p *repHot, now, maxAge int64) bool {
	var l Load
	p.queueLoad(&l, now, maxAge)
	need := 2 * (int64(l.Busy()) + 1)
	switch s, v := p.slots(), int64(p.runSeen.Load()); {
	case s > 0:
		return need <= s
	case v < 0:
		return need <= -v
	}
	return true
}

// refFull is costCand.isFull as the formula writes it.
func refFull(p *repHot, busy int64, backlog float64, now int64) bool {
	if s := p.slots(); s > 0 && busy >= s {
		return true
	}
	rate, over := p.prefill()
	return backlog > 0 && backlog > p.predictWith(rate, over, 0, now)
}

// refDecide is Router.Decide with refCostRank.
func refDecide(r *Router, req *Request, d *Decision) error {
	d.Ranked = d.Ranked[:0]
	r.mu.RLock()
	defer r.mu.RUnlock()
	g := r.groups[string(req.Model)]
	if g == nil {
		return ErrModelNotFound
	}
	v := &d.view
	v.reset(r, req, g)
	v.cands, v.pos, v.own = r.eligible(g, v.own)
	if len(v.cands) == 0 {
		return ErrNoReplica
	}
	refCostRank(r.policy.(*CostPolicy), v, req, d)
	return nil
}

// TestCostPrunedMatchesReference: over random states (costWorld), the cost
// policy's pruned ranking is the reference's (every candidate scored, then
// RankLowest), ties included, and every candidate's estimate, when
// computed, is the reference's score bit for bit, never below its bound.
func TestCostPrunedMatchesReference(t *testing.T) {
	seeds, steps := 24, 1500 // about 36,000 decisions
	if testing.Short() || raceEnabled {
		seeds = 4
	}
	var decisions, scored, prunable int
	for seed := range uint64(seeds) {
		n := 4 + int(seed*7)%60
		if seed%8 == 7 {
			n = 300 // above the default MaxScan: a window and the holders
		}
		w, err := newCostWorld(seed, n)
		if err != nil {
			t.Fatal(err)
		}
		pol := w.r.policy.(*CostPolicy)
		var got, want Decision
		for step := range steps {
			w.step()
			req := w.request()
			rnd := w.r.rnd.Load()
			errGot := w.r.Decide(req, &got)
			w.r.rnd.Store(rnd)
			errWant := refDecide(w.r, req, &want)
			if errGot != errWant {
				t.Fatalf("seed %d step %d: error %v, reference %v", seed, step, errGot, errWant)
			}
			if errGot != nil {
				continue
			}
			decisions++
			if !slices.Equal(got.Ranked, want.Ranked) {
				t.Fatalf("seed %d step %d: ranked %v, reference %v", seed, step, got.Ranked, want.Ranked)
			}
			// Every estimate against the reference's score, on the
			// reference's candidates (the same Sample).
			v := &want.view
			ref := v.score
			w.r.mu.RLock()
			cs, _ := pol.score(v, req)
			kth := math.Inf(-1)
			for _, id := range want.Ranked {
				kth = max(kth, ref[slices.Index(v.cands, id)])
			}
			for i := range cs {
				est := cs[i].est(w.r.hotOf(v.cands[i]), req.Now)
				if math.Float64bits(est) != math.Float64bits(ref[i]) && !(math.IsNaN(est) && math.IsNaN(ref[i])) {
					t.Fatalf("seed %d step %d: candidate %d estimate %v, reference %v", seed, step, v.cands[i], est, ref[i])
				}
				if cs[i].low > est {
					t.Fatalf("seed %d step %d: candidate %d bound %v above its estimate %v", seed, step, v.cands[i], cs[i].low, est)
				}
				if len(want.Ranked) == min(w.r.cfg.MaxRanked, len(v.cands)) && cs[i].low > kth {
					prunable++
				}
			}
			w.r.mu.RUnlock()
			scored += len(v.cands)
		}
	}
	t.Logf("%d decisions, %d of %d candidates' bounds above the ranked scores", decisions, prunable, scored)
	if decisions < seeds*steps/2 || prunable == 0 {
		t.Fatalf("%d decisions, %d prunable candidates: the states do not exercise the ranking", decisions, prunable)
	}
}
