package affinity

import (
	"math"
	"sync"
	"sync/atomic"
)

// The per-replica TTFT model the cost policy ranks with, learned from what
// the router observes:
//
//	ttft_r(x, B) = O_r + slotWait_r(B) + x / P_r
//	slotWait_r(B) = B >= S_r ? (B - S_r + 1) * D_r / S_r : 0
//
// x the prefill tokens ahead of and including the request's own uncached
// tokens, B the requests already on the replica, S_r its batch slots (the
// engine's max_num_seqs, llama.cpp's total_slots), D_r the mean time a
// request holds its slot after its first token (its decode; the prefill
// before it is in x), O_r and P_r the fitted overhead and prefill rate. Queued
// prefill and the wait for a batch slot are separate terms: a request
// waiting for a slot waits for others to finish decoding, however little of
// its prompt is uncached. Where the engine reports its prefill timings and
// they depend on the context a prefill extends (attention), the request's
// own uncached tokens are priced with that shape instead of at P_r
// (prefillshape.go).
//
// Where each input comes from, most precise first:
//
//	S_r  ReplicaSpec.BatchSlots > EngineSignals.BatchSlots (llama.cpp /props)
//	     > learned: the largest running count seen, once scrapes show
//	     requests waiting at it (learnSlots); 0 = unknown, no slot term
//	D_r  EWMA of each finished request's decode time: the engine's own
//	     decode timing where it reports one (llama.cpp `timings`), else
//	     last token - first token (streamed), else the whole duration
//	     minus the predicted TTFT (buffered), less γ times the
//	     prefill the engine ran for others meanwhile; priced drawn
//	     toward its pool's (slotSeconds); before its first sample, the
//	     router's fleet mean, else defaultSlotSeconds. Kept
//	     as the time alone on the engine, each sample divided by
//	     1 + σ x (x the requests it shared the engine with); a full batch
//	     holds its slots D_r (1 + σ (S_r - 1)): slotSecondsAt
//	γ    the share of the others' prefill a decode waits through, fitted
//	     with σ (fleetPrefill.sampleSlotLoad); about 1 on llama.cpp
//	σ    the pool's relative slot-time slope per request sharing the
//	     engine (fleetPrefill.sampleSlotLoad): a one-core llama.cpp server
//	     decodes each token of four running requests 7-8x slower than of
//	     one; a GPU engine's steps barely slow with the batch; 0 until the
//	     samples show it
//	P_r  the engine's reported prefill rate (llama.cpp prompt_n, prompt_ms,
//	     over its prefill busy periods: sampleEngineRate; in the router's
//	     tokens) when it reports one, else the pool's
//	     line through clean samples (requests that met no queue and a surely
//	     free slot, their uncached tokens the engine's count in the router's
//	     tokens: fleetPrefill.sampleClean), else the mean of the replicas'
//	     robust fits below
//	O_r  the fit's intercept; with known slots, the mean over requests that
//	     met no queue (one whose prefill met prefills begun after it may
//	     lower it, never raise it)
//
// Beside the model, what it leaves unexplained is fitted against B:
//
//	β    the slope of a line through (B, measured TTFT - ttft_r) over the
//	     streamed requests of the replica's pool that found a free slot
//	     (fleetPrefill.sampleBusy): what each request sharing the engine
//	     adds to a new first token (tens of ms on a one-core llama.cpp
//	     server, a fraction of a ms on the simulator's GPU engines); 0
//	     until learned. The cost policy prices each busy request at
//	     max(LoadPenaltySeconds, β).
//
// Every prediction made at Begin is compared with the measured TTFT at End
// (EWMA of |ln((pred+f)/(actual+f))|, f a small floor, and a histogram of
// the ratio, for metrics and backlog's slack); every predicted cache hit
// with the engine's reported one (confidence): a replica whose hits do not
// materialise leans toward load balance until they do. Requests still waiting for their first
// token past their predictions (backlog) make a replica count as full
// before any of them finishes.

const (
	// defaultSlotSeconds is D_r before a replica's first measured slot time.
	defaultSlotSeconds = 1.0
	// unknownSlotShare weighs the slot wait slotRisk prices where no limit
	// is known, until requests that met the suspected one measured how
	// much of it they waited (fleetPrefill.riskShare): even odds that the
	// next request finds one.
	unknownSlotShare = 0.5
	// slotRiskSeen, slotRiskShare: how many observations at a replica's
	// largest running count (scrapes running it, requests that found it:
	// sawAtMax), and what share of them, must show a request waiting
	// before slotRisk prices a possible limit there.
	slotRiskSeen  = 2
	slotRiskShare = 0.1
	// riskMin, riskWeight: requests that met a suspected limit before the
	// waits they measured set the share of it slotRisk prices, and the
	// EWMA weight of one (about the last ten).
	riskMin    = 4
	riskWeight = 0.1
	// earlyHitMin: first-token judgements of predicted hits before they
	// give a pool's confidence (sampleEarlyHit).
	earlyHitMin = 4
	// slotWeight is the EWMA weight of a slot-time sample.
	slotWeight = 0.1
	// slotRefWeight: the reference σ's samples are measured against
	// (replica.slotRef) remembers about 100 slot times.
	slotRefWeight = 0.01
	// slotLearnRepeat: scrapes showing requests waiting at the largest
	// running count seen that make it the learned slot count (learnSlots).
	slotLearnRepeat = 2
	// slotLearnWaiting: the fewest waiting requests that show a full batch;
	// one can be a request that arrived between two engine steps.
	slotLearnWaiting = 2
	// errWeight is the EWMA weight of a TTFT prediction error sample.
	errWeight = 0.05
	// fleetWeight is the EWMA weight of a fit update in fleetPrefill.
	fleetWeight = 0.05
	// engineRateMinTokens: engine prefill timings of fewer tokens are too
	// coarse (ms resolution) to give a rate.
	engineRateMinTokens = 16
	// engineRateWeight: the engine rate's sums remember about 10 samples.
	engineRateWeight = 0.1
	// engineLineWeight, engineLineMin: the engine's prefill line remembers
	// about 100 busy periods, and gives a rate from its 8th on.
	engineLineWeight = 0.01
	engineLineMin    = 8
)

// slotOwnWeight is the weight of a replica's own slot time against its
// pool's (slotSeconds): ownWeight at its samples' memory, as for the
// overhead and the engine rate (overheadShrunk, engineRateShrunk).
var slotOwnWeight = ownWeight(1 / slotWeight)

// ttftErrBuckets are the upper bounds of the actual/predicted TTFT ratio
// histogram (warmpath_affinity_ttft_prediction_ratio).
var ttftErrBuckets = [...]float64{0.125, 0.25, 0.5, 0.8, 1.25, 2, 4, 8}

// ttftModel is one replica's learned state besides the prefill fit (which
// lives in replica.fit under fitMu) and what decisions read (repHot).
type ttftModel struct {
	errEWMA     atomic.Uint64 // float64 bits: mean |ln ratio| of TTFT predictions (errSlack is hot)
	cleanN      int           // intercept samples without queueing (under replica.fitMu)
	ownOver     float64       // the replica's own intercept, before overheadShrunk (under replica.fitMu)
	streamed    int           // streamed answers sampled (under replica.fitMu)
	pendBaseSet bool          // repHot.pendBase is set (Router write lock)

	// The engine-reported prefill rate's state (sampleEngineRate, under
	// replica.fitMu): the open prefill busy periods, their decaying sums of
	// tokens and seconds, and the line through them (its n counts them;
	// engLineOK: it gives the rate).
	engTok, engSec float64
	engLine        moments
	engLineOK      bool
	engPer         enginePeriods
	// shapeN, shapeLog: the periods compared with the pool's prefill
	// shape and the EWMA of ln(measured / shape's): the replica's speed
	// against its pool's (prefillshape.go), published in
	// replica.shapeSpeed.
	shapeN, shapeLog float64

	learnMu     sync.Mutex
	maxRunning  int64 // the most requests any scrape saw running
	prevRunning int64 // the previous scrape's running count
	fullAtMax   int   // scrapes with requests waiting at maxRunning
	atMax       int   // observations at maxRunning, KV not full: scrapes running it, streamed requests that found it (sawAtMax)
	waitAtMax   int   // of those, ones with a request waiting (a scrape's waiting count, a late first token)

	// Prediction accounting for metrics: sums in seconds (float64 bits,
	// CAS-added) and the ratio histogram.
	predSum, actSum, ratioSum atomic.Uint64
	ratioHist                 [len(ttftErrBuckets) + 1]atomic.Uint64
}

