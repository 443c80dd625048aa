package affinity

// CostPolicy (the default) ranks by estimated time to first token plus the
// delay the request's own prefill imposes on the requests queued behind it:
//
//	est_r = O_r + max(slotWait_r, backlog_r) + Q_r / P_r + (T - c_r C_r) / P_r   the TTFT model (ttft.go)
//	      + (X_r - 1) * (T - c_r C_r) / P_r                                       externality: the queue it delays
//	      + LoadPenaltySeconds * B_r / W_r                                         decode work sharing the batch
//	      + KVPenaltySeconds * max(0, (U_r - KVHighWater) / (1 - KVHighWater))
//
// slotWait_r the expected wait for a batch slot, backlog_r how far this
// router's pending requests there are past their predictions, Q_r queued
// prefill tokens (Load.QueuedTokens), P_r and O_r the prefill rate and
// overhead it is priced with (configured or engine-reported, else pooled
// over the replicas serving its model: replica.prefill), T the request's
// prompt tokens, C_r its predicted cached prefix on r (the index's match, plus the measured
// continuation credit when that match ends where a request finished on r:
// see Router.ContinuationCredit), c_r the replica's prediction confidence
// (Load.Confidence), B_r busy requests (Load.Busy), W_r weight, U_r fresh
// KV usage. X_r = 1 + max(N_r, N): N_r the requests queued for prefill on
// r (Load.QueuedRequests), which a batching engine prefills in the steps
// this request's prefill joins, N the mean of N_c over the candidates not
// holding the prefix (less than half the best hit; every candidate when
// none holds it), the queue those that will join r while it prefills find
// on a replica that could take a recompute. The prefix's own homes are not
// in N: in a burst of one shared prompt their queues made an idle cold
// replica look (1 + N) times dearer than it was and the burst piled onto
// them (one-company mean TTFT 3.4x round-robin's in the simulator). On a
// replica that is not full when every replica holding at least half of the
// best predicted hit is (replica.full: no free batch slot, or a backlog),
// X_r = 1, so a prefix too hot for its homes' batches is computed once
// more where a slot is free instead of waiting for
// decodes to finish. Ties break at random.
// Above Config.MaxScan candidates it scores a random window of them plus
// every prefix holder (View.Sample). See README.md for intent and the
// guards.
type CostPolicy struct{ cfg Config }

func (*CostPolicy) Name() string { return "cost" }

// Retune takes the live knobs (the Router holds its write lock: no Rank
// runs meanwhile).
func (p *CostPolicy) Retune(cfg Config) { p.cfg = cfg }

func (p *CostPolicy) Rank(v *View, req *Request, d *Decision) {
	if p.cfg.MaxScan > 0 {
		v.Sample(p.cfg.MaxScan)
	}
	cfg := &p.cfg
	t := float64(req.PromptTokens)
	v.match()
	m := v.ms.m
	var otok []int32 // oracle-fed cached tokens (SetCacheOracle)
	if v.oracle {
		otok = v.otok
	}
	bt := float64(v.r.bt)
	credit := 0.0 // continuation credit: see Router.ContinuationCredit
	if otok == nil {
		credit = loadF(&v.r.contCredit)
	}
	now, maxAge := req.Now, int64(cfg.SignalMaxAge)
	cands := v.Candidates()
	// One pass reads each candidate's state once: its cached tokens, N_r,
	// whether it is full, and every term of its estimate but X_r, which
	// needs N and whether the prefix's homes are all full (both known only
	// after the pass). The estimate is then summed in the order written
	// above, so it is the same float64.
	cs := v.costScratch(len(cands))
	best := 0.0
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
		e.full = rp.full(busy, backlog, now)
		e.unc = max(t-rp.confidence()*c, 0)
		e.inv = inv
		e.pre = over + max(rp.slotRisk(busy, now), backlog) + l.QueuedTokens()*inv
		e.pen = cfg.LoadPenaltySeconds * float64(busy) * rp.invWeight
		e.kv = l.KVUsage > cfg.KVHighWater
		if e.kv {
			e.kvPen = cfg.KVPenaltySeconds * (l.KVUsage - cfg.KVHighWater) / (1 - cfg.KVHighWater)
		}
	}
	// The typical prefill queue a recompute joins: the mean over the
	// candidates not holding the prefix (less than half the best hit).
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
		est := e.pre + x*e.unc*e.inv + e.pen
		if e.kv {
			est += e.kvPen
		}
		sc[i] = est
	}
	v.RankLowest(d)
}

// full reports whether a new request on the replica would wait for others
// to finish: every batch slot is taken, or its pending requests are behind
// their predictions (backlog, replica.backlog at the decision's time) by
// more than the TTFT the model predicts for a new one (queueing the model
// has not learned yet, such as a batch limit before any scrape showed it).
func (p *replica) full(busy int64, backlog float64, now int64) bool {
	if s := p.slots(); s > 0 && busy >= s {
		return true
	}
	return backlog > 0 && backlog > p.predictTTFT(0, now)
}

// costCand is one candidate's part of a CostPolicy decision.
type costCand struct {
	cached     float64 // predicted cached tokens
	queuedReqs int64   // N_r
	unc        float64 // T - c_r C_r, at least 0
	inv        float64 // 1 / P_r
	pre        float64 // O_r + max(slotWait_r, backlog_r) + Q_r / P_r
	pen        float64 // the load penalty
	kvPen      float64 // the KV penalty, when kv
	kv         bool    // U_r is past KVHighWater
	full       bool
}

// Interface guards.
var (
	_ Policy  = (*CostPolicy)(nil)
	_ Retuner = (*CostPolicy)(nil)
)
