package affinity

// PrefixOnly ranks by the longest predicted cached prefix, ties at random.
// It ignores load entirely (the baseline for pure cache affinity):
//
//	score_r = -C_r
//
// C_r the request's leading blocks predicted cached on r (View.CachedBlocks).
type PrefixOnly struct{}

func (PrefixOnly) Name() string { return "prefix" }

func (PrefixOnly) Rank(v *View, _ *Request, d *Decision) {
	sc := v.Scores()
	for i, id := range v.Candidates() {
		sc[i] = -float64(v.CachedBlocks(id))
	}
	v.RankLowest(d)
}

// Interface guard.
var _ Policy = PrefixOnly{}
