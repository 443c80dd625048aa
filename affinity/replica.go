package affinity

import (
	"math"
	"sync"
	"sync/atomic"
)

// One replica as the Router keeps it: the counters policies read on every
// decision, the learned models, and peers' load.

type replica struct {
	// The state every decision reads for each candidate lives in the
	// Router's hot array (Router.hot), one repHot per ReplicaID; its
	// fields and methods are promoted here.
	*repHot

	healthy     atomic.Bool
	draining    atomic.Bool
	maxInFlight int64 // 0 = unlimited

	id       ReplicaID
	gen      uint32
	spec     ReplicaSpec
	weight   float64
	capMax   int // index capacity in blocks (configured or signalled)
	capEff   int // current index capacity, lowered by mispredictions
	sigKVCap atomic.Int64

	mispredicts atomic.Uint64

	fitMu sync.Mutex // End's rate fit
	fit   rateFit

	// The time integral of this router's requests on the replica
	// (loadStep): request-nanoseconds up to loadAt, and the count since.
	// Only differences of the integral are read, so its wrapping (after
	// months at a thousand requests in flight) is harmless.
	loadMu   sync.Mutex
	loadArea int64
	loadAt   int64
	loadN    int64

	// begun counts the uncached prefill tokens this router has begun on
	// the replica: what began between a request's Begin and its first
	// token (Flight.later) shared its prefill, so its time is no clean
	// sample of the replica's overhead (sampleRate).
	begun atomic.Int64
	// prefilled counts the uncached tokens of this router's requests there
	// that had their first token: what the engine prefilled while a
	// request decoded took that time from its decode (sampleRate).
	prefilled atomic.Int64
	// holdSec (float64 bits) is an EWMA of this router's requests' whole
	// time on the replica, Begin to End: how long after a prefill its
	// report may still come (sampleEngineRate's grace).
	holdSec atomic.Uint64

	// slotRef (float64 bits) is a slow EWMA of D_r's samples, what the
	// pool's σ line measures slot times against (sampleSlot).
	slotRef atomic.Uint64

	// pendQ is this router's requests on the replica awaiting their first
	// token, in Begin order (a ring of Begin sequence numbers pendLo up to
	// pendHi; a request that leaves out of order is marked done and
	// dropped once it reaches the front). Its front is the oldest, whose
	// lateness is the backlog (repHot.pendHead).
	pendMu         sync.Mutex
	pendQ          []pendEntry
	pendLo, pendHi uint64

	model ttftModel // the TTFT model's colder state (ttft.go)
	// shapeSpeed: float64 bits, the factor the pool's prefill shape is
	// priced at on this replica (prefillshape.go); 0 bits: 1.
	shapeSpeed atomic.Uint64

	peers []PeerLoad // by peer slot; written under Router.mu (peer.go)

	// The slot model of an engine with per-slot caches (slotcache.go):
	// on while slotMode (spec CacheSlots, or CacheAuto and the engine's
	// signals say so, slotSig).
	slotMode atomic.Bool
	slotSig  atomic.Bool
	slotc    slotCache

	// noCache: the engine keeps nothing between requests (spec CacheNone,
	// or CacheAuto and its signals say prefix caching is off, noCacheSig),
	// so View.match predicts no hit on it.
	noCache    atomic.Bool
	noCacheSig atomic.Bool

	// holds counts the requests callers hold for one of the replica's
	// busy slots (Router.Hold): each takes the slot before a later one.
	holds atomic.Int32
	// holdKept is the share of a hold's promise (Request.HeldFor) that
	// held requests ending here reused (float64 bits, an EWMA; 0 bits:
	// none ended yet, read as 1).
	holdKept atomic.Uint64
}

