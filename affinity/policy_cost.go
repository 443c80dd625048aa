package affinity

import (
	"math"
	"slices"
)

// CostPolicy (the default) ranks by estimated time to first token plus the
// delay the request's own prefill imposes on the requests queued behind it:
//
//	est_r = O_r + max(slotWait_r, backlog_r) + Q_r / P_r + (T - c_r C_r) / P_r   the TTFT model (ttft.go)
//	      + (X_r - 1) * (T - c_r C_r) / P_r                                       externality: the queue it delays
//	      + max(LoadPenaltySeconds, β_r) * B_r / W_r                               decode work sharing the batch
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
// KV usage with the request's uncached tokens added as a share of the
// engine's KV capacity (the spec's, else its report; none known: usage
// alone), β_r the measured TTFT each busy request adds there (fitted over
// its pool beside the TTFT model: fleetPrefill.sampleBusy; where it is
// larger, the measurement replaces the constant; for a continuation whose
// home has batch slots to spare, β_r alone: roomAtHome). X_r = 1 + max(N_r, N): N_r the requests on r awaiting
// their first token (Load.QueuedRequests), whose prefill steps, or, for
// those waiting for a batch slot, whose slots' decode steps this request's
// prefill joins, N the mean of N_c over the candidates not
// holding the prefix (less than half the best hit; every candidate when
// none holds it), the queue those that will join r while it prefills find
// on a replica that could take a recompute. The prefix's own homes are not
// in N: in a burst of one shared prompt their queues made an idle cold
// replica look (1 + N) times dearer than it was and the burst piled onto
// them (one-company mean TTFT 3.4x round-robin's in the simulator). On a
// replica that is not full when every replica holding at least half of the
// best predicted hit is (costCand.isFull: no free batch slot, or a backlog),
// X_r = 1, so a prefix too hot for its homes' batches is computed once
// more where a slot is free instead of waiting for
// decodes to finish. Ties break at random. On engines that cache whole
// prompts per slot, a conversation's later turn then goes back to its
// previous turn's replica when that costs at most a quarter more
// (keepTurn).
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
	cs, lowest := p.score(v, req)
	v.rankPruned(cs, lowest, d)
	p.keepTurn(v, req, cs, d)
	if v.r.slotReps.Load() > 0 && !req.NoHold && p.cfg.SlotHold > 0 {
		p.hold(v, req, cs, d)
	}
}

// holdShare is how much of the best estimate a hold must be predicted to
// take at most: 0.75, a quarter less, so a hold is advised only where its
// gain is larger than the model's usual error.
const holdShare = 0.75

// holdSlack is how far past its predicted wait a hold lasts before the
// caller gives up on it (HoldAdvice.Until): half the wait more, plus
// holdSlackMin, but never more than the hold was predicted to save (the
// best estimate less the hold's): past that, the hold can no longer beat
// going at once as its decision priced both, and a hold that runs out has
// lost its time and computes the prompt anyway. A hold for a short shared
// prompt saves little: on llama.cpp's multi-turn bench one for the
// 1,024-token system prompt, predicted to wait 43 ms, ran out at 115 ms
// and its request then took 232 ms to its first token, where its turns
// took 42 ms on average.
const (
	holdSlack    = 0.5
	holdSlackMin = 50 * 1e6 // ns
)

