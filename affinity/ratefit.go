package affinity

// The prefill-rate fit: what a finished request teaches its replica's
// TTFT model (sampleRate) and the robust line behind P_r and O_r (rateFit).

// sampleRate feeds the replica's TTFT model with f's outcome. It runs at
// End, when the engine's real cached tokens are known: timing a prefill
// with the predicted uncached tokens would read an unpredicted cache hit (a
// prefix another router sent, or one our index evicted too early) as a
// very fast prefill of the whole prompt and inflate the rate without bound.
// o.CachedTokens < 0 (unknown) falls back to the prediction. A request that
// waited for a batch slot waited for decodes to finish (decode time, not
// prefill), so the prefill fit takes its TTFT less the predicted
// slot wait; every request gives a slot-time sample, and a
// streamed one checks the TTFT prediction made at Begin.
func (r *Router) sampleRate(p *replica, f *Flight, now int64, o *Outcome) {
	uncached := f.UncachedTokens
	if o.CachedTokens >= 0 {
		uncached = max(0, f.PromptTokens-o.CachedTokens)
	}
	if now > f.Start {
		// Clipped to 8x the current estimate: one long generation does
		// not hold every period open.
		d := float64(now-f.Start) / 1e9
		if h := loadF(&p.holdSec); h > 0 {
			d = min(d, 8*h)
		}
		ewma(&p.holdSec, d, slotWeight)
	}
	// What the engine's prefill extended: the cached prefix it reported,
	// else the prompt less what it computed.
	engCtx := o.CachedTokens
	if engCtx < 0 {
		engCtx = f.PromptTokens - o.PrefillTokens
	}
	if o.PrefillSeconds > 0 {
		p.sampleEngineRate(o.PrefillTokens, engCtx, o.PrefillSeconds, f.FirstTokenAt)
	}
	// The request's own prefill as priced (prefillSeconds), with its real
	// and its predicted uncached tokens.
	ctx := float64(max(f.PromptTokens-uncached, 0))
	// The slot time D_r learns is the decode, after the first token, less
	// what of the engine's prefill of others' prompts meanwhile held it up
	// (γ; a request is priced that prefill as queued, x / P_r): with
	// either prefill in, a replica whose last requests were cold prompts,
	// or met them, had a slot time several times its identical
	// neighbour's for the same questions.
	shared := p.sharedDuring(f, now)
	priced, _ := p.prefill()
	pre := 0.0 // the others' prefill while f decoded, seconds at P_r
	streamed := f.FirstTokenAt != 0 && !f.buffered
	if streamed && priced > 0 {
		pre = float64(p.prefilled.Load()-f.prefilled) / priced
	}
	switch {
	case o.DecodeSeconds > 0:
		p.sampleSlot(o.DecodeSeconds, shared, pre, streamed)
	case streamed:
		p.sampleSlot(float64(now-f.FirstTokenAt)/1e9, shared, pre, true)
	default:
		dur := float64(now-f.Start) / 1e9
		p.sampleSlot(max(dur-f.predTTFT, dur/4), shared, 0, false)
	}
	dt := float64(f.FirstTokenAt-f.Start) / 1e9
	if f.FirstTokenAt == 0 || dt <= 0 || f.buffered {
		return
	}
	p.checkPrediction(f.predTTFT, dt)
	// Judged against the prediction with the engine's real uncached tokens:
	// a predicted hit that did not come is late by its prefill, not by a
	// wait for a slot.
	pred := f.predTTFT
	if miss := uncached - f.UncachedTokens; miss > 0 && priced > 0 {
		pred += max(p.prefillSeconds(float64(uncached), ctx, 1/priced)-
			p.prefillSeconds(float64(f.UncachedTokens), float64(max(f.PromptTokens-f.UncachedTokens, 0)), 1/priced), 0)
	}
	kvFree := loadF(&p.sigKV) < r.cfg.KVHighWater
	p.sampleLateFirst(int64(f.busy), dt, pred, kvFree)
	if f.riskWait > 0 && kvFree {
		p.fleetPrefill.sampleRisk(f.riskWait, dt-pred)
	}
	// alone: no prefill that began after this request's would take more
	// than a quarter of its time to first token. Prefills that arrive
	// while one runs may share its engine steps (llama.cpp splits each
	// batch among the slots prefilling): a cold prompt that began alone
	// and met three more took four times its time alone, and as a clean
	// sample that put 1.8 s into the overhead of a server whose cached
	// questions answer in 50 ms. Only such requests give the intercept
	// (an engine that serves prefills in order keeps the first one's time,
	// but a sample that could only lower it would pull it to the low end
	// of its spread).
	alone := float64(f.later)/priced <= dt/4
	if f.slotWait > 0 && r.cfg.LearnSlotWaits {
		// What the wait for a batch slot took: the TTFT less the rest of
		// the prediction (waitScale).
		p.fleetPrefill.sampleWait(f.slotWait, dt-(f.predTTFT-f.slotWait))
	}
	// A clean sample for the pool's line (fleetPrefill.sampleClean): no
	// prefill queued ahead, no slot wait, a free slot, the engine's token
	// count known.
	clean := f.queued == 0 && f.slotWait == 0 && o.CachedTokens >= 0 && o.PromptTokens > 0 &&
		p.fleetPrefill != nil && p.slotSurelyFree(int64(f.busy))
	// The wait for a batch slot is the slot term's, not prefill: the fit
	// explains what is left of the TTFT (at least a quarter of it, in case
	// the slot wait was overestimated).
	y := max(dt-f.slotWait, dt/4)
	rate, over0 := p.ownPrefill()
	p.fitMu.Lock()
	// With the engine's rate, the line's x is the tokens queued ahead plus
	// the request's own prefill in tokens at that rate: its shape where
	// one prices it, so the intercept is what the shape leaves.
	er := p.engineRateShrunk()
	x := float64(f.queued + int64(uncached))
	if er > 0 {
		x = float64(f.queued) + p.prefillSeconds(float64(uncached), ctx, 1/er)*er
	}
	rate, over := p.fit.add(x, y, rate, over0, er)
	m := &p.model
	if !p.fitted.Load() {
		m.ownOver = over0
		p.fitted.Store(true)
	}
	storeF(&p.rate, rate)
	nOver := min(p.fit.n, 1/fitWeight) // the intercept's samples, up to their memory
	if s := p.slots(); s > 0 {
		// With known slots the intercept comes from clean samples only:
		// requests that found a free slot and no prefill queued ahead,
		// and met no prefill begun after them (alone).
		// The line's intercept absorbs queueing the model missed (a burst
		// before the slot count was learned), and a replica whose
		// intercept is inflated gets no traffic to correct it.
		over = m.ownOver
		if alone && f.queued == 0 && int64(f.busy) < s {
			over = max(dt-p.prefillSeconds(float64(uncached), ctx, 1/rate), 0)
			if m.cleanN++; m.cleanN > 1 {
				over = m.ownOver + cleanOverWeight*(over-m.ownOver)
			}
		} else if m.cleanN == 0 {
			over = 0
		}
		nOver = min(float64(m.cleanN), 1/cleanOverWeight)
	}
	m.ownOver = over
	storeF(&p.overhead, p.overheadShrunk(over, nOver))
	// An engine's first answers carry its warm-up (graph capture, first
	// allocations): they are not clean samples.
	warm := p.model.streamed >= cleanWarmup
	p.model.streamed++
	p.fitMu.Unlock()
	p.fleetPrefill.sample(rate, over)
	if clean && warm {
		p.fleetPrefill.sampleClean(float64(uncached), dt)
	}
	// What the model left unexplained, against the requests the replica
	// had, for the pool's busy line (β); a request that waited for a batch
	// slot is the slot term's (it found every slot taken, not a shared
	// batch). A first token in under half its prediction is not about the
	// batch (a queue that was not there, a hit the index did not know): on
	// the simulator's GPU engines such requests, a few in the first hundred,
	// made a slope of 5-14 ms where the engines' is 0.2. One far over its
	// prediction is clipped to fitClip times it, so a stall moves β little.
	if warm && f.slotWait == 0 && f.predTTFT > 0 && dt >= f.predTTFT/2 {
		dtc := min(dt, f.predTTFT*fitClip)
		// β's bound: a request's whole time there, its decode at a full
		// batch (the most requests seen running where the limit is
		// unknown) or its Begin to End, the larger: a request sharing the
		// engine delays a new first token mostly by its prefill, which
		// the slot time leaves out.
		full := float64(max(p.slots(), p.maxRunSeen(), 1) - 1)
		bound := max(p.slotSecondsAt(full), loadF(&p.holdSec))
		p.fleetPrefill.sampleBusy(float64(f.busy), dtc-f.predTTFT, bound, p.specRate || loadF(&p.engRate) > 0)
	}
}

