package affinity

import (
	"math"
	"sync/atomic"
)

// A prefill's time depends on more than its token count: each new token
// attends to every token before it, so the same tokens cost more after a
// long cached prefix than at the start of a cold prompt. On the live
// bench's CPU llama.cpp servers (tiny model, attention dominating) a
// 60-token question after 4,096 cached tokens ran at about 1,900 tokens/s
// and a cold 1,000-3,000-token prompt at about 15,000; one rate through
// both (what tokens / seconds gives) priced a server by the mix of
// requests it happened to get: two identical servers read 3,380 and 7,083
// tokens/s in one bench row, and the router's prediction error was a
// median |ln(pred/actual)| of 0.50 where a context term brings it to 0.08
// (2,432 requests of that run's access logs, refitted offline).
//
// prefillShape fits, where the engine reports its own prefill timings
// (llama.cpp's timings.prompt_n and prompt_ms, over the busy periods
// sampleEngineRate merges), the period's seconds as
//
//	a + b·Σn + k·Σ n(c + n/2) + j·Σc
//
// over the requests in it: n the tokens each computed, c the tokens it
// found cached (what they extend). n(c + n/2) is the attention work, the
// (query, key) pairs of n tokens after c; c alone, what a prefill pays to
// read a context besides its pairs (a short question's step over a long
// cache). a is each period's fixed cost (the engine step), left to the
// TTFT model's overhead O_r, which is learned net of what the shape
// prices. The coefficients are non-negative least squares over the
// periods' exponentially weighted moments (about the last 100 periods):
// the subset of terms whose unconstrained fit is all positive and leaves
// the least residual. The shape replaces n / P_r for the request's own
// prefill only where its context terms leave at least shapeGain less
// residual than the rate's line (b·n) alone: an engine whose prefill is
// linear in tokens (a GPU engine at moderate lengths) keeps the rate. Prefill queued
// ahead of a request (Q_r / P_r) stays at the rate: its contexts are not
// known.
type prefillShape struct {
	n float64
	// mean[i]: means of the features (terms: n, pairs, c, scaled to
	// thousands, millions and thousands) and, at shapeY, the seconds;
	// cross[i][j]: means of their products.
	mean  [shapeTerms + 1]float64
	cross [shapeTerms + 1][shapeTerms + 1]float64
}

const (
	shapeTerms = 3
	shapeY     = shapeTerms
	// shapeMin: periods before the shape prices anything.
	shapeMin = 16
	// shapeGain: the least share of the rate line's residual the context
	// terms must remove.
	shapeGain = 0.05
	// shapeCond: a subset of terms whose covariance has a pivot below
	// this share of its diagonal is not identifiable (collinear terms,
	// or one that does not vary: no period had anything cached).
	shapeCond = 1e-6
)

// shapeTermsOf is the scaled terms of a period that computed n tokens
// with attention pairs pairs after ctx cached ones (sums over its
// requests).
func shapeTermsOf(n, pairs, ctx float64) [shapeTerms]float64 {
	return [shapeTerms]float64{n / 1e3, pairs / 1e6, ctx / 1e3}
}

// shapePairs is the attention pairs of n tokens computed after ctx.
func shapePairs(n, ctx float64) float64 { return n * (ctx + n/2) }

// add folds one period in (weight 1/count over the first, then floor).
func (s *prefillShape) add(x [shapeTerms]float64, y, floor float64) {
	s.n++
	w := max(1/s.n, floor)
	var v [shapeTerms + 1]float64
	copy(v[:], x[:])
	v[shapeY] = y
	for i := range v {
		s.mean[i] += w * (v[i] - s.mean[i])
		for j := i; j < len(v); j++ {
			s.cross[i][j] += w * (v[i]*v[j] - s.cross[i][j])
		}
	}
}

// cov is the centered second moment of terms i and j (i <= j).
func (s *prefillShape) cov(i, j int) float64 {
	return s.cross[i][j] - s.mean[i]*s.mean[j]
}

