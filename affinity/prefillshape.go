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
// prefillShape fits, where the engines of a pool (the replicas serving
// one model) report their own prefill timings (llama.cpp's
// timings.prompt_n and prompt_ms, over the busy periods sampleEngineRate
// merges), a period's seconds as
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
// the subset of terms, the intercept one of them, whose unconstrained fit
// is all positive and leaves the least residual (a negative intercept
// would price the terms above what the engine takes: with every request
// extending the same cached prompt, one cold period's fit priced a
// 30 ms question at 600 ms). The shape replaces n / P_r for the request's
// own prefill only where its context terms leave at least shapeGain less
// residual than the best fit without them (the rate's line): an engine
// whose prefill is linear in tokens (a GPU engine at moderate lengths)
// keeps the rate. Prefill queued ahead of a request (Q_r / P_r) stays at
// the rate: its contexts are not known.
//
// The shape is the pool's, fitted over every replica's periods, and each
// replica prices it at its own speed (the geometric mean of its periods'
// measured time over the shape's): how a prefill grows with its context
// is the model's, how fast a server runs it the server's. Fitted per
// replica, a server whose requests all extended one cached prompt could
// not separate the terms (its context and pairs move with its tokens)
// and stayed at its rate while its twin was priced by shape: two
// identical servers priced apart, the busier one winning.
type prefillShape struct {
	n float64
	// cross[i][j] (i <= j): the means of the products of v_i and v_j,
	// v = (1, the terms (n, pairs, c, scaled to thousands, millions and
	// thousands), the seconds at shapeY): the normal equations of every
	// subset of terms, the intercept one of them.
	cross [shapeY + 1][shapeY + 1]float64
	// ctxMax: the longest context one request of a period extended, each
	// period decaying it by engineLineWeight (shapePrice).
	ctxMax float64
}

const (
	shapeTerms = 3
	// shapeY: the seconds' index in prefillShape's vectors (after the
	// intercept's 0 and the terms' 1..shapeTerms).
	shapeY = shapeTerms + 1
	// shapeMin: periods before the shape prices anything.
	shapeMin = 16
	// shapeGain: the least share of the rate line's residual the context
	// terms must remove.
	shapeGain = 0.05
	// shapeCond: a subset of terms whose normal equations have a pivot
	// below this share of its diagonal is not identifiable (collinear
	// terms: a prompt's pairs and context move together when every
	// request extends the same cached prompt).
	shapeCond = 1e-6
	// shapePlain: the subsets without a context term (the intercept, the
	// tokens, both).
	shapePlain = 0b11
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
	var v [shapeY + 1]float64
	v[0] = 1
	copy(v[1:], x[:])
	v[shapeY] = y
	for i := range v {
		for j := i; j < len(v); j++ {
			s.cross[i][j] += w * (v[i]*v[j] - s.cross[i][j])
		}
	}
}

