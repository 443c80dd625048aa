package affinity

import "math"

// Flight accounting: Begin, FirstToken and End keep each replica's in-flight
// count and pending prefill, correct the index, and feed the learned models.

// Begin records that req was sent to replica id: the request's prefix is
// inserted into the index speculatively (the engine will cache it), and the
// replica's in-flight count and pending prefill grow. f is filled for
// FirstToken and End. d may be nil. An unknown id leaves f.Replica ==
// NoReplica and changes nothing.
func (r *Router) Begin(id ReplicaID, req *Request, d *Decision, f *Flight) {
	r.begin(id, req, f, false)
}

// TryBegin is Begin on a replica below its MaxInFlight: at the limit, or
// for an unknown id, it reports false, leaves f.Replica == NoReplica and
// changes nothing. The check and the count are one step under the write
// lock, so concurrent callers never take a replica past its limit; it is
// how a caller that routes to a replica it chose (a pinned or fixed
// target, a retry down the ranking) takes one of its slots.
func (r *Router) TryBegin(id ReplicaID, req *Request, d *Decision, f *Flight) bool {
	return r.begin(id, req, f, true)
}

// begin is Begin; limited refuses a replica at its MaxInFlight.
func (r *Router) begin(id ReplicaID, req *Request, f *Flight, limited bool) bool {
	*f = Flight{Replica: NoReplica}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.rep(id)
	if p == nil || limited && p.atLimit() {
		return false
	}
	hs := req.Hashes
	if len(hs) > p.capEff {
		hs = hs[:p.capEff]
	}
	held := r.idx.insert(id, hs)
	// An engine with per-slot caches reuses what the slot it gives the
	// request holds, or its RAM cache (slotcache.go).
	var seq uint64
	var use ramUse
	if sc, n := p.slotModel(); sc != nil {
		var shared int
		seq, shared, use = sc.begin(n, req.Hashes)
		held = min(shared, len(hs))
	}
	cached := min(held*r.bt, req.PromptTokens)
	// The prefill the replica is expected to do: the index's hit, plus the
	// continuation credit where the match ends at a request that finished
	// there (the engine holds its answer too; the cost policy prices the
	// same), discounted by how much of its predicted hits come true there
	// (an engine without prefix caching computes the whole prompt however
	// warm the index is).
	cont := held > 0 && held < len(hs) && r.finishedTail(hs[held-1], id)
	hit := float64(cached)
	if cont {
		hit = min(hit+loadF(&r.contCredit), float64(req.PromptTokens))
	}
	unc := max(req.PromptTokens-int(p.confidence()*hit), 0)
	busy := p.totalInFlight()
	wait := p.slotWait(busy, req.Now)
	*f = Flight{
		Replica:        id,
		UncachedTokens: unc,
		PromptTokens:   req.PromptTokens,
		predCached:     cached,
		Start:          req.Now,
		gen:            p.gen,
		queued:         p.totalPending(),
		newBlocks:      int32(len(hs) - held),
		buffered:       req.Buffered,
		predTTFT:       p.predictTTFT(float64(unc), float64(max(req.PromptTokens-unc, 0)), req.Now),
		slotWait:       wait,
		riskWait:       p.riskProbe(busy, req.Now),
		busy:           int32(min(busy, 1<<30)),
	}
	if len(hs) > 0 {
		f.tail = hs[len(hs)-1]
	}
	if req.HoldSince != 0 && req.HeldFor > 0 {
		f.heldFor = int32(min(req.HeldFor, 1<<30))
	}
	f.cont = cont
	if cont {
		// A finished request's tail continues once: a conversation's next
		// turn follows its previous one. Taken here, a second request
		// sharing the same prefix (other users of one template) is not
		// read as that request's continuation (policy_cost.go).
		r.takeTail(hs[held-1], id)
	}
	f.slotSeq, f.ram = seq, use
	if seq != 0 {
		p.slotc.stamp(seq, req.Now, f.predTTFT)
	}
	area, own := p.loadStep(req.Now, 1)
	f.loadArea, f.ownBusy = area, int32(min(own, 1<<30))
	p.inFlight.Add(1)
	p.pending.Add(int64(unc))
	p.pendingReqs.Add(1)
	f.begunAt = p.begun.Add(int64(unc))
	p.pend(f)
	r.promptTokens.Add(uint64(max(req.PromptTokens, 0)))
	r.cachedTokens.Add(uint64(cached))
	ewma(&p.uncachedAvg, float64(unc), 0.1)
	if r.onBegin != nil {
		r.onBegin.OnBegin(id, req)
	}
	if r.sink != nil {
		if len(hs) > 0 {
			r.sink.PeerInsert(id, hs)
		}
		r.sink.PeerLoad(id, p.localLoad())
	}
	return true
}

