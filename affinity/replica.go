package affinity

import (
	"math"
	"sync"
	"sync/atomic"
)

// One replica as the Router keeps it: the counters policies read on every
// decision, the learned models, and peers' load.

type replica struct {
	// Hot: read for every candidate of every decision. The first cache line
	// holds what the cost policy reads when engine signals are stale.
	inFlight    atomic.Int64
	pending     atomic.Int64  // uncached prefill tokens routed, first token not seen
	rate        atomic.Uint64 // float64 bits: prefill tokens/s estimate
	sigAt       atomic.Int64  // 0 = never
	invWeight   float64       // 1 / weight
	maxInFlight int64         // 0 = unlimited
	healthy     atomic.Bool
	draining    atomic.Bool
	pendingReqs atomic.Int64  // requests routed, first token not seen
	uncachedAvg atomic.Uint64 // float64 bits: EWMA of uncached tokens per request
	sigWaiting  atomic.Int64
	sigRunning  atomic.Int64
	sigKV       atomic.Uint64 // float64 bits
	sigOwnBusy  atomic.Int64  // this router's and peers' in flight when the signals were set
	sigOwnPend  atomic.Int64  // their requests without a first token then
	overhead    atomic.Uint64 // float64 bits: seconds to a first token besides prefill (rateFit intercept)

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
	model ttftModel // batch slots, slot time, prediction error (ttft.go)
	// fleetSlot is the Router's slotSec: every replica's slot-time samples,
	// the prior of a replica without its own.
	fleetSlot *atomic.Uint64
	// fleetPrefill is the pooled prefill model of the replicas serving
	// this one's first model (Router.pool): what its prefill is priced
	// with unless the engine reports its own rate (replica.prefill).
	fleetPrefill *fleetPrefill
	fitted       atomic.Bool // a configured, engine-reported or fitted rate

	// Peers' load (peer.go): the sums over peer slots of peers[i], kept
	// apart from this router's own counters, which stay authoritative.
	peerInFlight    atomic.Int64
	peerPending     atomic.Int64
	peerPendingReqs atomic.Int64
	peers           []PeerLoad // by peer slot; written under Router.mu
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
