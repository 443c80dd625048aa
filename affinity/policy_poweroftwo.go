package affinity

// PowerOfTwo samples two distinct candidates and ranks the one with fewer
// in-flight requests (per weight) first; further retry choices follow from a
// random offset:
//
//	i, j distinct at random;  first = argmin over {i, j} of I_r / W_r
//
// I_r and W_r as in LeastRequest.
type PowerOfTwo struct{}

func (PowerOfTwo) Name() string { return "power-of-two" }

func (PowerOfTwo) Rank(v *View, _ *Request, d *Decision) {
	c := v.Candidates()
	n := len(c)
	if n == 1 {
		d.Ranked = append(d.Ranked, c[0])
		return
	}
	i := int(v.Random() % uint64(n))
	j := int(v.Random() % uint64(n-1))
	if j >= i {
		j++
	}
	li, lj := v.Load(c[i]), v.Load(c[j])
	si, sj := float64(li.InFlight)/li.Weight, float64(lj.InFlight)/lj.Weight
	if sj < si {
		i, j = j, i
	}
	d.Ranked = append(d.Ranked, c[i], c[j])
	k := min(v.MaxRanked(), n)
	for off := int(v.Random() % uint64(n)); len(d.Ranked) < k; off = (off + 1) % n {
		if off != i && off != j {
			d.Ranked = append(d.Ranked, c[off])
		}
	}
	if len(d.Ranked) > k {
		d.Ranked = d.Ranked[:k]
	}
}

// Interface guard.
var _ Policy = PowerOfTwo{}