// hold advises waiting for a busy batch slot (d.Hold) on an engine whose
// slots each keep only their own prompt (llama.cpp), where the slot
// running a request with the same prompt prefix frees sooner than the
// best replica computes the prompt again: a burst of requests carrying a
// prompt new to the fleet otherwise computes it once per slot it lands
// in, each computation sharing the engine with the others (the
// one-company workload's first requests: four cold 4,096-token prompts
// at once on one llama.cpp server took 2-4 s each, one alone 0.6 s). A
// waiting request is priced as
//
//	hold_r = max(wait_r, Q_r / P_r) + O_r + (T - c_r H_r) / P_r + the load penalty
//	wait_r = left_r + K_r (O_r + D_r(min(B_r, S_r) - 1))
//
// H_r the blocks the busy slot's prompt shares with the request (the
// promise, HoldAdvice.Shared; priced as what the request would reuse
// anyway plus replica.holdKeptShare of the rest: the share of their
// promise that held requests ending there reused), left_r
// the time until its request ends (the rest of its predicted TTFT, then
// the slot time D_r; after its first token D_r less what it decoded, at
// least D_r / 8), K_r the requests already held for the replica, each of
// which takes the slot first for its own TTFT and decode. The advice is
// to wait where hold_r is at most holdShare of the best ranked estimate.
// With Config.CopyComputed, only for a slot whose request is computing
// the promised prefix: where the prefix is computed in the slot already
// (its request decodes, or found it there), a copy in another slot
// serves the requests after this one too, where waiting for the slot
// makes each of them wait again.
func (p *CostPolicy) hold(v *View, req *Request, cs []costCand, d *Decision) {
	if len(d.Ranked) == 0 {
		return
	}
	now := req.Now
	cands := v.Candidates()
	most := 0.0
	for i := range cands {
		most = max(most, cs[i].cached)
	}
	bt := float64(v.r.bt)
	t := float64(req.PromptTokens)
	if t-most < 2*bt {
		return // at most a block or so left to compute anywhere
	}
	limit := -1.0 // holdShare of the best estimate, once a slot could be held
	bestEst := 0.0
	var best HoldAdvice
	declined := uint64(0) // a computed prefix whose rent is paid (holdRents)
	for i, id := range cands {
		if cs[i].busy == 0 {
			continue // no request running there: no busy slot (this router's are in busy)
		}
		h := v.r.hotOf(id)
		if !h.slotMeasured() {
			continue // the wait would be priced on the default slot time
		}
		rp := v.r.reps[id]
		sc, n := rp.slotModel()
		if sc == nil {
			continue
		}
		sh, ok := sc.holdable(n, req.Hashes, int(most/bt))
		if !ok || p.cfg.CopyComputed && (sh.first != 0 || sh.reused >= sh.shared) {
			continue // none, or the prefix is computed there and a copy is wanted (Config.CopyComputed)
		}
		if limit < 0 {
			if unknownSlots(v) {
				return // the gain is priced on slots the model cannot see
			}
			bestEst = p.bestEst(v, cs, d, now)
			limit = bestEst * holdShare
		}
		e := &cs[i]
		dec := h.slotSecondsAt(float64(max(min(e.busy, int64(n))-1, 0)))
		var left float64
		if sh.first == 0 {
			left = max(float64(sh.start-now)/1e9+sh.pred, 0) + dec
		} else {
			left = max(dec-float64(now-sh.first)/1e9, dec/8)
		}
		wait := left + float64(max(rp.holds.Load(), 0))*(e.over+dec)
		// The promise as far as held requests ending on this replica found
		// it kept, the rest what the request would reuse anyway.
		promised := min(float64(sh.shared)*bt, t)
		reuse := most + rp.holdKeptShare()*max(promised-most, 0)
		unc := max(t-h.confidence()*reuse, 0)
		est := max(wait, e.qinv) + e.over + rp.prefillSeconds(unc, t-unc, e.inv) + e.pen
		if est > limit {
			continue
		}
		var key uint64
		if sh.first != 0 {
			key = req.Hashes[sh.shared-1]
			if req.HoldSince == 0 && v.r.rents.paid(key, now, bestEst-est) {
				declined = key // its waits have come to a copy's cost
				continue
			}
		}
		limit = est
		best = HoldAdvice{Replica: id, Owner: sh.owner, Wait: max(wait, 1e-9), Shared: int(promised), Gain: bestEst - est, gen: rp.gen,
			rentKey: key, at: now}
	}
	if !best.Holding() {
		if declined != 0 {
			v.r.rents.buy(declined, now)
			v.r.holdCopies.Add(1)
		}
		return
	}
	since := req.HoldSince
	if since == 0 {
		since = now
	}
	left := float64(since+int64(p.cfg.SlotHold)-now) / 1e9
	if best.Wait >= left {
		return // the wait would outlast the longest hold
	}
	slack := min(holdSlack*best.Wait+holdSlackMin/1e9, best.Gain)
	best.Until = now + int64(min(best.Wait+slack, left)*1e9)
	d.Hold = best
}