// fit is the least-squares coefficients over the terms in mask (bit 0:
// the intercept, bit i: term i) and the mean squared residual they
// leave; ok only when identifiable and every coefficient is positive (a
// negative intercept would price the terms above what the engine takes:
// the intercept is left to the TTFT model's overhead, never below 0).
func (s *prefillShape) fit(mask int) (coef [shapeY]float64, resid float64, ok bool) {
	var idx [shapeY]int
	k := 0
	for i := range shapeY {
		if mask&(1<<i) != 0 {
			idx[k] = i
			k++
		}
	}
	// The normal equations [E[v v'] | E[v y]], solved by elimination
	// with the pivots checked against the diagonal.
	var a [shapeY][shapeY + 1]float64
	var diag [shapeY]float64
	for r := range k {
		for c := range k {
			a[r][c] = s.cross[min(idx[r], idx[c])][max(idx[r], idx[c])]
		}
		a[r][k] = s.cross[idx[r]][shapeY]
		diag[r] = a[r][r]
		if !(diag[r] > 0) {
			return coef, 0, false
		}
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
	var b [shapeY]float64
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
	resid = s.cross[shapeY][shapeY]
	for r := range k {
		coef[idx[r]] = b[r]
		resid -= b[r] * s.cross[idx[r]][shapeY]
	}
	return coef, max(resid, 0), true
}

// solve is the shape's term coefficients and intercept, ok when they
// are to price prefills: enough periods, and a subset with a context
// term (pairs or c) that leaves at least shapeGain less residual than
// the best without one (the rate's line).
func (s *prefillShape) solve() (coef [shapeTerms]float64, icpt float64, ok bool) {
	if s.n < shapeMin {
		return coef, 0, false
	}
	plain := s.cross[shapeY][shapeY] // no term at all
	for mask := 1; mask <= shapePlain; mask++ {
		if _, r, ok := s.fit(mask); ok {
			plain = min(plain, r)
		}
	}
	best := math.Inf(1)
	var full [shapeY]float64
	for mask := shapePlain + 1; mask < 1<<shapeY; mask++ {
		if c, r, ok := s.fit(mask); ok && r < best {
			full, best = c, r
		}
	}
	copy(coef[:], full[1:])
	return coef, full[0], best < (1-shapeGain)*plain
}

// shapePrice is a shape as decisions price it: its terms' coefficients
// and the longest cached context its periods showed (ctxMax, decaying).
// The context's own term (j) is priced for at most ctxMax: fitted where
// every request found a few template tokens cached (a workload sharing
// nothing: 0 or 4 tokens), it is a few milliseconds' difference between
// two kinds of request, not a price per token to extend to a 4,096-token
// prompt (0.5-0.9 ms a token there, seconds for a long one). The pairs
// are not capped: how attention grows with the context is physics, and
// their term is fitted on cold prompts' pairs of the same magnitude.
type shapePrice struct {
	c      [shapeTerms]float64
	ctxMax float64
}

// seconds is the priced prefill of unc tokens after ctx cached ones.
func (sp *shapePrice) seconds(unc, ctx float64) float64 {
	return shapeDot(sp, shapeTermsOf(unc, shapePairs(unc, ctx), min(ctx, sp.ctxMax)))
}

// shapeCoefs is a pool's published shape (float64 bits), read by
// decisions without its lock; ok says it prices. icpt is the fit's
// intercept (a period's fixed cost): prefills are not priced at it (O_r
// holds it), but a replica's speed is measured with it.
type shapeCoefs struct {
	c      [shapeTerms]atomic.Uint64
	icpt   atomic.Uint64
	ctxMax atomic.Uint64
	ok     atomic.Bool
}

func (sc *shapeCoefs) store(coef [shapeTerms]float64, icpt float64, ok bool) {
	for i := range coef {
		storeF(&sc.c[i], coef[i])
	}
	storeF(&sc.icpt, icpt)
	sc.ok.Store(ok)
}

// load is the published shape, ok when it prices.
func (sc *shapeCoefs) load() (sp shapePrice, ok bool) {
	if !sc.ok.Load() {
		return sp, false
	}
	for i := range sp.c {
		sp.c[i] = loadF(&sc.c[i])
	}
	sp.ctxMax = loadF(&sc.ctxMax)
	return sp, true
}

// shapeDot is the shape's seconds for a period's scaled terms x.
func shapeDot(sp *shapePrice, x [shapeTerms]float64) float64 {
	return sp.c[0]*x[0] + sp.c[1]*x[1] + sp.c[2]*x[2]
}

// shapeClip bounds how far one period moves a replica's speed against
// its pool's shape: within 4x either way.
var shapeClip = math.Log(4)

// shapePeriod folds one finished prefill busy period (y seconds; x its
// scaled terms) of p's engine into its pool's shape, and into p's speed
// against that shape as it stood before the period. Callers hold
// p.fitMu.
func (m *ttftModel) shapePeriod(p *replica, x [shapeTerms]float64, ctxMax, y float64) {
	f := p.fleetPrefill
	if f == nil || !(y > 0) {
		return
	}
	// The pool's fit takes the period at the pool's speed: a slower
	// server's periods do not read as dearer prompts of the kinds it got.
	v := p.speed()
	pred := 0.0 // the shape's seconds for the period, with its intercept; 0: none
	if coef, ok := f.shapeC.load(); ok {
		pred = loadF(&f.shapeC.icpt) + shapeDot(&coef, x)
	}
	if pred > 0 {
		r := min(max(math.Log(y/pred), -shapeClip), shapeClip)
		m.shapeN++
		m.shapeLog += max(1/m.shapeN, shapeSpeedWeight) * (r - m.shapeLog)
		storeF(&p.shapeSpeed, math.Exp(ownWeight(min(m.shapeN, 1/engineLineWeight))*m.shapeLog))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.shape
	y /= v
	if pred > 0 {
		y = min(max(y, pred/4), 4*pred)
	}
	s.add(x, y, engineLineWeight)
	s.ctxMax = max(ctxMax, s.ctxMax*(1-engineLineWeight))
	storeF(&f.shapeC.ctxMax, s.ctxMax)
	f.shapeC.store(s.solve())
}

// shapeSpeedWeight: a replica's speed against its pool's shape remembers
// about its last 20 periods.
const shapeSpeedWeight = 0.05

// speed is the factor p's pool's shape is priced at on p: its periods'
// measured time over the shape's (with its intercept), the geometric
// mean over about the last 20, drawn toward 1 while they are few
// (ownWeight, as the engine rate is drawn toward its pool's); 1 before
// any.
func (p *replica) speed() float64 {
	if v := loadF(&p.shapeSpeed); v > 0 {
		return v
	}
	return 1
}

// prefillSeconds is what the request's own prefill of unc tokens after
// ctx cached ones is priced at on p: its pool's shape at p's speed where
// the shape prices and p's prefill is priced with its own line (a
// configured or engine-reported rate: ownLine), else unc times inv,
// 1 / P_r.
func (p *replica) prefillSeconds(unc, ctx, inv float64) float64 {
	if f := p.fleetPrefill; f != nil && p.ownLine() {
		if coef, ok := f.shapeC.load(); ok {
			return p.speed() * coef.seconds(unc, ctx)
		}
	}
	return unc * inv
}

// PrefillShape is an engine's prefill time as the cost policy prices a
// request's own prefill where the engine reports its timings
// (prefillshape.go): seconds per computed token, per attention pair (a
// computed token and one before it) and per cached token the prefill
// extends, its pool's shape at the replica's speed. Zero where the
// replica's prefill is priced at its rate.
type PrefillShape struct {
	PerToken, PerPair, PerContextToken float64
	// ContextTokensMax: the longest cached context the pool's periods
	// showed (decaying); PerContextToken prices up to it.
	ContextTokensMax float64
}

// Priced says whether the shape prices the replica's prefills.
func (s PrefillShape) Priced() bool { return s != PrefillShape{} }

// prefillShape is p's shape as priced, in unscaled units.
func (p *replica) prefillShape() PrefillShape {
	f := p.fleetPrefill
	if f == nil || !p.ownLine() {
		return PrefillShape{}
	}
	coef, ok := f.shapeC.load()
	if !ok {
		return PrefillShape{}
	}
	one, v := shapeTermsOf(1, 1, 1), p.speed()
	return PrefillShape{PerToken: v * coef.c[0] * one[0], PerPair: v * coef.c[1] * one[1], PerContextToken: v * coef.c[2] * one[2],
		ContextTokensMax: coef.ctxMax}
}
