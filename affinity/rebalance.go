package affinity

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// The load-aware rebalancer: which fast-path entries to drop because their
// replica is idle, ineligible or saturated relative to the rest.

// Reason says why Rebalance changes an entry.
type Reason uint8

const (
	ReasonIdle       Reason = iota + 1 // unused for longer than IdleTTL
	ReasonIneligible                   // its replica is unhealthy, draining or gone
	ReasonSaturated                    // its replica is saturated relative to the rest
)

func (r Reason) String() string {
	switch r {
	case ReasonIdle:
		return "idle"
	case ReasonIneligible:
		return "ineligible"
	case ReasonSaturated:
		return "saturated"
	}
	return ""
}

// Entry is one fast-path affinity entry, as Rebalance reads it.
type Entry struct {
	Client     uint64
	Replica    ReplicaID
	PromotedAt int64   // when it was written (newest are dropped first)
	LastUsed   int64   // latest use: last observation or last steered packet
	CacheValue float64 // mean predicted cached tokens per request on Replica
}

// ReplicaLoad is one replica's load for Rebalance.
type ReplicaLoad struct {
	Replica  ReplicaID
	Eligible bool    // healthy and not draining
	Weight   float64 // 0 means 1
	// Busy is the requests occupying the replica: the router's in-flight
	// count, or the engine's running+waiting when fresh and larger (steered
	// requests bypass the router, so only the engine counts them).
	Busy float64
	// Steered and Routed are the connections the datapath steered to the
	// replica, and the slowpath routed to it, over the same recent interval
	// (per-backend counter deltas). Both 0: all its load is assumed steered.
	Steered, Routed float64
}

// ReplicaLoadOf reads s's eligibility, weight and busy requests (engine
// signals count when younger than maxAge at now; peers' in-flight requests
// count too). The caller adds the datapath's Steered and Routed counts.
func ReplicaLoadOf(s *ReplicaStatus, now int64, maxAge time.Duration) ReplicaLoad {
	busy := s.InFlight + s.PeerInFlight
	if s.Signals.At != 0 && now-s.Signals.At <= int64(maxAge) {
		busy = max(busy, s.Signals.Waiting+s.Signals.Running)
	}
	return ReplicaLoad{Replica: s.ID, Eligible: s.Healthy && !s.Draining, Weight: s.Weight, Busy: float64(busy)}
}

// Change is one entry Rebalance wants changed.
type Change struct {
	Client uint64
	Action Action // ActionDrop
	From   ReplicaID
	To     ReplicaID // NoReplica for a drop
	Reason Reason
}