// holdKeptShare is holdKept, 1 before any held request ended here.
func (p *replica) holdKeptShare() float64 {
	if b := p.holdKept.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// sampleHoldKept takes a held request's end: it reused cached tokens of
// the promised ones.
func (p *replica) sampleHoldKept(cached, promised int) {
	// ewma takes a zero value for no sample yet: a share kept is at least
	// 1e-9, so the first sample is stored as it is and zero means none.
	x := min(float64(max(cached, 0))/float64(promised), 1)
	ewma(&p.holdKept, max(x, 1e-9), holdKeptWeight)
}

// holdKeptWeight is holdKept's EWMA weight: about the last five held
// requests.
const holdKeptWeight = 0.2

// updateSlotMode sets p.slotMode and p.noCache from its spec and signals,
// keeping the Router's counts of replicas in each mode.
func (r *Router) updateSlotMode(p *replica) {
	on := p.spec.CacheModel == CacheSlots || p.spec.CacheModel == CacheAuto && p.slotSig.Load()
	if p.slotMode.Swap(on) != on {
		if on {
			r.slotReps.Add(1)
		} else {
			r.slotReps.Add(-1)
		}
	}
	none := p.spec.CacheModel == CacheNone || p.spec.CacheModel == CacheAuto && p.noCacheSig.Load() && !on
	if p.noCache.Swap(none) != none {
		if none {
			r.noCacheReps.Add(1)
		} else {
			r.noCacheReps.Add(-1)
		}
	}
}

// slotModel is p's slot model and its slot count when it is in slot mode
// with a known count, else nil.
func (p *replica) slotModel() (*slotCache, int) {
	if !p.slotMode.Load() {
		return nil, 0
	}
	n := int(p.slots())
	if n <= 0 {
		return nil, 0
	}
	return &p.slotc, n
}

// repHot is what the cost policy reads of a candidate: four cache lines,
// the first three all it reads while engine signals are stale, the fourth
// the signals and the batch clock. The Router keeps them side by side in
// ID order (Router.hot), so a decision's window of consecutive candidates
// and its prefix holders are read from contiguous memory, three lines a
// candidate while signals are stale. The fields are the state
// itself, not a copy: writers update them as they would a replica's own
// fields (atomics, or under the Router's write lock where noted).
type repHot struct {
	// line 0: load
	inFlight        atomic.Int64
	pending         atomic.Int64  // uncached prefill tokens routed, first token not seen
	pendingReqs     atomic.Int64  // requests routed, first token not seen
	peerInFlight    atomic.Int64  // peers' load (peer.go): sums over peer slots of replica.peers,
	peerPending     atomic.Int64  // kept apart from this router's own counters, which stay
	peerPendingReqs atomic.Int64  // authoritative
	uncachedAvg     atomic.Uint64 // float64 bits: EWMA of uncached tokens per request
	sigAt           atomic.Int64  // 0 = never

	// line 1: the backlog's oldest request and the prefill line
	// The oldest of this router's requests awaiting their first token
	// (replica.pendQ's front): its Begin time after pendBase (the first
	// Begin's) plus 1, 0 = none, and its predicted TTFT in nanoseconds,
	// for backlog.
	pendBase, pendHead, pendHeadPred atomic.Int64
	errN                             atomic.Uint64 // TTFT predictions checked
	errSlack                         atomic.Uint64 // float64 bits: exp(2 errEWMA), backlog's slack
	overhead                         atomic.Uint64 // float64 bits: seconds to a first token besides prefill (rateFit intercept)
	rate                             atomic.Uint64 // float64 bits: prefill tokens/s estimate
	// fleetSlot is the Router's slotSec: every replica's slot-time samples,
	// the prior of a replica without its own.
	fleetSlot *atomic.Uint64

	// line 2: the pool, weight, confidence and batch slots: with line 0,
	// all a cost decision reads of a replica its pool prices
	invWeight float64 // 1 / weight (Router write lock)
	// fleetPrefill is the pooled prefill model of the replicas serving
	// this one's first model (Router.pool): what its prefill is priced
	// with unless the engine reports its own rate (replica.prefill).
	fleetPrefill *fleetPrefill
	hitReal      atomic.Uint64 // float64 bits: realised share of predicted hits (confidence)
	hitN         atomic.Uint64 // requests with a predicted hit and a reported one
	engRate      atomic.Uint64 // float64 bits: engine-reported prefill rate (sampleEngineRate), 0 = none
	slotsSig     atomic.Int32  // engine-reported batch slots; 0 = none
	slotsLearned atomic.Int32  // learned from full-batch scrapes; 0 = none
	// runSeen is ttftModel.maxRunning for readers outside learnMu (the
	// most requests a scrape saw running), negated while scrapes at that
	// count often show a request waiting (slotRisk); maxRunSeen reads
	// the count.
	runSeen   atomic.Int32
	specSlots int16 // ReplicaSpec.BatchSlots, at most 32,767 (Router write lock)
	specRate  bool  // ReplicaSpec.PrefillTokensPerSec > 0 (Router write lock)
	// kvInvCap: float32 bits of 1 / the KV capacity in tokens, the spec's,
	// else the engine's last report (SetSignals); 0 = unknown
	kvInvCap atomic.Uint32
	fitted   atomic.Bool // a configured, engine-reported or fitted rate

	// line 3: the batch clock, engine signals and the step clock
	slotSec atomic.Uint64 // float64 bits: D_r, 0 = no sample yet
	// decStart, decN: the sum of FirstTokenAt (after pendBase) and the
	// count of this router's requests decoding on the replica (first token
	// seen, not ended), for the age of its running batch (slotWait).
	decStart, decN atomic.Int64
	sigKV          atomic.Uint64 // float64 bits
	sigWaiting     atomic.Int32
	sigRunning     atomic.Int32
	sigOwnBusy     atomic.Int32 // this router's and peers' in flight when the engine counted (at most: EngineSignals.Mark)
	sigOwnPend     atomic.Int32 // their requests without a first token then
	step           stepClock    // the engine's steps, seen in streams (stepphase.go)
}

// hotChunk is how many repHot the Router allocates at a time: chunks never
// move, so a replica's pointer into one stays valid as the set grows.
const hotChunk = 64

// hotOf returns replica id's hot state. Callers hold mu.
func (r *Router) hotOf(id ReplicaID) *repHot {
	return &r.hot[uint32(id)/hotChunk][uint32(id)%hotChunk]
}

// newHot returns a zeroed hot slot for replica id, growing the array.
// Callers hold mu for writing.
func (r *Router) newHot(id ReplicaID) *repHot {
	for int(id)/hotChunk >= len(r.hot) {
		r.hot = append(r.hot, new([hotChunk]repHot))
	}
	h := r.hotOf(id)
	*h = repHot{}
	return h
}

// loadStep moves the replica's load integral to now and the count by
// delta (+1 at Begin, -1 at End), returning the integral at now and the
// count before the step. A clock that steps back adds nothing.
func (p *replica) loadStep(now, delta int64) (area, before int64) {
	p.loadMu.Lock()
	if now > p.loadAt {
		p.loadArea += p.loadN * (now - p.loadAt)
		p.loadAt = now
	}
	area, before = p.loadArea, p.loadN
	p.loadN = max(p.loadN+delta, 0)
	p.loadMu.Unlock()
	return area, before
}

func (p *replica) eligible() bool {
	return p.healthy.Load() && !p.draining.Load() && !p.atLimit()
}

// atLimit reports whether this router's requests in flight on p reached
// its MaxInFlight (peers' requests do not count: limits are local).
func (p *replica) atLimit() bool {
	return p.maxInFlight > 0 && p.inFlight.Load() >= p.maxInFlight
}

func loadF(a *atomic.Uint64) float64     { return math.Float64frombits(a.Load()) }
func storeF(a *atomic.Uint64, f float64) { a.Store(math.Float64bits(f)) }

// ewma folds sample into a with weight w, lock-free.
func ewma(a *atomic.Uint64, sample, w float64) {
	for {
		old := a.Load()
		f := math.Float64frombits(old)
		n := f + w*(sample-f)
		if f == 0 {
			n = sample
		}
		if a.CompareAndSwap(old, math.Float64bits(n)) {
			return
		}
	}
}
