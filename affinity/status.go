package affinity

import (
	"slices"
)

// Snapshots for /debug and metrics: per-replica status and router counters.

// ReplicaStatus is a snapshot of one replica for /debug and metrics.
type ReplicaStatus struct {
	ID                   ReplicaID
	Name                 string
	Models               []string
	Healthy              bool
	Draining             bool
	Weight               float64
	MaxInFlight          int
	InFlight             int     // this router's requests in flight
	PendingPrefillTokens int     // this router's uncached tokens awaiting prefill
	PeerInFlight         int     // peers' requests in flight (ApplyPeer)
	PeerPendingTokens    int     // peers' uncached tokens awaiting prefill
	PrefillTokensPerSec  float64 // current estimate
	OverheadSeconds      float64 // current estimate of time to first token besides prefill
	CachedBlocks         int     // blocks the index attributes to it
	CapacityBlocks       int     // its index bound (effective)
	Signals              EngineSignals
	Mispredictions       uint64
	BatchSlots           int          // S_r in use: spec, engine or learned; 0 = unknown
	SuspectedBatchSlots  int          // while BatchSlots is 0: the running count a limit is suspected at (slotRisk); 0 = none
	SlotRiskShare        float64      // the share of a suspected limit's wait the cost policy prices (its pool's, as requests meeting it measured)
	SlotSeconds          float64      // D_r as priced: time a request holds a batch slot after its first token (its decode) alone on the engine, drawn toward its pool's
	SlotLoad             float64      // σ: relative growth of the slot time per request sharing the engine (its pool's); 0 = not learned
	SlotPrefillShare     float64      // γ: share of the engine's prefill of others that a decode waits through (its pool's); 0 = not learned
	StepSeconds          float64      // an engine step's length, from the gaps between a stream's events (stepphase.go); 0 = no stream seen
	EnginePrefillRate    float64      // engine-reported prefill tokens/s; 0 = not reported
	PrefillShape         PrefillShape // the engine's prefill shape where it prices the replica's prefills; zero = priced at the rate
	Confidence           float64      // how far the cost policy trusts its predicted hits, 0..1
	BusyCostSeconds      float64      // β: TTFT each request already on it adds to a new one's (its pool's busy line); 0 = not learned
	SlotCaches           bool         // hits predicted by the slot model (CacheSlots, or discovered), not the prefix index
	NoPrefixCache        bool         // no hit predicted: the engine caches nothing (CacheNone, or discovered)
	RAMCacheTokens       int          // slot engines: the size of their host RAM prompt cache as learned from the tokens they reuse; 0 = not learned
	HeldRequests         int          // requests callers hold for one of its busy slots (Router.Hold)
	TTFT                 TTFTStats    // predicted vs measured TTFT
}

// Replicas returns a snapshot of every replica, by ID. It allocates.
func (r *Router) Replicas() []ReplicaStatus {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]ReplicaStatus, 0, len(r.reps))
	for _, p := range r.reps {
		if p == nil {
			continue
		}
		out = append(out, ReplicaStatus{
			ID:                   p.id,
			Name:                 p.spec.Name,
			Models:               slices.Clone(p.spec.Models),
			Healthy:              p.healthy.Load(),
			Draining:             p.draining.Load(),
			Weight:               p.weight,
			MaxInFlight:          p.spec.MaxInFlight,
			InFlight:             int(p.inFlight.Load()),
			PendingPrefillTokens: int(p.pending.Load()),
			PeerInFlight:         int(p.peerInFlight.Load()),
			PeerPendingTokens:    int(p.peerPending.Load()),
			PrefillTokensPerSec:  loadF(&p.rate),
			OverheadSeconds:      loadF(&p.overhead),
			CachedBlocks:         r.idx.blocksOf(p.id),
			CapacityBlocks:       p.capEff,
			Signals: EngineSignals{
				Waiting:          int(p.sigWaiting.Load()),
				Running:          int(p.sigRunning.Load()),
				KVUsage:          loadF(&p.sigKV),
				KVCapacityTokens: int(p.sigKVCap.Load()),
				BatchSlots:       int(p.slotsSig.Load()),
				SlotCaches:       p.slotSig.Load(),
				NoPrefixCache:    p.noCacheSig.Load(),
				At:               p.sigAt.Load(),
			},
			Mispredictions:      p.mispredicts.Load(),
			BatchSlots:          int(p.slots()),
			SuspectedBatchSlots: int(p.suspectedSlots()),
			SlotRiskShare:       p.fleetPrefill.riskShare(),
			SlotSeconds:         p.slotSeconds(),
			SlotLoad:            p.fleetPrefill.slotLoad(),
			SlotPrefillShare:    p.fleetPrefill.slotPrefillShare(),
			StepSeconds:         p.stepSeconds(),
			EnginePrefillRate:   loadF(&p.engRate),
			PrefillShape:        p.prefillShape(),
			Confidence:          p.confidence(),
			BusyCostSeconds:     p.busyCost(),
			SlotCaches:          p.slotMode.Load(),
			NoPrefixCache:       p.noCache.Load(),
			RAMCacheTokens:      p.slotc.ramSize() * r.bt,
			HeldRequests:        int(max(p.holds.Load(), 0)),
			TTFT:                p.ttftStats(),
		})
	}
	return out
}

// Stats are router-wide counters for metrics.
type Stats struct {
	Decisions      uint64 // successful Decide calls
	ModelNotFound  uint64 // Decide calls that returned ErrModelNotFound
	NoReplica      uint64 // Decide calls that returned ErrNoReplica
	Mispredictions uint64 // End reports far below the predicted cached tokens
	Rollbacks      uint64 // speculative inserts undone (failed before first token)
	TurnsKept      uint64 // chat turns put back on their previous turn's replica (CostPolicy.keepTurn)
	HoldCopies     uint64 // slot holds declined so that a request computes another copy of a prefix (holdRents)
	Evictions      uint64 // (block, replica) pairs evicted by LRU bounds
	TrackedBlocks  int    // distinct block hashes in the index
	TrackedPairs   int    // (block, replica) pairs in the index

	PromptTokens          uint64 // estimated prompt tokens of begun requests
	PredictedCachedTokens uint64 // of which predicted cached on their replica at Begin
}

// Stats returns the router's counters.
func (r *Router) Stats() Stats {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return Stats{
		Decisions:      r.decisions.Load(),
		ModelNotFound:  r.modelNotFound.Load(),
		NoReplica:      r.noReplica.Load(),
		Mispredictions: r.mispredicts.Load(),
		Rollbacks:      r.rollbacks.Load(),
		TurnsKept:      r.turnsKept.Load(),
		HoldCopies:     r.holdCopies.Load(),
		Evictions:      r.idx.evictions,
		TrackedBlocks:  len(r.idx.blocks),
		TrackedPairs:   len(r.idx.pairs),

		PromptTokens:          r.promptTokens.Load(),
		PredictedCachedTokens: r.cachedTokens.Load(),
	}
}
