package affinity

import "sync/atomic"

// RoundRobin ranks candidates in rotation, ignoring load and cache:
//
//	Ranked[i] = Candidates[(k + i) mod n]
//
// k the number of decisions so far, n the candidates.
type RoundRobin struct{ next atomic.Uint64 }

func (*RoundRobin) Name() string { return "round-robin" }

func (p *RoundRobin) Rank(v *View, _ *Request, d *Decision) {
	c := v.Candidates()
	n := uint64(len(c))
	start := p.next.Add(1) - 1
	for i := range uint64(min(v.MaxRanked(), len(c))) {
		d.Ranked = append(d.Ranked, c[(start+i)%n])
	}
}

// Interface guard.
var _ Policy = (*RoundRobin)(nil)