// live returns f's replica if it is still the one f began on. Callers hold mu.
func (r *Router) live(f *Flight) *replica {
	p := r.rep(f.Replica)
	if p == nil || p.gen != f.gen {
		return nil
	}
	return p
}

// FirstToken records the end of prefill: the replica's pending prefill drops
// by f.UncachedTokens. Its time is kept in f: End, once the engine's real
// cached tokens are known, gives the replica's rate fit the sample (tokens
// queued ahead at Begin + the real uncached tokens, FirstTokenAt - Start),
// unless the request was Buffered (see rateFit and sampleRate).
func (r *Router) FirstToken(f *Flight, now int64) {
	if f.Replica == NoReplica || f.FirstTokenAt != 0 {
		return
	}
	f.FirstTokenAt = max(now, 1)
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.live(f)
	if p == nil {
		return
	}
	p.pending.Add(-int64(f.UncachedTokens))
	p.pendingReqs.Add(-1)
	f.later = p.begun.Load() - f.begunAt
	if !f.buffered {
		// A buffered answer's "first token" is its last: when its prefill
		// ran is unknown, so it is not counted as prefill others met.
		f.prefilled = p.prefilled.Add(int64(f.UncachedTokens))
	}
	p.unpend(f)
	if f.slotSeq != 0 {
		p.slotc.firstToken(f.slotSeq, f.FirstTokenAt)
	}
	p.decStart.Add(f.FirstTokenAt - p.pendBase.Load())
	p.decN.Add(1)
	f.decoding = true
	p.sampleEarlyHit(f)
	if r.sink != nil {
		r.sink.PeerLoad(f.Replica, p.localLoad())
	}
}

// Outcome is what a finished request reports back (EndWith).
type Outcome struct {
	// OK: the request succeeded.
	OK bool
	// CachedTokens is the engine's usage.prompt_tokens_details.cached_tokens
	// (or llama.cpp's timings.cache_n); < 0 when unknown.
	CachedTokens int
	// PromptTokens is the engine's usage.prompt_tokens: the prompt in the
	// engine's own tokens, which the router's estimate from bytes misses
	// by a tenth or so either way; 0 when not reported. With it (or
	// llama.cpp's cache_n + prompt_n) the other counts are converted into
	// the router's tokens before use (inRouterTokens).
	PromptTokens int
	// PrefillTokens and PrefillSeconds are the engine's own prefill timing
	// (llama.cpp timings.prompt_n and prompt_ms); 0 when not reported.
	PrefillTokens  int
	PrefillSeconds float64
	// DecodeSeconds is the engine's own decode time (llama.cpp
	// timings.predicted_ms); 0 when not reported.
	DecodeSeconds float64
}

// inRouterTokens converts o's engine token counts into the router's
// tokens (its estimate of the prompt, promptTokens, against the engine's
// count), so that they compare with what the router predicted: the
// router's estimate (bytes / 4) misses a prompt by a tenth or so either
// way, and compared as reported, a tokenizer 5% denser makes every fully
// predicted hit look 5% short, its replica's confidence 0.95, and 5% of
// each cached prefix priced as prefill. The engine's count is its
// usage.prompt_tokens, else llama.cpp's cache_n + prompt_n (its timings
// come without usage unless the client asked for it). A ratio outside
// [minTokenRatio, maxTokenRatio] is more than a tokenizer's spread (images
// or tools the router did not count, another prompt's usage): o stays as
// reported, with PromptTokens 0.
func (o *Outcome) inRouterTokens(promptTokens int) {
	engine := o.PromptTokens
	if engine <= 0 && o.PrefillTokens > 0 && o.CachedTokens >= 0 {
		engine = o.CachedTokens + o.PrefillTokens
	}
	o.PromptTokens = 0
	if engine <= 0 || promptTokens <= 0 {
		return
	}
	s := float64(promptTokens) / float64(engine)
	if s < minTokenRatio || s > maxTokenRatio {
		return
	}
	conv := func(n int) int { return min(int(math.Round(float64(n)*s)), promptTokens) }
	if o.CachedTokens > 0 {
		o.CachedTokens = conv(o.CachedTokens)
	}
	if o.PrefillTokens > 0 {
		o.PrefillTokens = conv(o.PrefillTokens)
	}
	o.PromptTokens = promptTokens
}

