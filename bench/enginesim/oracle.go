package enginesim

import "github.com/zeebo/xxh3"

// CachedPrefixTokens is how many leading tokens of prompt (engine form, as
// in Request.Prompt) the engine holds for the given LoRA adapter and cache
// salt, or will hold before a request submitted now is scheduled: blocks in
// the prefix cache plus blocks of requests already waiting or running here
// (they are computed first, FCFS). Whole blocks, at most all but the last
// token, 0 with prefix caching disabled: the hit such a request would get.
// It is read-only (no LRU touch, no counters) and allocates nothing: the
// simulator's cache oracle asks every engine this for each routing decision.
func (e *Engine) CachedPrefixTokens(prompt []byte, adapter, salt string) int {
	p := tokensOf(len(prompt))
	if !e.caching || p == 0 {
		return 0
	}
	parent := hashRoot(adapter, salt) // as Submit's seq.root
	step := e.bs * BytesPerToken
	maxHit := (p - 1) / e.bs // as plan: a hit never covers the last prompt token
	var follow *seq          // an in-flight sequence sharing the chain so far
	held := int32(-1)        // the block caching the chain's hash so far, -1 none
	for k := range maxHit {
		h := xxh3.HashSeed(prompt[k*step:(k+1)*step], parent) // as hashBlock for full prompt blocks
		if h == 0 {
			h = 1
		}
		parent = h
		held = e.pool.lookupAfter(held, h)
		if follow != nil && k < len(follow.hashes) && follow.hashes[k] == h {
			continue
		}
		if held >= 0 {
			continue
		}
		// Chained hashes: a sequence with hash h at block k shares blocks 0..k.
		if follow = e.inFlightWith(k, h); follow == nil {
			return k * e.bs
		}
	}
	return maxHit * e.bs
}

// inFlightWith returns a running or waiting sequence whose block k hashes
// to h, or nil.
func (e *Engine) inFlightWith(k int, h uint64) *seq {
	for _, s := range e.running {
		if k < len(s.hashes) && s.hashes[k] == h {
			return s
		}
	}
	q := &e.waiting
	for i := range q.n {
		s := q.buf[(q.head+i)%len(q.buf)]
		if k < len(s.hashes) && s.hashes[k] == h {
			return s
		}
	}
	return nil
}