// Rebalance is the control loop's check of the current entries against the
// replicas' load. It appends to dst a drop for every entry
//   - idle: now - LastUsed > IdleTTL;
//   - ineligible: its replica is not Eligible or not in loads;
//   - saturated: its replica's u = Busy/Weight exceeds both
//     SaturationRatio x mean(u) and mean(u) + SaturationExcess over eligible
//     replicas; of that replica's entries it drops the fraction
//     min(1, f/s), f = (u - mean)/u the excess share of its load and
//     s = Steered/(Steered+Routed) the share the entries carry (1 when
//     unknown), least cache-valuable first, then newest first.
//
// Saturated entries are dropped, not moved: the next request then goes
// through the slowpath, whose decision weighs that client's cache against
// every replica's load, and the promotion rule re-promotes it where that
// decision settles. Dropped clients known to the Promoter lose their
// promotion. Each entry appears at most once.
func (p *Promoter) Rebalance(now int64, loads []ReplicaLoad, entries []Entry, dst []Change) []Change {
	cfg := &p.cfg
	mean := meanUtil(loads)
	var byID []int32 // ReplicaID -> index in loads + 1
	for i := range loads {
		if id := int(loads[i].Replica); id >= 0 {
			if id >= len(byID) {
				byID = append(byID, make([]int32, id+1-len(byID))...)
			}
			byID[id] = int32(i + 1)
		}
	}
	find := func(id ReplicaID) *ReplicaLoad {
		if int(id) < 0 || int(id) >= len(byID) || byID[id] == 0 {
			return nil
		}
		return &loads[byID[id]-1]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	start := len(dst)
	var sat []int // entries on saturated replicas, by index
	for i := range entries {
		e := &entries[i]
		l := find(e.Replica)
		switch {
		case now-e.LastUsed > int64(cfg.IdleTTL):
			dst = append(dst, Change{Client: e.Client, Action: ActionDrop, From: e.Replica, To: NoReplica, Reason: ReasonIdle})
		case l == nil || !l.Eligible:
			dst = append(dst, Change{Client: e.Client, Action: ActionDrop, From: e.Replica, To: NoReplica, Reason: ReasonIneligible})
		default:
			if cfg.saturated(util(l), mean) {
				sat = append(sat, i)
			}
		}
	}
	// Per saturated replica: order its entries and drop the excess share.
	slices.SortFunc(sat, func(a, b int) int {
		ea, eb := &entries[a], &entries[b]
		return cmp.Or(cmp.Compare(ea.Replica, eb.Replica),
			cmp.Compare(ea.CacheValue, eb.CacheValue),
			cmp.Compare(eb.PromotedAt, ea.PromotedAt),
			cmp.Compare(ea.Client, eb.Client))
	})
	for lo := 0; lo < len(sat); {
		id := entries[sat[lo]].Replica
		hi := lo
		for hi < len(sat) && entries[sat[hi]].Replica == id {
			hi++
		}
		l := find(id)
		u := util(l)
		f := (u - mean) / u
		s := 1.0
		if t := l.Steered + l.Routed; t > 0 {
			s = l.Steered / t
		}
		share := 1.0
		if s > 0 {
			share = min(1, f/s)
		}
		k := int(math.Ceil(share * float64(hi-lo)))
		for _, i := range sat[lo : lo+k] {
			e := &entries[i]
			dst = append(dst, Change{Client: e.Client, Action: ActionDrop, From: e.Replica, To: NoReplica, Reason: ReasonSaturated})
		}
		lo = hi
	}
	for i := start; i < len(dst); i++ {
		ch := &dst[i]
		if j := p.table.get(ch.Client); j >= 0 && p.clients[j].promoted == ch.From {
			p.demote(&p.clients[j])
		}
		p.st.Drops++
	}
	return dst
}

// Saturated appends to dst[:0], indexed by ReplicaID, whether Rebalance's
// saturation test finds each eligible replica in loads saturated (the
// control loop uses it to keep promotions out of saturated replicas between
// rebalances). Ids absent from loads read false.
func (p *Promoter) Saturated(loads []ReplicaLoad, dst []bool) []bool {
	dst = dst[:0]
	mean := meanUtil(loads)
	for i := range loads {
		l := &loads[i]
		if l.Replica < 0 {
			continue
		}
		for int(l.Replica) >= len(dst) {
			dst = append(dst, false)
		}
		dst[l.Replica] = l.Eligible && p.cfg.saturated(util(l), mean)
	}
	return dst
}

// saturated is the saturation test on one replica's utilisation u against
// the mean over eligible replicas.
func (c *PromoterConfig) saturated(u, mean float64) bool {
	return u > c.SaturationRatio*mean && u-mean > c.SaturationExcess
}

// meanUtil is the mean utilisation (Busy per unit weight) over the eligible
// replicas in loads, 0 when none is.
func meanUtil(loads []ReplicaLoad) float64 {
	var sum float64
	n := 0
	for i := range loads {
		if loads[i].Eligible {
			sum += util(&loads[i])
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// util is busy requests per unit of weight.
func util(l *ReplicaLoad) float64 {
	w := l.Weight
	if w <= 0 {
		w = 1
	}
	return l.Busy / w
}
