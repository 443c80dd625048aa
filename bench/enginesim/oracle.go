package enginesim

import "github.com/zeebo/xxh3"

// CachedPrefixTokens is how many leading tokens of prompt (engine form, as
// in Request.Prompt) the prefix cache holds right now for the given LoRA
// adapter and cache salt: exactly the hit a request with that prompt would
// get if it were scheduled now (whole blocks, at most all but the last
// token, 0 with prefix caching disabled). It is read-only (no LRU touch, no
// counters) and allocates nothing: the simulator's cache oracle asks every
// engine this for each routing decision.
func (e *Engine) CachedPrefixTokens(prompt []byte, adapter, salt string) int {
	p := tokensOf(len(prompt))
	if !e.caching || p == 0 {
		return 0
	}
	parent := xxh3.HashStringSeed(salt, xxh3.HashString(adapter)^0x5eed) // as Submit's seq.root
	step := e.bs * BytesPerToken
	maxHit := (p - 1) / e.bs // as plan: a hit never covers the last prompt token
	for k := range maxHit {
		h := xxh3.HashSeed(prompt[k*step:(k+1)*step], parent) // as hashBlock for full prompt blocks
		if h == 0 {
			h = 1
		}
		if e.pool.lookup(h) < 0 {
			return k * e.bs
		}
		parent = h
	}
	return maxHit * e.bs
}