// unknownSlots says whether a candidate's engine may hold prompts in idle
// slots the model cannot see (slotCache.unknownIdle): a hold's gain is
// the cost of computing the prompt elsewhere, and such a slot may hold
// it already.
func unknownSlots(v *View) bool {
	for _, id := range v.Candidates() {
		if sc, n := v.r.reps[id].slotModel(); sc != nil && sc.unknownIdle(n) {
			return true
		}
	}
	return false
}

// bestEst is the lowest estimate among the ranked candidates (keepTurn may
// have put one up to a quarter dearer first).
func (p *CostPolicy) bestEst(v *View, cs []costCand, d *Decision, now int64) float64 {
	b := math.Inf(1)
	for i, id := range v.Candidates() {
		if slices.Contains(d.Ranked, id) {
			b = min(b, cs[i].est(v.r.hotOf(id), now))
		}
	}
	return b
}

// turnLookback is how many blocks back from a prompt's end keepTurn looks
// for the block its previous turn ended with: the answer and the new
// question between them, up to 2,048 tokens at 64-token blocks.
const turnLookback = 32

// keepTurnSlack is how much longer than the best a kept turn's estimate
// may be, in parts of the best: 0.25, a quarter more.
const keepTurnSlack = 0.25

// keepTurn puts a conversation's later turn back on the replica that
// served its previous turn (Router.takeTurn) when that replica's engine
// caches whole prompts per batch slot (slot mode: llama.cpp), no other
// replica is predicted to hold more than a block more of the turn's
// prompt, and its estimate is within keepTurnSlack of the best's.
//
// Such an engine keeps a few whole prompts (one per slot, and a host
// cache of some more), and every conversation passing through pushes
// one out. Left to the estimate alone, a turn whose history is gone
// everywhere goes to the least loaded replica, and one whose history is
// still at home but behind a queue of slot waiters goes where a slot is
// free; over many conversations every replica serves every conversation,
// each holds a smaller share of their histories, and leaving a replica
// costs less and less because less is left there: the churn feeds
// itself. Kept where it was, a conversation meets fewer others, and its
// history is there more often for its next turn (the simulator's
// llama.cpp fleet at 80% load: hit rate 0.66 to 0.72, mean TTFT 0.80 to
// 0.67 s). Engines with paged caches are left to the estimate: their
// caches keep the shared blocks of many conversations, and keeping turns
// there made TTFT worse where the cache was small (affinity/README.md).
func (p *CostPolicy) keepTurn(v *View, req *Request, cs []costCand, d *Decision) {
	hs := req.Hashes
	if len(d.Ranked) == 0 || len(hs) < 2 || v.r.slotReps.Load() == 0 {
		return
	}
	id := NoReplica
	for j := len(hs) - 2; j >= max(0, len(hs)-1-turnLookback); j-- {
		if r, ok := v.r.takeTurn(hs[j]); ok {
			id = r
			break
		}
	}
	if id == NoReplica || d.Ranked[0] == id {
		return
	}
	cands := v.Candidates()
	at, best := -1, -1
	for i := 0; i < len(cands) && (at < 0 || best < 0); i++ {
		switch cands[i] {
		case id:
			at = i
		case d.Ranked[0]:
			best = i
		}
	}
	if at < 0 || best < 0 || !v.r.reps[id].slotMode.Load() {
		return
	}
	e := &cs[at]
	bt := float64(v.r.bt)
	for i := range cs {
		if cs[i].cached > e.cached+bt {
			return
		}
	}
	eb := cs[best].est(v.r.hotOf(d.Ranked[0]), req.Now)
	if e.est(v.r.hotOf(id), req.Now) > eb+keepTurnSlack*eb {
		return
	}
	if i := slices.Index(d.Ranked, id); i > 0 {
		copy(d.Ranked[1:i+1], d.Ranked[:i])
	} else {
		d.Ranked = append(d.Ranked[:len(d.Ranked)-1], 0)
		copy(d.Ranked[1:], d.Ranked)
	}
	d.Ranked[0] = id
	v.r.turnsKept.Add(1)
}