// slots is S_r: the spec's, else the engine's, else the learned count.
func (p *repHot) slots() int64 {
	pool := int64(0)
	if f := p.fleetPrefill; f != nil {
		pool = f.slots.Load()
	}
	return p.slotsWith(pool)
}

// slotsWith is slots with its pool's limit given (pool: f.slots).
func (p *repHot) slotsWith(pool int64) int64 {
	if p.specSlots > 0 {
		return int64(p.specSlots)
	}
	if s := p.slotsSig.Load(); s > 0 {
		return int64(s)
	}
	if s := p.slotsLearned.Load(); s > 0 || p.fleetPrefill == nil {
		return int64(s)
	}
	// The pool's limit, unless this replica has run more than it.
	if pool > 0 && pool >= p.maxRunSeen() {
		return pool
	}
	return 0
}

// poolTerms is what a cost decision reads of one pool (fleetPrefill) once
// for all the candidates in it, instead of once per candidate: the
// pool's priced line and its inverse, the load penalty's unit, its batch
// slots and confidence prior. The values are the ones repHot.prefill,
// busyCost, slots and confidence would return from the same reads.
type poolTerms struct {
	f         *fleetPrefill
	set       bool    // f was loaded (nil is a pool too: none)
	priced    bool    // the pool's line prices its replicas (prefill)
	over, inv float64 // its overhead and 1 / rate, when priced
	pen       float64 // max(LoadPenaltySeconds, β)
	slots     int64   // the pool's batch-slot limit
	conf      float64 // confidence before a replica's own fitMinSamples
	shaped    bool    // the pool's prefill shape prices (shape): prefillSeconds
	shape     shapePrice
}

// load reads f's terms, lps the configured LoadPenaltySeconds.
func (pl *poolTerms) load(f *fleetPrefill, lps float64) {
	*pl = poolTerms{f: f, set: true, conf: 1}
	bc := 0.0
	if f != nil {
		if f.n.Load() != 0 {
			pl.priced, pl.over, pl.inv = true, loadF(&f.over), 1/loadF(&f.rate)
		}
		bc = loadF(&f.busyCost)
		pl.slots = f.slots.Load()
	}
	pl.conf = poolConfidence(f)
	if f != nil {
		pl.shape, pl.shaped = f.shapeC.load()
	}
	pl.pen = max(lps, bc)
}

// confidencePool is confidence with p's pool read into pl (pl.f ==
// p.fleetPrefill).
func (p *repHot) confidencePool(pl *poolTerms) float64 {
	if p.hitN.Load() < fitMinSamples {
		return pl.conf
	}
	return min(max(loadF(&p.hitReal), 0), 1)
}

// slotSeconds is D_r, the slot time (decode) alone on the engine: the
// replica's own estimate drawn toward its pool's, weight slotOwnWeight on
// its own; before its first sample, its pool's, else the fleet's (the
// mean measured on any replica of this router), else
// defaultSlotSeconds. Slot times come in bursts (a request that met a
// burst of cold prompts decodes for seconds, alone for a tenth of one)
// and an estimate of a replica's own moves only with its
// traffic: identical llama.cpp servers ended bench rounds with their own
// at 0.52 and 0.10 s, and the one whose last samples were a burst's, full
// like the other at the next burst, looked the later to free a slot for
// every request of it. It is read only where the batch is full (and at
// End), so the pool's mean is read at decision time, and a replica
// whose own estimate its traffic no longer moves follows its pool.
func (p *repHot) slotSeconds() float64 {
	d, m := loadF(&p.slotSec), 0.0
	if f := p.fleetPrefill; f != nil {
		m = loadF(&f.slotMean)
	}
	switch {
	case d > 0 && m > 0:
		return slotOwnWeight*d + (1-slotOwnWeight)*m
	case d > 0:
		return d
	case m > 0:
		return m
	}
	if p.fleetSlot != nil {
		if d := loadF(p.fleetSlot); d > 0 {
			return d
		}
	}
	return defaultSlotSeconds
}

// slotMeasured reports whether slotSeconds comes from measured slot times
// (the replica's own, its pool's or the fleet's) rather than the default.
func (p *repHot) slotMeasured() bool {
	if loadF(&p.slotSec) > 0 || p.fleetPrefill != nil && loadF(&p.fleetPrefill.slotMean) > 0 {
		return true
	}
	return p.fleetSlot != nil && loadF(p.fleetSlot) > 0
}

// slotSecondsAt is the slot time of a request sharing the engine with x
// others: D_r times slotGrowth.
func (p *repHot) slotSecondsAt(x float64) float64 {
	return p.slotSeconds() * p.slotGrowth(x)
}

// slotGrowth is 1 + σ x, how much longer than alone a request holds its
// slot sharing the engine with x others, at most slotGrowthMax.
func (p *repHot) slotGrowth(x float64) float64 {
	if s := p.fleetPrefill.slotLoad(); s > 0 && x > 0 {
		return min(1+s*x, slotGrowthMax)
	}
	return 1
}

// slotGrowthMax bounds slotGrowth: the clip of a slot-time sample
// (sampleSlot) around D_r's prediction for it.
const slotGrowthMax = 8

// slotWait is the expected wait at now for a batch slot of a request
// joining a replica with busy requests already on it: it needs busy-S+1
// slots to free; without a request of this router there to date the
// batch by, slots free at S/D per second.
func (p *repHot) slotWait(busy, now int64) float64 {
	return p.slotWaitSlots(p.slots(), busy, now)
}

// slotRisk is the slot wait the cost policy prices, s = p.slots():
// slotWait where the limit is known; where it is not, but observations at
// the most requests the replica ever ran (scrapes, and requests that found
// that many: sawAtMax) show requests waiting often (at least slotRiskSeen
// times and slotRiskShare of them: runSeen < 0), the share of the wait a
// limit there would cause that requests meeting it measured
// (fleetPrefill.riskShare: a count that was no limit is priced next to
// nothing once they came on time). A small-batch
// engine whose full batch scrapes catch with requests waiting too seldom to
// learn a limit (learnSlots wants two or more waiting, twice) otherwise
// takes a fifth request onto four that decode for seconds while other
// replicas sit idle. An engine without a limit shows a request waiting at
// its largest batch only now and then (an arrival between two steps) and is
// priced no wait. A replica without that evidence takes the count last
// found on a replica of its pool, unless it has run more.
func (p *repHot) slotRisk(s, busy, now int64) float64 {
	if s > 0 {
		return p.slotWaitSlots(s, busy, now)
	}
	return p.fleetPrefill.riskShare() * p.suspectedWait(busy, now)
}

// riskLimit is the running count slotRisk suspects a limit at for a
// request that finds busy others on p, its limit unknown: the replica's
// own where its waits there were frequent, else its pool's where busy
// reaches the most p ran; 0 = none.
func (p *repHot) riskLimit(busy int64) int64 {
	v := int64(p.runSeen.Load())
	switch {
	case v < 0:
		return -v
	case busy >= v && p.fleetPrefill != nil: // a pool count below v does not apply
		if fh := p.fleetPrefill.slotsHint.Load(); fh >= v {
			return fh
		}
	}
	return 0
}

