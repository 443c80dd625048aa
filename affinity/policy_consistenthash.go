package affinity

import (
	"slices"
	"sort"

	"github.com/zeebo/xxh3"
)

// ConsistentHash is consistent hashing with bounded load (Mirrokni et al.,
// as in KubeAI's CHWBL): the key (the request's first block hash, so requests
// sharing their first block share a home; else the session key; else
// random) is placed on a ring of RingVnodes points per unit of weight, and
// the ring is walked clockwise to the first replica whose in-flight+1 stays
// within LoadFactor x the mean (weighted):
//
//	take r when I_r + 1 <= LoadFactor * W_r * (sum_c I_c + 1) / sum_c W_c
//
// I_r the requests in flight on r, W_r its weight, c over the candidates;
// when no replica passes, the walk continues and takes the rest in ring
// order.
type ConsistentHash struct{ cfg Config }

func (*ConsistentHash) Name() string { return "consistent-hash" }

// Retune takes the live knobs; RingVnodes stays (rings are cached).
func (p *ConsistentHash) Retune(cfg Config) {
	cfg.RingVnodes = p.cfg.RingVnodes
	p.cfg = cfg
}

type hashRing struct {
	points []uint64
	owners []ReplicaID
}

func (p *ConsistentHash) ring(v *View) *hashRing {
	if r := v.g.ring.Load(); r != nil {
		return r
	}
	r := &hashRing{}
	type pt struct {
		h  uint64
		id ReplicaID
	}
	var pts []pt
	for _, id := range v.g.members {
		rp := v.r.reps[id]
		n := max(int(float64(p.cfg.RingVnodes)*rp.weight+0.5), 1)
		base := xxh3.HashString(rp.spec.Name)
		for k := range n {
			pts = append(pts, pt{chain(base, uint64(k)), id})
		}
	}
	sort.Slice(pts, func(a, b int) bool { return pts[a].h < pts[b].h })
	r.points = make([]uint64, len(pts))
	r.owners = make([]ReplicaID, len(pts))
	for i, x := range pts {
		r.points[i], r.owners[i] = x.h, x.id
	}
	v.g.ring.CompareAndSwap(nil, r)
	return v.g.ring.Load()
}

func (p *ConsistentHash) Rank(v *View, req *Request, d *Decision) {
	c := v.Candidates()
	var key uint64
	switch {
	case len(req.Hashes) > 0:
		key = req.Hashes[0]
	case req.SessionKey != 0:
		key = chain(req.SessionKey, 0x5E55)
	default:
		key = v.Random()
	}
	var total, wsum float64
	for _, id := range c {
		l := v.Load(id)
		total += float64(l.InFlight)
		wsum += l.Weight
	}
	mean := (total + 1) / wsum
	ring := p.ring(v)
	k := min(v.MaxRanked(), len(c))
	n := len(ring.points)
	start := sort.Search(n, func(i int) bool { return ring.points[i] >= key })
	// Pass 0 takes replicas within the load bound, pass 1 anyone left.
	for pass := 0; pass < 2 && len(d.Ranked) < k; pass++ {
		for s := 0; s < n && len(d.Ranked) < k; s++ {
			id := ring.owners[(start+s)%n]
			if slices.Contains(d.Ranked, id) || !v.r.reps[id].eligible() {
				continue
			}
			if pass == 0 {
				l := v.Load(id)
				if float64(l.InFlight)+1 > mean*p.cfg.LoadFactor*l.Weight {
					continue
				}
			}
			d.Ranked = append(d.Ranked, id)
		}
	}
}

// Interface guards.
var (
	_ Policy  = (*ConsistentHash)(nil)
	_ Retuner = (*ConsistentHash)(nil)
)