// score prepares every candidate's estimate: cs[i] holds candidate i's
// terms, and its estimate is cs[i].est(h, now), h its hot record. The
// estimate is the same float64 the formula above gives, summed in the
// order written; only the term max(slotWait_r, backlog_r) is left to est,
// the one term that needs divisions of the replica's pending sums, so a
// candidate whose estimate without it (lower) cannot rank is never
// computed in full (rankPruned).
func (p *CostPolicy) score(v *View, req *Request) (cs []costCand, lowest int) {
	cfg := &p.cfg
	t := float64(req.PromptTokens)
	tpos := max(t, 0) // T - c_r C_r where C_r = 0: nothing to discount (c_r is in [0, 1])
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
	// and every term of its estimate but X_r, which needs N and whether
	// the prefix's homes are all full (both known only after the pass),
	// and max(slotWait_r, backlog_r) (est). A candidate caching nothing
	// counts toward N whatever the best hit is; those caching something
	// (hs, usually few) are looked at again once the best is known.
	cs = v.costScratch(len(cands))
	hs := v.holders[:0]
	best := 0.0
	home := -1 // a candidate whose match ends at a finished request's tail
	var (
		l                Load
		pl               poolTerms
		coldQueued, cold int64
	)
	hot := v.r.hot
	for i, id := range cands {
		// Router.hotOf, the array hoisted
		h := &hot[uint32(id)/hotChunk][uint32(id)%hotChunk]
		c := 0.0 // C_r
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
		if c > best { // max(best, c): c is never NaN or -0
			best = c
		}
		if f := h.fleetPrefill; f != pl.f || !pl.set {
			pl.load(f, cfg.LoadPenaltySeconds)
		}
		s := h.slotsWith(pl.slots)
		// queueLoad's figures, read straight into locals: while the
		// engine signals are stale they add nothing (Load.Busy,
		// otherWaiting and KVUsage are the router's counts and 0).
		inFlight := int(h.totalInFlight())
		pendReqs := int(max(h.totalPendingReqs(), 0))
		busy, other, kvUsage, kvInv := inFlight, 0, 0.0, 0.0
		if at := h.sigAt.Load(); at != 0 && now-at <= maxAge {
			h.queueLoadSlots(&l, s, now, maxAge)
			busy, other, kvUsage, kvInv = l.Busy(), l.otherWaiting(), l.KVUsage, l.kvInvCap
		}
		// repHot.prefill, with the pool's line and its inverse read once
		// per pool
		var over, inv float64
		if pl.priced && !h.ownLine() {
			over, inv = pl.over, pl.inv
		} else {
			over, inv = loadF(&h.overhead), 1/loadF(&h.rate)
		}
		e := &cs[i]
		e.cached = c
		e.queuedReqs = int64(queuedRequests(pendReqs, other))
		e.busy = int64(busy)
		e.slots = s
		e.over = over
		e.unc = tpos
		if c != 0 {
			e.unc = max(t-h.confidencePool(&pl)*c, 0)
			hs = append(hs, int32(i))
		} else {
			coldQueued += e.queuedReqs
			cold++
		}
		e.inv = inv
		e.own = e.unc * inv
		if pl.shaped && h.ownLine() { // prefillSeconds, the pool's shape read once
			e.own = v.r.reps[id].speed() * pl.shape.seconds(e.unc, t-e.unc)
		}
		e.qinv = queuedTokens(int(max(h.totalPending(), 0)), other, loadF(&h.uncachedAvg)) * inv
		e.pen = pl.pen * float64(busy) * h.invWeight
		// U_r with what this request adds: its uncached tokens' share of
		// the engine's KV capacity (where the engine or spec gives one)
		u := kvUsage + e.unc*kvInv
		e.kv = u > cfg.KVHighWater
		if e.kv {
			e.kvPen = cfg.KVPenaltySeconds * (u - cfg.KVHighWater) / (1 - cfg.KVHighWater)
		}
		e.phase, e.phased = 0, false
		e.full, e.fullSet, e.backlogSet = false, false, false
	}
	v.holders = hs
	// A continuation's decision prices busy requests at what they were
	// measured to cost (β_r), without the LoadPenaltySeconds floor, on
	// every candidate, while its home has batch slots for as many again
	// (roomAtHome). The floor is a balancing force for prefixes many
	// requests want (a greedy per-request TTFT never pays to replicate
	// one, and the prefix's first holder takes the whole fleet's
	// traffic); the history a conversation's next turn continues is
	// wanted by that turn alone, so there the floor only moved turns off
	// their replica to recompute their history elsewhere for a load
	// difference the engine does not feel.
	if home >= 0 && roomAtHome(&cs[home], v.r.hotOf(cands[home])) {
		for i, id := range cands {
			h := &hot[uint32(id)/hotChunk][uint32(id)%hotChunk]
			cs[i].pen = h.busyCost() * float64(cs[i].busy) * h.invWeight
		}
	}
	// The typical prefill queue a recompute joins: the mean over the
	// candidates not holding the prefix (less than half the best hit).
	// Whether every home is full: the first home that is not decides it,
	// so usually one home is looked at.
	homesFull := best > 0
	for _, i := range hs {
		if e := &cs[i]; e.cached < best/2 || best == 0 {
			coldQueued += e.queuedReqs
			cold++
		} else if homesFull && !e.isFull(v.r.hotOf(cands[i]), now) {
			homesFull = false
		}
	}
	// The step's phase chooses only among the candidates it is what they
	// wait for, and that would compute as little as the best (a replica
	// holding less is left for what it holds, not for where its step is):
	// with no prefill queued ahead (the running step may be that prefill:
	// its end is not the clock's) and a free batch slot. Where every one
	// of them is in the first half of its step, the phases are taken less
	// the lowest, so the first of them never looks dearer than without the
	// term: a replica alone in that set (a conversation's home) can only
	// gain by it, never be left for where another replica's step is. The
	// clock is read (the hot record's last line) only for those, and only
	// once some stream has taught a replica a step (Router.stepClocks).
	// Past one block of hit only holders compute as little as the best.
	minPhase, phased := math.Inf(1), false
	if !cfg.NoStepPhase && v.r.stepClocks.Load() {
		price := func(i int) {
			if e := &cs[i]; e.stepPhase(v.r.hotOf(cands[i]), best, bt, now) {
				minPhase, phased = min(minPhase, e.phase), true
			}
		}
		if best > bt {
			for _, i := range hs {
				price(int(i))
			}
		} else {
			for i := range cs {
				price(i)
			}
		}
	}
	if phased && minPhase > 0 {
		for i := range cs {
			if e := &cs[i]; e.phased {
				e.phase -= minPhase
			}
		}
	}
	typical := 0.0
	if cold > 0 {
		typical = float64(coldQueued) / float64(cold)
	}
	for i := range cs {
		e := &cs[i]
		x := float64(e.queuedReqs) // 1 + max(N_r, N): neither is NaN or -0
		if typical > x {
			x = typical
		}
		e.x = 1 + x
		if homesFull && !e.isFull(v.r.hotOf(cands[i]), now) {
			e.x = 1
		}
		// The estimate with max(slotWait_r, backlog_r) as 0 and without
		// the KV penalty: every term is at least 0 and rounding is
		// monotonic, so est is at least the same sum; lowered by 1e-12 of
		// itself, far more than the few roundings a compiler fusing a
		// multiply-add differently in the two sums could move either.
		e.low = e.over + e.qinv + e.x*e.own + e.pen + e.phase
		e.low -= lowMargin * math.Abs(e.low)
		if e.low < cs[lowest].low {
			lowest = i
		}
	}
	return cs, lowest
}