// suspectedSlots is the count riskLimit suspects a limit at for any
// number of requests found, while the limit is unknown; 0 = none.
func (p *repHot) suspectedSlots() int64 {
	if p.slots() > 0 {
		return 0
	}
	return p.riskLimit(math.MaxInt64)
}

// riskProbe is the wait for a batch slot a request that finds busy others
// on p would meet were the limit the count slotRisk suspects, where the
// limit is unknown and busy reaches that count; 0 otherwise. End compares
// it with the wait the request measured (fleetPrefill.sampleRisk).
func (p *repHot) riskProbe(busy, now int64) float64 {
	if p.slots() > 0 {
		return 0
	}
	return p.suspectedWait(busy, now)
}

// suspectedWait is the whole wait for a batch slot a request that finds
// busy others on p would meet were the limit the count riskLimit
// suspects; 0 where none is suspected or busy is below it.
func (p *repHot) suspectedWait(busy, now int64) float64 {
	h := p.riskLimit(busy)
	if h <= 0 || busy < h {
		return 0
	}
	return p.slotWaitSlots(h, busy, now)
}

// slotSurelyFree reports whether a request that found busy others on p
// found a batch slot free: none was busy, or fewer than the slot limit or
// than the most requests a scrape saw running there. Where the limit is
// unknown, a request past that count may have waited for decodes to
// finish, however short its prefill.
func (p *repHot) slotSurelyFree(busy int64) bool {
	return busy == 0 || busy < max(p.slots(), p.maxRunSeen())
}

// maxRunSeen is the most requests any scrape saw running on p.
func (p *repHot) maxRunSeen() int64 {
	v := int64(p.runSeen.Load())
	return max(v, -v)
}

// slotWaitSlots is slotWait with S_r given (s = p.slots()), scaled by
// what the pool's measured waits taught (fleetPrefill.waitScale).
func (p *repHot) slotWaitSlots(s, busy, now int64) float64 {
	if s <= 0 || busy < s {
		return 0
	}
	return p.fleetPrefill.waitScale() * p.slotWaitRaw(s, busy, now)
}

// slotWaitRaw is slotWaitSlots before the pool's scale.
func (p *repHot) slotWaitRaw(s, busy, now int64) float64 {
	// The running requests share a full batch: each with s-1 others.
	d := p.slotSecondsAt(float64(s - 1))
	k := float64(busy - s + 1)
	n := p.decN.Load()
	// This router's requests there still in prefill (up to the slots the
	// decoding ones leave) have their decodes, the slot time, all ahead
	// of them: they count at age 0.
	m := n + min(max(p.pendingReqs.Load(), 0), max(s-n, 0))
	if m <= 0 {
		// Nothing of this router's there to date the batch by.
		return k * d / float64(s)
	}
	// The running requests free their slots over the time they have left:
	// on average the slot time less how long they have decoded, so the
	// k-th of S slots to free does so after about k of S+1 spans of twice
	// that (order statistics of uniform leftovers); those a slot frees for
	// later take whole slot times. A replica whose batch is about to finish
	// is nearer a free slot than one whose batch just started, however
	// many requests each holds.
	age := 0.0
	if n > 0 {
		mean := float64(now-p.pendBase.Load())/1e9 - float64(p.decStart.Load())/float64(n)/1e9
		age = mean * float64(n) / float64(m)
	}
	left := min(max(d-age, d/8), d)
	first := min(k, float64(s))
	return first*2*left/float64(s+1) + (k-first)*d/float64(s)
}

// confidence is how far the cost policy trusts p's predicted cache hits:
// the share of its predicted cached tokens the engine really reported
// cached, recently (EWMA of min(actual / predicted, 1) over requests with a
// predicted hit; 1 before fitMinSamples of them). A replica whose hits do
// not materialise (an index ahead of the engine, llama.cpp's per-slot
// caches) has its predicted hits discounted, so its decisions lean toward
// load balance until its predictions come true again.
//
// Before fitMinSamples of its own it takes its pool's (the share over
// every replica serving its model): replicas of one model run one engine
// configuration, and a replica whose first requests have not finished (a
// burst still queued there) otherwise counted on hits that never come,
// looked cheapest, and took the rest of the burst too.
func (p *repHot) confidence() float64 {
	if p.hitN.Load() < fitMinSamples {
		return poolConfidence(p.fleetPrefill)
	}
	return min(max(loadF(&p.hitReal), 0), 1)
}

// poolConfidence is the confidence of a replica of pool f without
// fitMinSamples of its own.
func poolConfidence(f *fleetPrefill) float64 {
	if f != nil {
		if f.hitN.Load() >= fitMinSamples {
			return min(max(loadF(&f.hitReal), 0), 1)
		}
		if f.earlyN.Load() >= earlyHitMin {
			return min(max(loadF(&f.earlyReal), 0), 1)
		}
	}
	return 1
}

// sampleEarlyHit judges, at its first token, whether a streamed request's
// predicted hit came true, while its pool has too few finished requests to
// say (the engine reports cached tokens only with the last chunk, seconds
// later): a first token nearer (in ratio) the TTFT the model predicts
// without the hit than the one it predicted with it counts as a miss. Only
// requests with no prefill queued ahead are judged, so queueing the model
// did not predict does not read as a miss. Until the pool's own hit record
// starts, these judgements give the confidence once earlyHitMin of them
// are in: an engine without prefix caching otherwise had every request of
// a start-up burst trust hits that never came and pile onto the replicas
// that had seen the prefix.
func (p *replica) sampleEarlyHit(f *Flight) {
	fp := p.fleetPrefill
	if fp == nil || f.buffered || f.queued != 0 || f.slotWait > 0 || fp.hitN.Load() >= fitMinSamples {
		return
	}
	// Not a request that may have waited for a slot (a known limit, or a
	// count at which the engine was seen queueing): that wait would read
	// as a miss.
	if b := int64(f.busy); b > 0 {
		if s := p.slots(); s > 0 && b >= s || s <= 0 && p.runSeen.Load() < 0 && b >= p.maxRunSeen() {
			return
		}
	}
	c := float64(f.predCached)
	if c <= 0 || !(f.predTTFT > 0) {
		return
	}
	// predTTFT priced the hit at Begin's confidence (PromptTokens -
	// UncachedTokens of its c tokens): the TTFTs with all of it and
	// with none, so that a confidence already low still learns.
	rate, _ := p.prefill()
	withHit := max(f.predTTFT-(c-float64(f.PromptTokens-f.UncachedTokens))/rate, p.errFloor())
	without := withHit + c/rate
	dt := float64(f.FirstTokenAt-f.Start) / 1e9
	x := 1.0
	if dt*dt > withHit*without {
		x = 0
	}
	if fp.earlyN.Add(1) == 1 {
		storeF(&fp.earlyReal, x)
		return
	}
	ewma(&fp.earlyReal, x, 0.25)
}

// sampleHit folds one request's realised share of its predicted hit.
func (p *replica) sampleHit(predicted, actual int) {
	if predicted <= 0 || actual < 0 {
		return
	}
	x := min(float64(actual)/float64(predicted), 1)
	if f := p.fleetPrefill; f != nil {
		if f.hitN.Add(1) == 1 {
			storeF(&f.hitReal, x)
		} else {
			ewma(&f.hitReal, x, errWeight)
		}
	}
	if p.hitN.Add(1) == 1 {
		storeF(&p.hitReal, x)
		return
	}
	ewma(&p.hitReal, x, errWeight)
}