// minTokenRatio, maxTokenRatio bound the router's tokens per engine token
// that inRouterTokens converts with (tokenizers run 3.5-4.5 bytes per
// token; the router counts 4).
const (
	minTokenRatio = 0.6
	maxTokenRatio = 1.6
)

// End is EndWith with only the cached tokens and success known.
func (r *Router) End(f *Flight, now int64, cachedTokens int, ok bool) {
	r.EndWith(f, now, Outcome{OK: ok, CachedTokens: cachedTokens})
}

// EndWith closes a Flight with what the engine reported. A request
// that failed before its first token rolls back its speculative index
// insert. An engine report of fewer than half the predicted cached tokens
// means the replica evicted blocks we still index: its index capacity shrinks
// by the missed blocks (to at least a quarter of its KV capacity) and grows
// back one block per correct prediction. It is idempotent.
func (r *Router) EndWith(f *Flight, now int64, o Outcome) {
	if f.Replica == NoReplica {
		return
	}
	o.inRouterTokens(f.PromptTokens)
	cachedTokens, ok := o.CachedTokens, o.OK
	predicted := f.predCached
	rollback := !ok && f.FirstTokenAt == 0 && f.newBlocks > 0
	miss := ok && cachedTokens >= 0 && predicted >= r.bt && cachedTokens*2 < predicted
	grow := ok && cachedTokens >= 0 && predicted >= r.bt && cachedTokens+r.bt/2 >= predicted // within rounding of a conversion
	if rollback || miss || grow {
		r.mu.Lock()
		defer r.mu.Unlock()
	} else {
		r.mu.RLock()
		defer r.mu.RUnlock()
	}
	p := r.live(f)
	if p == nil {
		f.Replica = NoReplica
		return
	}
	p.inFlight.Add(-1)
	end, _ := p.loadStep(now, -1)
	f.loadArea = end - f.loadArea
	p.slotc.end(f.slotSeq)
	if ok {
		p.slotc.learnRAM(f.ram, cachedTokens, r.bt)
	}
	if ok && cachedTokens >= 0 && f.heldFor > 0 {
		p.sampleHoldKept(cachedTokens, int(f.heldFor))
	}
	if f.decoding {
		p.decStart.Add(-(f.FirstTokenAt - p.pendBase.Load()))
		p.decN.Add(-1)
		f.decoding = false
	}
	if f.FirstTokenAt == 0 {
		p.pending.Add(-int64(f.UncachedTokens))
		p.pendingReqs.Add(-1)
		p.unpend(f)
	} else if ok {
		r.sampleRate(p, f, now, &o)
	}
	if ok && cachedTokens >= 0 && predicted >= r.bt {
		p.sampleHit(predicted, cachedTokens)
	}
	if ok {
		// Only a request that extended the replica's chain leaves a tail
		// to continue: one whose every block was held already (a shared
		// template, a question within its last partial block) ends where
		// other requests' prompts end too.
		if f.tail != 0 && f.newBlocks > 0 {
			k := tailKey(f.tail, f.Replica)
			r.tails[k%tailSlots].Store(k)
			r.noteTurn(f.tail, f.Replica)
			if r.tailSink != nil {
				r.tailSink.PeerTail(f.Replica, f.tail)
			}
		}
		if f.cont && cachedTokens >= 0 {
			ewma(&r.contCredit, float64(max(cachedTokens-predicted, 0)), 0.1)
		}
	}
	if r.sink != nil {
		r.sink.PeerLoad(f.Replica, p.localLoad())
		if rollback {
			r.sink.PeerTruncate(f.Replica, f.tail, int(f.newBlocks))
		}
	}
	switch {
	case rollback:
		r.idx.rollback(f.Replica, f.tail, int(f.newBlocks))
		r.rollbacks.Add(1)
	case miss:
		r.mispredicts.Add(1)
		p.mispredicts.Add(1)
		p.capEff = max(p.capEff-(predicted-cachedTokens)/r.bt, p.capMax/4, 1)
		r.idx.setCap(p.id, p.capEff)
	case grow:
		if p.capEff < p.capMax {
			p.capEff++
			r.idx.setCap(p.id, p.capEff)
		}
	}
	f.Replica = NoReplica
}

func tailKey(h uint64, id ReplicaID) uint64 { return pairKey(h, id) | 1 }

// finishedTail reports whether block h was the deepest block of a request
// that finished successfully on replica id (lossy: may forget, never
// invents a pair that was not recorded, up to hash collisions).
func (r *Router) finishedTail(h uint64, id ReplicaID) bool {
	k := tailKey(h, id)
	return r.tails[k%tailSlots].Load() == k
}