// lowMargin is how far, in parts of itself, costCand.low is put below the
// estimate's rounding.
const lowMargin = 1e-12

// stepPhase prices the running step's phase (stepClock.phaseAdj) for a
// candidate it is what it waits for, and that would compute as little as
// the best: no prefill queued ahead, a free batch slot, at most a block
// less cached than the best hit. It reports whether it did.
func (e *costCand) stepPhase(h *repHot, best, bt float64, now int64) bool {
	if e.cached >= best-bt && e.queuedReqs == 0 && (e.slots == 0 || e.busy < e.slots) {
		e.phase, e.phased = h.step.phaseAdj(now, e.busy), true
		return true
	}
	return false
}

// roomAtHome reports whether the continuation candidate e has batch
// slots for as many requests again as it has, besides the new one: below
// half of its known limit, or of the running count its scrapes suggest a
// limit at (slotRisk's evidence), or with no sign of a limit. Near a
// limit the floor stays: turns kept at homes that fill their batches
// make the next turns there wait for decodes to finish (the simulator's
// 16-slot engines, their limit configured, at 80-95% load: mean TTFT 6-7%
// worse without this test).
func roomAtHome(e *costCand, h *repHot) bool {
	need := 2 * (e.busy + 1)
	if e.slots > 0 {
		return need <= e.slots
	}
	if v := int64(h.runSeen.Load()); v < 0 {
		return need <= -v
	}
	return true
}

