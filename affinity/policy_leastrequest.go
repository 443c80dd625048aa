package affinity

// LeastRequest ranks by in-flight requests divided by weight, ties at
// random:
//
//	score_r = I_r / W_r
//
// I_r the requests in flight on r (this router's and its peers', Load.InFlight),
// W_r its weight.
type LeastRequest struct{}

func (LeastRequest) Name() string { return "least-request" }

func (LeastRequest) Rank(v *View, _ *Request, d *Decision) {
	sc := v.Scores()
	for i, id := range v.Candidates() {
		l := v.Load(id)
		sc[i] = float64(l.InFlight) / l.Weight
	}
	v.RankLowest(d)
}

// Interface guard.
var _ Policy = LeastRequest{}