// fit is the least-squares coefficients over the terms in mask (bit i:
// term i) with an intercept, and the residual variance they leave; ok
// only when identifiable and every coefficient is positive.
func (s *prefillShape) fit(mask int) (coef [shapeTerms]float64, resid float64, ok bool) {
	var idx [shapeTerms]int
	k := 0
	for i := range shapeTerms {
		if mask&(1<<i) != 0 {
			idx[k] = i
			k++
		}
	}
	// The normal equations [C | c_y], solved by elimination with the
	// pivots checked against the diagonal.
	var a [shapeTerms][shapeTerms + 1]float64
	for r := range k {
		for c := range k {
			i, j := min(idx[r], idx[c]), max(idx[r], idx[c])
			a[r][c] = s.cov(i, j)
		}
		a[r][k] = s.cov(idx[r], shapeY)
		if !(a[r][r] > 0) {
			return coef, 0, false
		}
	}
	var diag [shapeTerms]float64
	for r := range k {
		diag[r] = a[r][r]
	}
	for p := range k {
		if !(a[p][p] > shapeCond*diag[p]) {
			return coef, 0, false
		}
		for r := p + 1; r < k; r++ {
			f := a[r][p] / a[p][p]
			for c := p; c <= k; c++ {
				a[r][c] -= f * a[p][c]
			}
		}
	}
	var b [shapeTerms]float64
	for r := k - 1; r >= 0; r-- {
		v := a[r][k]
		for c := r + 1; c < k; c++ {
			v -= a[r][c] * b[c]
		}
		b[r] = v / a[r][r]
		if !(b[r] > 0) {
			return coef, 0, false
		}
	}
	resid = s.cov(shapeY, shapeY)
	for r := range k {
		coef[idx[r]] = b[r]
		resid -= b[r] * s.cov(idx[r], shapeY)
	}
	return coef, max(resid, 0), true
}

// solve is the shape's coefficients, ok when they are to price prefills:
// enough periods, and a subset with a context term (pairs or c) that
// leaves at least shapeGain less residual than the best without one.
func (s *prefillShape) solve() (coef [shapeTerms]float64, ok bool) {
	if s.n < shapeMin {
		return coef, false
	}
	plain := s.cov(shapeY, shapeY) // no term: the intercept alone
	if _, r, ok := s.fit(1); ok {
		plain = r
	}
	best := math.Inf(1)
	for mask := 2; mask < 1<<shapeTerms; mask++ {
		if c, r, ok := s.fit(mask); ok && r < best {
			coef, best = c, r
		}
	}
	return coef, best <= (1-shapeGain)*plain
}

// seconds is the priced prefill of unc tokens after ctx cached ones.
func shapeSeconds(coef *[shapeTerms]float64, unc, ctx float64) float64 {
	x := shapeTermsOf(unc, shapePairs(unc, ctx), ctx)
	return coef[0]*x[0] + coef[1]*x[1] + coef[2]*x[2]
}

// shapeCoefs is a replica's published shape (float64 bits), read by
// decisions without fitMu; ok says it prices.
type shapeCoefs struct {
	c  [shapeTerms]atomic.Uint64
	ok atomic.Bool
}

func (sc *shapeCoefs) store(coef [shapeTerms]float64, ok bool) {
	for i := range coef {
		storeF(&sc.c[i], coef[i])
	}
	sc.ok.Store(ok)
}

// load is the published coefficients, ok when they price.
func (sc *shapeCoefs) load() (coef [shapeTerms]float64, ok bool) {
	if !sc.ok.Load() {
		return coef, false
	}
	for i := range coef {
		coef[i] = loadF(&sc.c[i])
	}
	return coef, true
}

// shapePeriod folds one finished prefill busy period into the shape
// (y seconds; x its scaled terms), its seconds clipped to within 4x of
// the shape's prediction once it prices. Callers hold fitMu.
func (m *ttftModel) shapePeriod(p *replica, x [shapeTerms]float64, y float64) {
	if !(y > 0) {
		return
	}
	s := &m.shape
	if coef, ok := p.shapeC.load(); ok {
		pred := max(s.mean[shapeY]-coef[0]*s.mean[0]-coef[1]*s.mean[1]-coef[2]*s.mean[2], 0) +
			coef[0]*x[0] + coef[1]*x[1] + coef[2]*x[2]
		if pred > 0 {
			y = min(max(y, pred/4), 4*pred)
		}
	}
	s.add(x, y, engineLineWeight)
	coef, ok := s.solve()
	p.shapeC.store(coef, ok)
	if ok && p.fleetPrefill != nil {
		p.fleetPrefill.shaped.Store(true)
	}
}

// prefillSeconds is what the request's own prefill of unc tokens after
// ctx cached ones is priced at on p: the engine's shape where it prices
// (only where p's prefill is priced with its own line: ownLine), else
// unc times inv, 1 / P_r.
func (p *replica) prefillSeconds(unc, ctx, inv float64) float64 {
	if p.ownLine() {
		if coef, ok := p.shapeC.load(); ok {
			return shapeSeconds(&coef, unc, ctx)
		}
	}
	return unc * inv
}