// sharedDuring is how many other requests f shared its replica with, on
// average over its life (Start to now, at End): this router's from the
// replica's load integral (which counts f itself throughout), plus the
// others (peers', other routers' seen in engine signals) as Begin found
// them; at most a full batch less f where the slot count is known.
func (p *replica) sharedDuring(f *Flight, now int64) float64 {
	x := float64(f.busy)
	if dur := now - f.Start; dur > 0 {
		own := max(float64(f.loadArea)/float64(dur)-1, 0)
		x = own + float64(max(f.busy-f.ownBusy, 0))
	}
	if s := p.slots(); s > 0 {
		x = min(x, float64(s-1))
	}
	return x
}

// cleanOverWeight is the EWMA weight of a clean intercept sample.
const cleanOverWeight = 0.1

// overheadShrunk is the overhead O_r a replica whose engine reports its
// prefill rate is priced with: its own intercept (own) drawn toward its
// pool's as engineRateShrunk draws the rate, weight n/(n+engineShrinkN) on
// its own, n its intercept samples up to their memory (clean samples where
// the slot count is known, else the fit's). The intercept takes
// what the rate misses on the samples that set it (a cold prompt whose
// steps were shared with other slots' decoding runs slower than the
// rate's line says), so identical llama.cpp servers ended bench rounds at
// 0.06 and 0.75 s, 0.12 and 0.31 s, where a cached question's first token
// takes 50-100 ms; the one with the larger intercept then looked dearer
// for every request. Other replicas are priced with the pool's model
// (prefill) or their configured rate's fit, and keep own. The pool's
// overhead is its clean line's intercept, or, where the pool's prefill
// shape prices (prefillshape.go), the mean of its replicas' own
// intercepts, which are net of the shape: a line in tokens through cached
// questions and cold prompts puts the questions' context cost into its
// intercept (0.02 s where the engine's step costs 0.003 in
// TestPrefillShapePooledAtEachSpeed). Callers hold fitMu.
func (p *replica) overheadShrunk(own, n float64) float64 {
	f := p.fleetPrefill
	if !(loadF(&p.engRate) > 0) || p.specRate || f == nil || f.n.Load() == 0 {
		return own
	}
	pool := loadF(&f.over)
	if f.shapeC.ok.Load() {
		pool = loadF(&f.meanOver)
	}
	w := ownWeight(n)
	return w*own + (1-w)*pool
}