// learnSlots takes one scrape's running and waiting counts. A batch-slot
// limit has a crisp signature: requests wait while the running count is at
// the most the engine has ever run, and it never runs more. The token
// budget and KV space also make requests wait, but at running counts below
// ones already seen, or while the running count still climbs. So requests
// waiting at the largest running count seen so far, at slotLearnRepeat
// scrapes or at one that follows a scrape running as many (a plateau), set
// the learned limit, and a scrape running more than it withdraws it.
// Scrapes whose KV usage is past KVHighWater say nothing: there KV space
// is what holds requests back.
func (p *replica) learnSlots(running, waiting int, kvFree bool) {
	if running <= 0 {
		return
	}
	m := &p.model
	m.learnMu.Lock()
	defer m.learnMu.Unlock()
	prev := m.prevRunning
	m.prevRunning = int64(running)
	if int64(running) > m.maxRunning {
		m.maxRunning, m.fullAtMax = int64(running), 0
		p.runSeen.Store(clamp32(m.maxRunning))
		p.slotsLearned.Store(0)
		m.atMax, m.waitAtMax = 0, 0
	}
	if kvFree && int64(running) == m.maxRunning {
		// slotRisk's evidence: how often a request waits at this count.
		// Once found it stays until a scrape runs more: where the price
		// works, the policy keeps requests off the count and the queue
		// that was the evidence goes with them, so a quiet spell there
		// says nothing.
		p.sawAtMax(waiting > 0)
	}
	if waiting >= slotLearnWaiting && kvFree && int64(running) == m.maxRunning {
		// A plateau (the scrape before ran as many) counts as a repeat.
		if m.fullAtMax++; m.fullAtMax >= slotLearnRepeat || prev == m.maxRunning {
			p.slotsLearned.Store(clamp32(m.maxRunning))
			if p.fleetPrefill != nil {
				p.fleetPrefill.slots.Store(m.maxRunning)
			}
		}
	}
}

// sawAtMax counts one observation at the replica's largest running count
// (learnMu held), waited says whether a request waited there, and marks a
// possible limit at that count for slotRisk once waits are frequent enough.
func (p *replica) sawAtMax(waited bool) {
	m := &p.model
	m.atMax++
	if waited {
		m.waitAtMax++
	}
	if m.waitAtMax >= slotRiskSeen && float64(m.waitAtMax) >= slotRiskShare*float64(m.atMax) {
		p.runSeen.Store(-clamp32(m.maxRunning))
		if f := p.fleetPrefill; f != nil {
			f.slotsHint.Store(m.maxRunning)
		}
	}
}

// sampleLateFirst is slotRisk's evidence from a streamed request's first
// token, where the limit is unknown: one that found at least the largest
// running count any scrape saw already on the replica (busy) is an
// observation at that count, and it waited there if its first token came
// past its prediction (pred, seconds; dt the measured TTFT) by the model's
// usual error and by half the wait the first of that many slots to free
// would take. Scrapes, a second apart, catch an engine with its batch full
// and requests waiting too seldom to show the limit of a small-batch
// engine at moderate load; every request that met the limit shows it.
// With the KV cache past its high water (kvFree false) a late first token
// says nothing: KV space holds requests back there, as in learnSlots.
func (p *replica) sampleLateFirst(busy int64, dt, pred float64, kvFree bool) {
	v := p.maxRunSeen()
	if v <= 0 || busy < v || !kvFree || p.slots() > 0 || !(pred > 0) {
		return
	}
	late := dt > p.errSlackNow()*pred+p.errFloor() && dt-pred >= p.slotSecondsAt(float64(v-1))/float64(2*(v+1))
	m := &p.model
	m.learnMu.Lock()
	defer m.learnMu.Unlock()
	if m.maxRunning == v {
		p.sawAtMax(late)
	}
}

// backlog is how far the oldest of this router's requests still awaiting
// a first token on p is behind its prediction at now, beyond the model's
// usual error: the queueing the model has not explained (a batch limit not
// learned yet, a stalled engine), seen before any of them finishes. The
// oldest, not the mean: a burst just sent to a late replica would pull a
// mean down, as if its queue had shrunk, and draw the next requests there
// too; requests served in order wait at least as long behind the oldest.
// It counts as late past exp(2e) times its prediction, e the replica's
// mean |ln(actual/predicted)| (its predictions' usual spread), plus the
// error floor. 0 when it is on time.
func (p *repHot) backlog(now int64) float64 {
	h := p.pendHead.Load()
	if h == 0 {
		return 0
	}
	age := float64(now-p.pendBase.Load()-(h-1)) / 1e9
	pred := float64(p.pendHeadPred.Load()) / 1e9
	return max(age-p.errSlackNow()*pred-p.errFloor(), 0)
}

// errSlackNow is the factor past which a first token counts as late
// against its prediction: exp(2e) (errSlack) once fitMinSamples
// predictions are checked, 1 before.
func (p *repHot) errSlackNow() float64 {
	if p.errN.Load() >= fitMinSamples {
		return loadF(&p.errSlack)
	}
	return 1
}

// errFloor is the absolute slack in comparing predicted and measured TTFTs:
// 2 ms plus a tenth of the fitted overhead.
func (p *repHot) errFloor() float64 { return 0.002 + 0.1*loadF(&p.overhead) }

// fleetPrefill is the router's view of a typical replica's prefill model,
// the rate and overhead a replica without a measured rate of its own is
// priced with (repHot.prefill): the pool's clean line once it is
// identifiable (sampleClean), before that the geometric mean of the
// replicas' fitted rates (rates span orders of magnitude and a sparse fit
// can be far off, so their logs are averaged) and their mean overhead,
// both EWMAs over fit updates of any replica. A replica that has served
// nothing yet is priced with it: with a fixed prior slower than the fleet
// really is, a replica added to a warm fleet (a scale-up, or one the first
// requests happened to miss) looks slow, is never chosen, and so never
// learns otherwise.
type fleetPrefill struct {
	logRate, meanOver atomic.Uint64 // float64 bits: the replicas' fits' mean
	// rate, over: float64 bits, what decisions price with (a decision
	// reads them per candidate); written under mu.
	rate, over atomic.Uint64
	n          atomic.Uint64
	// slots: the batch-slot limit last learned on any replica of the pool
	// (learnSlots), the limit of a replica that has not shown its own.
	slots atomic.Int64
	// slotsHint: the running count at which a replica of the pool last
	// showed requests waiting often (slotRisk); 0 = none.
	slotsHint atomic.Int64
	// riskWait, riskGot, riskN: float64 bits, EWMAs of the slot wait
	// riskProbe put on streamed requests that found a replica of the pool
	// at a suspected limit and of the wait they measured, and how many fed
	// them (sampleRisk): their ratio is the share of that wait slotRisk
	// prices (riskShare).
	riskWait, riskGot atomic.Uint64
	riskN             atomic.Int64
	// hitReal, hitN: the realised share of predicted hits over every
	// replica of the pool (replica.confidence before a replica's own).
	hitReal, hitN atomic.Uint64
	// earlyReal, earlyN: the same judged at first tokens, before hitN
	// has fitMinSamples (sampleEarlyHit).
	earlyReal, earlyN atomic.Uint64

	// busyCost: float64 bits, β, the TTFT each request already on a
	// replica of the pool adds to a new one's (busyFit; 0 until known).
	busyCost atomic.Uint64
	// waitLog: float64 bits, the log of the factor the pool's slot waits
	// are priced at (sampleWait; 0: as slotWaitSlots computes them).
	waitLog atomic.Uint64
	// slotSlope: float64 bits, σ, the relative growth of a slot time per
	// request sharing the engine (sampleSlotLoad; 0 until known).
	slotSlope atomic.Uint64
	// slotMean: float64 bits, the EWMA of the pool's slot-time samples
	// (as the time alone), what a replica's own is drawn toward.
	slotMean atomic.Uint64
	// slotPrefill: float64 bits, γ, the share of the others' prefill time
	// that a decode waits through (sampleSlotLoad; 0 until known).
	slotPrefill atomic.Uint64
	// shapeC: the pool's prefill shape as decisions price it
	// (prefillshape.go), fitted in shape under mu over every replica's
	// engine-reported prefill periods.
	shapeC shapeCoefs

	// mu orders the writers of rate and over, and guards clean, the
	// pool's line over clean samples (cleanOK: that line gives them),
	// busyFit and slotFit.
	mu      sync.Mutex
	clean   cleanFit
	cleanOK bool
	busyFit boundedLine
	slotFit slotPlane // the slot-time fit (sampleSlotLoad), under mu
	shape   prefillShape
}