// isFull reports whether a new request on the replica would wait for others
// to finish: every batch slot is taken, or its pending requests are behind
// their predictions (backlog, replica.backlog at the decision's time) by
// more than the TTFT the model predicts for a new one (queueing the model
// has not learned yet, such as a batch limit before any scrape showed it).
// Computed once, with the candidate's backlog.
func (e *costCand) isFull(h *repHot, now int64) bool {
	if e.fullSet {
		return e.full
	}
	e.fullSet = true
	if e.slots > 0 && e.busy >= e.slots {
		e.full = true
		return true
	}
	b := e.backlogAt(h, now)
	if b > 0 {
		rate, over := h.prefill()
		e.full = b > h.predictWithSlots(rate, over, 0, e.slots, now)
	}
	return e.full
}

// backlogAt is the candidate's replica.backlog at now, computed once.
func (e *costCand) backlogAt(h *repHot, now int64) float64 {
	if !e.backlogSet {
		e.backlogSet = true
		e.backlog = h.backlog(now)
	}
	return e.backlog
}

// est is the candidate's estimate (the formula above).
func (e *costCand) est(h *repHot, now int64) float64 {
	pre := e.over + max(h.slotRisk(e.slots, e.busy, now), e.backlogAt(h, now)) + e.qinv
	est := pre + e.x*e.own + e.pen + e.phase
	if e.kv {
		est += e.kvPen
	}
	return est
}

// rankPruned is View.RankLowest over the cost policy's candidates, each
// estimate computed only when its lower bound (costCand.low) could still
// rank: a candidate whose bound is above the k-th best score so far would
// be skipped by RankLowest's first test anyway, so the ranking, ties
// included, is RankLowest's over every estimate. The candidate with the
// lowest bound goes first so that the k-th best score is low early; the
// result does not depend on the order (scores and tie values give a total
// order: mixID is a bijection).
func (v *View) rankPruned(cs []costCand, lowest int, d *Decision) {
	k := min(v.r.cfg.MaxRanked, len(v.cands))
	v.top = v.top[:0]
	salt := v.Random()
	now := v.req.Now
	v.offer(cs, lowest, k, salt, now)
	for i := range cs {
		if i != lowest && (len(v.top) < k || !(cs[i].low > v.top[k-1].score)) {
			v.offer(cs, i, k, salt, now)
		}
	}
	for _, it := range v.top {
		d.Ranked = append(d.Ranked, it.id)
	}
}

// offer is RankLowest's step for candidate i of cs, its estimate computed.
func (v *View) offer(cs []costCand, i, k int, salt uint64, now int64) {
	id := v.cands[i]
	if s := cs[i].est(v.r.hotOf(id), now); len(v.top) < k || !(s > v.top[k-1].score) { // insertTop's first test, without the call
		v.top = insertTop(v.top, k, s, id, salt)
	}
}

// costCand is one candidate's part of a CostPolicy decision.
type costCand struct {
	cached     float64 // predicted cached tokens
	queuedReqs int64   // N_r
	busy       int64   // B_r
	slots      int64   // S_r
	over       float64 // O_r
	unc        float64 // T - c_r C_r, at least 0
	inv        float64 // 1 / P_r
	own        float64 // the request's own prefill there: (T - c_r C_r) / P_r, or the engine's shape (prefillSeconds)
	qinv       float64 // Q_r / P_r
	pen        float64 // the load penalty
	phase      float64 // the wait for the running step, against the average (stepClock.phaseAdj)
	kvPen      float64 // the KV penalty, when kv
	x          float64 // X_r
	low        float64 // the estimate without max(slotWait_r, backlog_r) and the KV penalty
	backlog    float64 // backlog_r, when backlogSet
	kv         bool    // U_r is past KVHighWater
	full       bool    // when fullSet
	fullSet    bool
	backlogSet bool
	phased     bool // phase priced (the step's phase, in score)
}

// Interface guards.
var (
	_ Policy  = (*CostPolicy)(nil)
	_ Retuner = (*CostPolicy)(nil)
)