// turnEntry packs a turns slot: the tail hash's high 32 bits (its low bits
// chose the slot) and the replica.
func turnEntry(h uint64, id ReplicaID) uint64 { return h&^0xFFFFFFFF | uint64(uint32(id)) }

// noteTurn records that a finished request's prompt ended with block h on
// replica id.
func (r *Router) noteTurn(h uint64, id ReplicaID) {
	r.turns[h%tailSlots].Store(turnEntry(h, id))
}

// takeTurn returns the replica that served the latest finished request
// whose prompt ended with block h, if it is still recorded, and forgets
// it: a turn continues once, so other requests that share the prefix up
// to that block (users of one template) are not read as that
// conversation's next turns.
func (r *Router) takeTurn(h uint64) (ReplicaID, bool) {
	s := &r.turns[h%tailSlots]
	e := s.Load()
	if e == 0 || e&^0xFFFFFFFF != h&^0xFFFFFFFF || !s.CompareAndSwap(e, 0) {
		return NoReplica, false
	}
	return ReplicaID(int32(uint32(e))), true
}

// takeTail forgets that block h ended a finished request on replica id,
// if it is still recorded.
func (r *Router) takeTail(h uint64, id ReplicaID) {
	k := tailKey(h, id)
	r.tails[k%tailSlots].CompareAndSwap(k, 0)
}

// ContinuationCredit is the measured number of tokens a replica caches
// beyond the index's prediction when the request's held prefix there ends
// exactly where a finished request's prompt ended (a chat's next turn: the
// engine also cached the previous answer, which the router never hashes).
// The cost policy subtracts it (up to the unmatched rest) from that
// replica's uncached tokens.
func (r *Router) ContinuationCredit() float64 { return loadF(&r.contCredit) }

// pendEntry is one request of replica.pendQ.
type pendEntry struct {
	start, pred int64 // Begin time, predicted TTFT (ns)
	done        bool  // first token seen, or ended without one
}

// begunSince returns how many requests Begin routed to p after its
// count was n (n = 0: all of them).
func (p *replica) begunSince(n uint64) uint64 {
	p.pendMu.Lock()
	hi := p.pendHi
	p.pendMu.Unlock()
	return hi - min(n, hi)
}

// pend queues f, just begun, behind the replica's other requests awaiting
// a first token. Called with the Router's write lock held.
func (p *replica) pend(f *Flight) {
	if !p.model.pendBaseSet { // Begin holds the Router's write lock
		p.pendBase.Store(f.Start)
		p.model.pendBaseSet = true
	}
	p.pendMu.Lock()
	n := p.pendHi - p.pendLo
	if n == uint64(len(p.pendQ)) {
		q := make([]pendEntry, max(8, 2*len(p.pendQ)))
		for s := p.pendLo; s < p.pendHi; s++ {
			q[s&uint64(len(q)-1)] = p.pendQ[s&uint64(len(p.pendQ)-1)]
		}
		p.pendQ = q
	}
	f.pendSeq = p.pendHi
	p.pendQ[p.pendHi&uint64(len(p.pendQ)-1)] = pendEntry{start: f.Start, pred: int64(f.predTTFT * 1e9)}
	p.pendHi++
	if n == 0 {
		p.publishHead()
	}
	p.pendMu.Unlock()
}

// unpend takes f out of the queue (its first token came, or it ended
// without one); when it was the oldest, the next still waiting becomes the
// front.
func (p *replica) unpend(f *Flight) {
	p.pendMu.Lock()
	if f.pendSeq >= p.pendLo && f.pendSeq < p.pendHi {
		mask := uint64(len(p.pendQ) - 1)
		p.pendQ[f.pendSeq&mask].done = true
		if f.pendSeq == p.pendLo {
			for p.pendLo < p.pendHi && p.pendQ[p.pendLo&mask].done {
				p.pendLo++
			}
			p.publishHead()
		}
	}
	p.pendMu.Unlock()
}

// publishHead stores pendQ's front for backlog. Called with pendMu held.
func (p *replica) publishHead() {
	if p.pendLo == p.pendHi {
		p.pendHead.Store(0)
		return
	}
	e := &p.pendQ[p.pendLo&uint64(len(p.pendQ)-1)]
	p.pendHeadPred.Store(e.pred)
	// Begins can reach the lock out of their clocks' order, so a start
	// may precede pendBase; clamped, it cannot read as the 0 of "none".
	p.pendHead.Store(max(e.start-p.pendBase.Load(), 0) + 1)
}