// cleanWarmup: a replica's streamed answers before its samples join its
// pool's clean line.
const cleanWarmup = 2

// rateFit estimates a replica's time to first token as
//
//	ttft = overhead + tokens / rate
//
// from samples (tokens = prefill queued ahead at Begin + own uncached tokens,
// seconds to the first token) of requests that did not wait for a batch
// slot: an exponentially weighted least-squares line (weight fitWeight per
// sample once warm, about 20 samples of memory). The intercept is what a
// request waits besides prefill (the engine step in progress, each step's
// base cost, decode work sharing the steps), so it is not mistaken for slow
// prefill, and a fully cached request (tokens near 0) is a useful sample.
//
// Robustness: once warm, a sample's seconds are clipped to within 4x of the
// current line's prediction (one stalled or unexpectedly cached request
// does not move the line far); without enough spread in tokens (std <
// fitSpread x mean) the slope is not identifiable and the sample gives a
// rate through the current intercept; the published rate moves 20% of the
// way to the new estimate, at most 8x per sample, and stays within
// [rateFloor, rateCeil]; the intercept is clamped to [0, mean ttft]. When
// the engine reports its own prefill timings (engineRate > 0), that rate is
// published and the fit gives the intercept only.
type rateFit struct{ moments }

// moments are a line fit's exponentially weighted sums: the sample count
// and the means of x, y, x*x and x*y.
type moments struct {
	n, mx, my, mxx, mxy float64
}

// add1 folds one sample (x, y) in: weight 1/n over the first samples,
// then floor (a memory of about 1/floor samples).
func (m *moments) add1(x, y, floor float64) {
	m.n++
	w := max(1/m.n, floor)
	m.mx += w * (x - m.mx)
	m.my += w * (y - m.my)
	m.mxx += w * (x*x - m.mxx)
	m.mxy += w * (x*y - m.mxy)
}

// slope is the least-squares line's slope through the samples, ok when it
// is identifiable and positive: at least minN samples, x spread (std at
// least fitSpread of its mean), slope above 0.
func (m *moments) slope(minN float64) (b float64, ok bool) {
	varx := m.mxx - m.mx*m.mx
	if m.n < minN || !(varx > fitSpread*fitSpread*m.mx*m.mx) {
		return 0, false
	}
	b = (m.mxy - m.mx*m.my) / varx
	return b, b > 0
}

const (
	fitWeight     = 0.05
	fitSpread     = 0.25
	fitMinSamples = 8
	fitClip       = 4
	rateFloor     = 1
	rateCeil      = 1e9
)

func (f *rateFit) add(x, y, rate, over, engineRate float64) (newRate, newOver float64) {
	if f.n >= fitMinSamples {
		if pred := over + x/rate; pred > 0 {
			y = min(max(y, pred/fitClip), pred*fitClip)
		}
	}
	f.add1(x, y, fitWeight)
	if engineRate > 0 {
		rate = engineRate
	} else {
		varx := f.mxx - f.mx*f.mx
		next := rate
		if f.n >= fitMinSamples && varx > fitSpread*fitSpread*f.mx*f.mx {
			if b := (f.mxy - f.mx*f.my) / varx; b > 0 {
				next = 1 / b
			}
		} else if x > 0 {
			next = x / max(y-over, y/2)
		}
		rate += 0.2 * (min(max(next, rate/8), rate*8) - rate)
		rate = min(max(rate, rateFloor), rateCeil)
	}
	return rate, min(max(f.my-f.mx/rate, 0), f.my)
}