// waitScale is the factor slot waits are priced at on the pool's
// replicas: 1 until sampleWait has measured otherwise, and for a replica
// without a pool.
//
// The wait for a slot is priced from a full batch's slot time (D_r grown
// by σ, slotSecondsAt) and how long the running batch has run; this
// factor corrects what that price still misses, as measured. Priced from
// D_r alone (a mean over light and busy moments), requests that found all
// four slots of the live bench's CPU llama.cpp servers taken were
// predicted 132 ms on average and took 199 ms. On engines that batch for
// free the measured waits match the priced ones and it stays near 1.
// Learned only with Config.LearnSlotWaits.
func (f *fleetPrefill) waitScale() float64 {
	if f == nil {
		return 1
	}
	if l := loadF(&f.waitLog); l != 0 {
		return math.Exp(l)
	}
	return 1
}

// waitWeight is the EWMA weight of one slot-wait sample (sampleWait), and
// waitRatioClip bounds one sample's ratio either way; the factor itself
// stays within [1/2, 8].
const (
	waitWeight    = 0.1
	waitRatioClip = 4
)

// riskShare is the share of a suspected limit's slot wait slotRisk
// prices on pool f: once riskMin requests met such a limit, the wait they
// measured over the wait it would have caused (1 where every one of them
// waited as predicted, near 0 where the count was no limit), at most 1;
// unknownSlotShare before.
func (f *fleetPrefill) riskShare() float64 {
	if f == nil || f.riskN.Load() < riskMin {
		return unknownSlotShare
	}
	w := loadF(&f.riskWait)
	if !(w > 0) {
		return unknownSlotShare
	}
	return min(max(loadF(&f.riskGot)/w, 0), 1)
}

// sampleRisk takes a streamed request that found a replica of pool f at
// a suspected limit: probe the wait riskProbe gave it, got the TTFT it
// measured past its prediction without that wait.
func (f *fleetPrefill) sampleRisk(probe, got float64) {
	if f == nil || !(probe > 0) || math.IsNaN(got) {
		return
	}
	// Clipped as sampleWait clips: one stall does not price a limit.
	got = min(max(got, 0), waitRatioClip*probe)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.riskN.Add(1) == 1 {
		storeF(&f.riskWait, probe)
		storeF(&f.riskGot, got)
		return
	}
	w, g := loadF(&f.riskWait), loadF(&f.riskGot)
	storeF(&f.riskWait, w+riskWeight*(probe-w))
	storeF(&f.riskGot, g+riskWeight*(got-g))
}

// sampleWait folds in one request that was priced a slot wait of pred
// seconds (scaled) and waited measured: its TTFT less the rest of its
// prediction. The factor moves by waitWeight of the log of their ratio,
// so a wait priced right leaves it where it is.
func (f *fleetPrefill) sampleWait(pred, measured float64) {
	if f == nil || !(pred > 0) || math.IsNaN(measured) {
		return
	}
	r := min(max(measured/pred, 1/float64(waitRatioClip)), waitRatioClip)
	f.mu.Lock()
	defer f.mu.Unlock()
	l := loadF(&f.waitLog) + waitWeight*math.Log(r)
	storeF(&f.waitLog, min(max(l, math.Log(0.5)), math.Log(8)))
}

func (f *fleetPrefill) sample(rate, over float64) {
	if !(rate > 0) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n.Load() == 0 {
		storeF(&f.logRate, math.Log(rate))
		storeF(&f.meanOver, over)
	} else {
		ewma(&f.logRate, math.Log(rate), fleetWeight)
		ewma(&f.meanOver, over, fleetWeight)
	}
	if !f.cleanOK {
		storeF(&f.rate, math.Exp(loadF(&f.logRate)))
		storeF(&f.over, loadF(&f.meanOver))
	}
	// Counted last: readers take the pool's rate once n is above 0.
	f.n.Add(1)
}

// sampleClean folds one clean sample into the pool's line: a request that
// met no prefill queued ahead, no slot wait and a free slot, its uncached
// tokens the engine's count converted into the router's
// (Outcome.inRouterTokens), its TTFT. Once the line is identifiable it
// gives the pool's rate and overhead, in place of the mean of the
// replicas' fits. Those fits take every request, with the prefill queued
// ahead as the router estimated it: the estimate's error flattens their
// slopes (regression dilution), so they read the prefill too fast, and
// their memory of about 20 samples leaves the slope to noise where most
// requests are cache hits of a few hundred tokens. An engine's first
// answers (its warm-up) are not offered (cleanWarmup): in the plain
// average of the line's first samples one of them bends it for hundreds.
func (f *fleetPrefill) sampleClean(tokens, sec float64) {
	if !(sec > 0) || tokens < 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if rate, over, ok := f.clean.add(tokens, sec); ok {
		storeF(&f.rate, rate)
		storeF(&f.over, over)
		f.n.Add(1)
		f.cleanOK = true
	}
}

// sampleBusy folds one streamed request into the pool's busy line: x the
// requests on its replica when it began, y its TTFT less the model's
// prediction (the residual the model left); measuredRate: the replica's
// prefill rate is configured or engine-reported.
// The line's slope is β (busyCost), published once the line has
// busyMinSamples with some spread in x, kept in [0, slotSec]: a request
// sharing the engine cannot delay a new one by more than its whole time
// there (the caller's bound). The intercept is not used (the overhead's error, whatever the
// load, lands there, not in β).
func (f *fleetPrefill) sampleBusy(busy, resid, slotSec float64, measuredRate bool) {
	if !(busy >= 0) || math.IsNaN(resid) || math.IsInf(resid, 0) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Only once the prefill term is a measurement (configured, reported by
	// the engine, or the pool's clean line): before it, the model's error
	// is its rate prior's, which shrinks as the first requests teach it,
	// while the load climbs; that drift reads as a slope (25 ms on the
	// simulator's GPU engines, whose true β is 0.2 ms).
	if !measuredRate && !f.cleanOK {
		return
	}
	// The slope's lower confidence bound (boundedLine): the TTFT model's
	// own error drifts while it learns (a burst at start-up: the first,
	// lightly loaded requests far over their predictions, later busier
	// ones not), and that drift reads as a slope; with the bound, only an
	// effect the samples show clearly prices load.
	beta, _, ok := f.busyFit.add(busy, resid)
	if !ok {
		return
	}
	storeF(&f.busyCost, min(max(beta, 0), max(slotSec, 0)))
}

// boundedLine is a least-squares line (weight busyWeight per sample, about
// 50 samples of memory) whose slope is published at its lower confidence
// bound: the slope less busySE standard errors (the line's residual spread
// over the samples' effective count). Callers hold fleetPrefill.mu.
type boundedLine struct {
	m  moments
	yy float64 // the mean y*y, weighted as m
}

// add folds (x, y) in and returns the slope's lower bound and the
// intercept (of the fitted slope), ok once the line has busyMinSamples
// and x varies by more than busyMinVar.
func (l *boundedLine) add(x, y float64) (slope, intercept float64, ok bool) {
	m := &l.m
	m.add1(x, y, busyWeight)
	l.yy += max(1/m.n, busyWeight) * (y*y - l.yy)
	varx := m.mxx - m.mx*m.mx
	if m.n < busyMinSamples || !(varx > busyMinVar) {
		return 0, 0, false
	}
	b := (m.mxy - m.mx*m.my) / varx
	nEff := min(m.n, 2/busyWeight-1)
	res := max(l.yy-m.my*m.my-b*b*varx, 0)
	return b - busySE*math.Sqrt(res/(nEff*varx)), m.my - b*m.mx, true
}

// slotLoad is σ (sampleSlotLoad); 0 for a replica without a pool.
func (f *fleetPrefill) slotLoad() float64 {
	if f == nil {
		return 0
	}
	return loadF(&f.slotSlope)
}

// slotPrefillShare is γ (sampleSlotLoad); 0 for a replica without a pool.
func (f *fleetPrefill) slotPrefillShare() float64 {
	if f == nil {
		return 0
	}
	return loadF(&f.slotPrefill)
}

// sampleSlotLoad folds one finished request into the pool's slot-time
// fit: x the requests it shared the engine with (replica.sharedDuring), z
// the others' prefill the engine ran while it decoded (seconds at P_r),
// and y its slot time, z and y over its replica's slow reference
// (replica.slotRef). σ is the fit's x coefficient over its intercept (the
// relative growth per request), at its lower confidence bound as β's
// (sampleBusy): only a growth the samples show clearly prices a full
// batch dearer. γ is its z coefficient (the share of the others' prefill
// the decode waited through: about 1 where a prefill holds up the
// engine's steps, as on llama.cpp, 0 where decodes run beside it) where
// its lower bound is above 0, else 0: what it takes off a slot-time
// sample is what the fit shows, and at its lower bound (0.2-0.7 on
// llama.cpp servers whose decodes wait through all of it) it left the
// bursts' prefill in D_r. Same memory and thresholds as the busy line.
func (f *fleetPrefill) sampleSlotLoad(x, z, y float64) {
	if f == nil || !(x >= 0) || !(z >= 0) || !(y > 0) || math.IsInf(y, 0) || math.IsInf(z, 0) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fit, ok := f.slotFit.add(x, z, y)
	if !ok {
		return
	}
	// With γ taken, σ is the plane's; without, the samples D_r gets keep
	// the others' prefill, and σ is the line's in x alone, which carries
	// what of it moves with x.
	b, a, gamma := fit.bx, fit.ax, 0.0
	if fit.plane && fit.cLo > 0 {
		b, a, gamma = fit.b, fit.a, min(fit.c, 1)
	}
	sigma := 0.0
	if b > 0 && a > 0 {
		sigma = min(b/a, slotLoadMax)
	}
	storeF(&f.slotSlope, sigma)
	storeF(&f.slotPrefill, gamma)
}

// planeFit is what slotPlane.add returns: the plane's x coefficient at
// its lower bound (b), z coefficient and its lower bound (c, cLo) and
// intercept (a), when plane (z varies apart from x), and the line's in x
// alone (bx at its lower bound, ax).
type planeFit struct {
	b, c, cLo, a float64
	plane        bool
	bx, ax       float64
}

// slotPlane is a weighted least-squares fit of y = a + b x + c z (the
// busy line's memory), for the pool's σ and γ (sampleSlotLoad). The two
// causes come together (a burst both shares the engine and prefills
// beside the decodes), so each coefficient is taken with the other in
// the fit; where z does not vary (nothing prefilled during decodes) or
// moves with x, the fit is the line in x alone and c is 0.
type slotPlane struct {
	line              boundedLine // the x-y line, and the moments of x and y
	mz, mzz, mxz, mzy float64
}

// slotPlaneCollinear: the fit takes z only while x and z share less
// than 95% of their variance (det over Sxx Szz above 0.05).
const slotPlaneCollinear = 0.05

// add folds (x, z, y) in and returns the fits (slopes at their lower
// confidence bounds: busySE standard errors off), ok once it has
// busyMinSamples and x varies by more than busyMinVar.
func (l *slotPlane) add(x, z, y float64) (fit planeFit, ok bool) {
	fit.bx, fit.ax, ok = l.line.add(x, y)
	m := &l.line.m
	w := max(1/m.n, busyWeight) // the weight line.add gave the sample
	l.mz += w * (z - l.mz)
	l.mzz += w * (z*z - l.mzz)
	l.mxz += w * (x*z - l.mxz)
	l.mzy += w * (z*y - l.mzy)
	if !ok {
		return planeFit{}, false
	}
	sxx, szz, sxz := m.mxx-m.mx*m.mx, l.mzz-l.mz*l.mz, l.mxz-m.mx*l.mz
	sxy, szy, syy := m.mxy-m.mx*m.my, l.mzy-l.mz*m.my, l.line.yy-m.my*m.my
	det := sxx*szz - sxz*sxz
	if szz > 0 && det > slotPlaneCollinear*sxx*szz {
		nEff := min(m.n, 2/busyWeight-1)
		b := (szz*sxy - sxz*szy) / det
		c := (sxx*szy - sxz*sxy) / det
		res := max(syy-b*sxy-c*szy, 0) / nEff
		fit.plane = true
		fit.b, fit.c, fit.a = b-busySE*math.Sqrt(res*szz/det), c, m.my-b*m.mx-c*l.mz
		fit.cLo = c - busySE*math.Sqrt(res*sxx/det)
	}
	return fit, true
}

// slotLoadMax bounds σ: a request sharing the engine with one other holds
// its slot at most slotGrowthMax times as long.
const slotLoadMax = slotGrowthMax - 1

const (
	// busyWeight: the busy line remembers about 50 samples, so β follows
	// a change of load pattern within a minute at a few requests/s.
	busyWeight = 0.02
	// busyMinSamples, busyMinVar: samples, and variance of the busy count
	// (0.04: one request in 25 found another there), before β is given.
	busyMinSamples = 16
	busyMinVar     = 0.04
	// busySE: standard errors taken off the busy line's slope.
	busySE = 2
)

// busyCost is β for p: the TTFT each request already on the replica adds
// to a new one's, learned over p's pool (fleetPrefill.sampleBusy); 0
// without a pool or before the pool's line gives it.
func (p *repHot) busyCost() float64 {
	if f := p.fleetPrefill; f != nil {
		return loadF(&f.busyCost)
	}
	return 0
}

// cleanFit is an exponentially weighted least-squares line through clean
// samples (tokens, seconds): a plain average over the first
// 1/cleanWeight samples, then a memory of about that many. Its slope is
// the prefill time per token only where the tokens spread enough (std at
// least fitSpread of the mean) and it is positive; the intercept is kept
// in [0, mean seconds].
type cleanFit struct {
	moments
	rate, over float64 // the line last published; rate 0 before
}

// clip keeps *y within fitClip of the line (rate, over)'s prediction for
// x, where that prediction is positive.
func (c *cleanFit) clip(x float64, y *float64, rate, over float64) {
	if !(rate > 0) {
		return
	}
	if pred := over + x/rate; pred > 0 {
		*y = min(max(*y, pred/fitClip), pred*fitClip)
	}
}

const (
	// cleanWeight: a pool's clean line remembers about 200 samples.
	cleanWeight = 0.005
	// cleanMinSamples: clean samples before the line gives a rate.
	cleanMinSamples = 32
)

func (c *cleanFit) add(x, y float64) (rate, over float64, ok bool) {
	// One sample moves the line only so far: within fitClip of its
	// prediction (a request held up by what the filter missed).
	c.clip(x, &y, c.rate, c.over)
	c.add1(x, y, cleanWeight)
	b, ok := c.slope(cleanMinSamples)
	if !ok {
		return 0, 0, false
	}
	rate = min(max(1/b, rateFloor), rateCeil)
	c.rate, c.over = rate, min(max(c.my-c.mx/rate, 0), c.my)
	return c.rate, c.over, true
}

// ownPrefill is p's own prefill rate and overhead: its configured,
// engine-reported or fitted ones once it has them, else the fleet's
// (fleetPrefill), else the configured default rate. The fit starts from
// and updates these.
func (p *repHot) ownPrefill() (rate, over float64) {
	if !p.fitted.Load() {
		if r, o, ok := p.fleetModel(); ok {
			return r, o
		}
	}
	return loadF(&p.rate), loadF(&p.overhead)
}

// fleetModel is the pooled prefill rate and overhead of the replicas that
// serve p's model, when any of them has been fitted.
func (p *repHot) fleetModel() (rate, over float64, ok bool) {
	if p.fleetPrefill == nil || p.fleetPrefill.n.Load() == 0 {
		return 0, 0, false
	}
	return loadF(&p.fleetPrefill.rate), loadF(&p.fleetPrefill.over), true
}

// prefill is the prefill rate and overhead the cost policy prices p with:
// its configured rate or the rate its engine reports (llama.cpp's timings:
// a measurement), else
// the pooled model of the replicas serving p's model (fleetModel), else
// ownPrefill. A replica's own fitted line is not identifiable under load:
// its samples carry queueing and batched steps, rates fitted on identical
// engines differ by orders of magnitude, and a replica fitted slow while it
// was busy gets no traffic to correct it, so its decisions follow noise.
// The pooled model (fleetPrefill) is one line through every replica's
// clean samples, else the mean of their fits; differences in speed
// between replicas still show in their backlog (pending requests later
// than predicted), their slot times and their load.
//
// Written out (ownPrefill takes the pool's model only before its own fit,
// and prefers it otherwise too unless the rate is a measurement) so that
// it inlines into the cost policy's loop.
func (p *repHot) prefill() (rate, over float64) {
	if f := p.fleetPrefill; f != nil && f.n.Load() != 0 && !p.ownLine() {
		return loadF(&f.rate), loadF(&f.over)
	}
	return loadF(&p.rate), loadF(&p.overhead)
}

// ownLine says whether p's prefill is priced with its own line even
// where its pool has one: a configured or engine-reported rate, fitted.
func (p *repHot) ownLine() bool {
	return (p.specRate || loadF(&p.engRate) > 0) && p.fitted.Load()
}

// predictTTFT is the model's TTFT for a request with unc uncached tokens
// after ctx cached ones joining p now (without the cost policy's
// externality and penalties): its own prefill priced as the cost policy
// does (prefillSeconds).
func (p *replica) predictTTFT(unc, ctx float64, now int64) float64 {
	rate, over := p.prefill()
	return p.predictWith(rate, over, 0, now) + p.prefillSeconds(unc, ctx, 1/rate)
}

// predictWith is predictTTFT with the given prefill rate and overhead.
func (p *repHot) predictWith(rate, over, unc float64, now int64) float64 {
	return p.predictWithSlots(rate, over, unc, p.slots(), now)
}

// predictWithSlots is predictWith with S_r given (s = p.slots()).
func (p *repHot) predictWithSlots(rate, over, unc float64, s, now int64) float64 {
	return over + p.slotWaitSlots(s, p.totalInFlight(), now) +
		(float64(max(p.totalPending(), 0))+unc)/rate
}

// clamp32 is n as an int32, saturated.
func clamp32(n int64) int32 { return int32(min(max(n, -1<<31), 1<<31-1)) }

// casAddF adds d to the float64 in a.
func casAddF(a *atomic.Uint64, d float64) {
	for {
		old := a.Load()
		if a.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

// checkPrediction folds one (predicted, measured) TTFT pair into p's error.
func (p *replica) checkPrediction(pred, actual float64) {
	if !(pred > 0) || !(actual > 0) {
		return
	}
	m := &p.model
	floor := p.errFloor()
	e := math.Abs(math.Log((pred + floor) / (actual + floor)))
	if p.errN.Add(1) == 1 {
		storeF(&m.errEWMA, e)
		storeF(&p.errSlack, math.Exp(2*e))
	} else {
		ewma(&m.errEWMA, e, errWeight)
		storeF(&p.errSlack, math.Exp(2*loadF(&m.errEWMA)))
	}
	casAddF(&m.predSum, pred)
	casAddF(&m.actSum, actual)
	ratio := actual / pred
	casAddF(&m.ratioSum, ratio)
	i := 0
	for i < len(ttftErrBuckets) && ratio > ttftErrBuckets[i] {
		i++
	}
	m.ratioHist[i].Add(1)
}

// sampleSlot folds one request's slot time sec, shared with x other
// requests on the engine while it prefilled others' prompts for pre
// seconds, into D_r (as the time alone: (sec - γ pre) / slotGrowth(x))
// and, with fit, the pool's σ and γ, each sample clipped to within 8x of
// what D_r predicts for it (a stalled stream does not swamp it). A
// buffered answer's pre is unknown (its first token is its last): it is
// no sample of σ and γ.
func (p *replica) sampleSlot(sec, x, pre float64, fit bool) {
	if !(sec > 0) || math.IsInf(sec, 0) {
		return
	}
	if !(pre > 0) || math.IsInf(pre, 0) {
		pre = 0
	}
	gamma := p.fleetPrefill.slotPrefillShare()
	if fit && loadF(&p.slotSec) > 0 {
		at := p.slotSecondsAt(x) + gamma*pre
		sec = min(max(sec, at/8), at*8)
		// Over the slower reference: D_r follows the load of its last
		// ten samples, and over it a slowly changing load would show no
		// growth at all.
		ref := loadF(&p.slotRef)
		p.fleetPrefill.sampleSlotLoad(x, pre/ref, sec/ref)
	}
	alone := max(sec-gamma*pre, sec/8) / p.slotGrowth(x)
	ewma(&p.slotSec, alone, slotWeight)
	if loadF(&p.slotRef) > 0 {
		ewma(&p.slotRef, alone, slotRefWeight)
	} else {
		storeF(&p.slotRef, alone)
	}
	if p.fleetSlot != nil {
		ewma(p.fleetSlot, alone, slotWeight)
	}
	if f := p.fleetPrefill; f != nil {
		ewma(&f.slotMean, alone, slotWeight)
	}
}

// sampleEngineRate folds an engine-reported prefill (tokens, and the
// seconds up to the request's first token at ft, the router's clock) into
// P_r's engine estimate. An engine that prefills several slots' prompts in
// the same batch steps (llama.cpp) reports each request's prefill as the
// wall time of the steps it was in: four cold 4,096-token prompts begun
// within a second on one server each report 1-2.5 s, a third of the
// server's real 6,000 tokens/s. And a short prompt costs a whole step
// however few its tokens (60 new tokens after a cached 4,096-token prefix
// take 30-40 ms there: "1,700 tokens/s"). So the samples are the engine's
// prefill busy periods, not requests: the reported prefill intervals are
// merged where they overlap (enginePeriods), and each period, once no
// later prefill can join it, gives (its tokens, its length). The rate is
// the slope of a line through those (seconds = a + tokens / rate; a, the
// steps' fixed cost, is in the TTFT model's overhead), with a long memory
// so that the occasional long prompt keeps it identifiable; until it is
// (a spread of tokens), the ratio of the periods' decaying sums of tokens
// and seconds. Each period's seconds are clipped to within 4x of the
// current estimate's. Each closed period also feeds the pool's prefill
// shape (prefillshape.go), with its requests' attention pairs and cached
// contexts (ctx: the request's, in the router's tokens) summed.
func (p *replica) sampleEngineRate(tokens, ctx int, sec float64, ft int64) {
	if tokens <= 0 || !(sec > 0) || ft == 0 {
		return
	}
	m := &p.model
	p.fitMu.Lock()
	defer p.fitMu.Unlock()
	// A prefill that ends (its End comes after its decode) up to two of
	// its replica's request times (Begin to End; at least two slot times)
	// after a later one began can still join that one's period. The slot
	// time alone would not do: it leaves out the prefill a decode waits
	// through, and in a burst of cold prompts their Ends come seconds
	// apart.
	grace := int64(2 * max(p.slotSecondsAt(float64(p.totalInFlight())), loadF(&p.holdSec)) * 1e9)
	n, c := float64(tokens), float64(max(ctx, 0))
	nw := enginePeriod{start: ft - int64(sec*1e9), end: ft, tokens: tokens, pairs: shapePairs(n, c), ctx: c, ctxMax: c}
	for _, d := range m.engPer.add(nw, grace) {
		y := float64(d.end-d.start) / 1e9
		m.enginePeriod(p, float64(d.tokens), y)
		m.shapePeriod(p, shapeTermsOf(float64(d.tokens), d.pairs, d.ctx), d.ctxMax, y)
	}
	if m.engLine.n == 0 && tokens >= engineRateMinTokens {
		// No period closed yet: the request's own rate is a start.
		storeF(&p.engRate, min(max(float64(tokens)/sec, rateFloor), rateCeil))
	}
}

// engineRateShrunk is the engine-reported rate P_r is priced with: the
// replica's own estimate (sampleEngineRate) drawn toward its pool's rate
// (fleetPrefill's geometric mean over its replicas' updates) while it rests
// on few busy periods: in log terms, weight n/(n+engineShrinkN) on its
// own, n its periods up to the line's memory. A busy period that shares
// its steps with other slots' decoding reads slower than the server
// prefills alone, so a few periods are noise as much as speed: two
// identical llama.cpp servers ended one bench round at 1,953 and 3,107
// tokens/s, and a burst of a new shared prompt piled onto the one read
// faster while the other had free slots. A replica that really is slower
// still shows it once its own periods outweigh the pool.
// 0 when the engine reports no rate. Callers hold fitMu.
func (p *replica) engineRateShrunk() float64 {
	own := loadF(&p.engRate)
	f := p.fleetPrefill
	if !(own > 0) || f == nil || f.n.Load() == 0 {
		return own
	}
	w := ownWeight(min(p.model.engLine.n, 1/engineLineWeight))
	return math.Exp(w*math.Log(own) + (1-w)*loadF(&f.logRate))
}

// ownWeight is the weight of a replica's own estimate against its pool's
// when it rests on n samples (engineRateShrunk, overheadShrunk).
func ownWeight(n float64) float64 { return n / (n + engineShrinkN) }

// engineShrinkN: the samples after which a replica's own estimate weighs
// as much as its pool's.
const engineShrinkN = 16

// enginePeriod folds one finished prefill busy period (x tokens in y
// seconds) into the engine rate (sampleEngineRate). Callers hold fitMu.
func (m *ttftModel) enginePeriod(p *replica, x, y float64) {
	if x < engineRateMinTokens || !(y > 0) {
		return
	}
	if cur := loadF(&p.engRate); cur > 0 {
		pred := x / cur // the current estimate's seconds for the period
		if m.engLineOK {
			pred += max(m.engLine.my-m.engLine.mx/cur, 0)
		}
		y = min(max(y, pred/4), 4*pred)
	}
	l := &m.engLine
	l.add1(x, y, engineLineWeight)
	w := max(1/l.n, engineRateWeight)
	m.engTok += w * (x - m.engTok)
	m.engSec += w * (y - m.engSec)
	rate := m.engTok / m.engSec
	m.engLineOK = false
	if b, ok := l.slope(engineLineMin); ok && l.my-l.mx*b >= 0 {
		rate, m.engLineOK = 1/b, true
	}
	storeF(&p.engRate, min(max(rate, rateFloor), rateCeil))
}

// enginePeriod is one prefill busy period of an engine: the union of
// overlapping reported prefill intervals (nanoseconds, the router's clock)
// and their tokens, attention pairs and cached context (prefillShape's
// terms, summed over the requests in it).
type enginePeriod struct {
	start, end int64
	tokens     int
	pairs, ctx float64
	ctxMax     float64 // the longest context one of its requests extended
}

// enginePeriods holds the periods that a prefill reported later may still
// join, oldest first: Ends arrive in the order requests finish decoding,
// not in the order their prefills ran.
type enginePeriods struct {
	open [enginePeriodsOpen]enginePeriod
	n    int
	done [enginePeriodsOpen + 1]enginePeriod // add's result, reused
}

// enginePeriodsOpen: periods kept open at most (the oldest is closed
// beyond it).
const enginePeriodsOpen = 8

// add merges [start, end] (tokens) into the open periods and returns those
// that closed: every one that ended more than grace before the latest
// start seen, and the oldest beyond enginePeriodsOpen.
func (e *enginePeriods) add(nw enginePeriod, grace int64) []enginePeriod {
	// Merge with every open period it overlaps (it may bridge several).
	k := 0
	for i := 0; i < e.n; i++ {
		o := e.open[i]
		if o.start <= nw.end && nw.start <= o.end {
			nw.start, nw.end, nw.tokens = min(nw.start, o.start), max(nw.end, o.end), nw.tokens+o.tokens
			nw.pairs, nw.ctx, nw.ctxMax = nw.pairs+o.pairs, nw.ctx+o.ctx, max(nw.ctxMax, o.ctxMax)
			continue
		}
		e.open[k] = o
		k++
	}
	e.n = k
	done := e.done[:0]
	if e.n == len(e.open) {
		done = append(done, e.open[0])
		copy(e.open[:], e.open[1:e.n])
		e.n--
	}
	// Insert in start order.
	i := e.n
	for i > 0 && e.open[i-1].start > nw.start {
		e.open[i] = e.open[i-1]
		i--
	}
	e.open[i] = nw
	e.n++
	latest := e.open[e.n-1].start
	k = 0
	for i := 0; i < e.n; i++ {
		if o := e.open[i]; o.end+grace < latest {
			done = append(done, o)
			continue
		}
		e.open[k] = e.open[i]
		k++
	}
	e.n = k
	return done
}

// TTFTStats is one replica's prediction record for metrics.
type TTFTStats struct {
	Checked          uint64   // predictions compared with a measured TTFT
	PredictedSeconds float64  // sum of predicted TTFTs over them
	ActualSeconds    float64  // sum of measured TTFTs
	MeanLogError     float64  // EWMA of |ln(pred/actual)|
	RatioSum         float64  // sum of actual/predicted ratios
	RatioBuckets     []uint64 // cumulative counts per TTFTRatioBuckets bound
}

// TTFTRatioBuckets are the actual/predicted TTFT ratio histogram's upper
// bounds.
func TTFTRatioBuckets() []float64 { return ttftErrBuckets[:] }

func (p *replica) ttftStats() TTFTStats {
	m := &p.model
	st := TTFTStats{
		Checked:          p.errN.Load(),
		PredictedSeconds: loadF(&m.predSum),
		ActualSeconds:    loadF(&m.actSum),
		MeanLogError:     loadF(&m.errEWMA),
		RatioSum:         loadF(&m.ratioSum),
		RatioBuckets:     make([]uint64, len(ttftErrBuckets)),
	}
	var c uint64
	for i := range ttftErrBuckets {
		c += m.ratioHist[i].Load()
		st.RatioBuckets[i] = c
	}
	return st
}
