package affinity

// CacheOracle reports how many leading tokens of req a replica truly holds
// in its KV cache, read from the engine itself rather than from the router's
// speculative index. It exists for the simulator's oracle-fed bound (what an
// approximate router could reach with perfect cache knowledge) and for
// deployments that can ask engines directly (KV events). CachedTokens is
// called during Decide, under the Router's read lock, once per candidate: it
// must be safe for concurrent use, fast, and must not call back into the
// Router. A negative answer reads as 0.
type CacheOracle interface {
	CachedTokens(id ReplicaID, req *Request) int
}

// oracleBox holds a CacheOracle behind an atomic pointer (an interface value
// cannot be swapped atomically).
type oracleBox struct{ o CacheOracle }

// SetCacheOracle makes View.CachedBlocks and View.CachedTokens (and so every
// built-in policy, the cost policy included, and Decision.CachedTokens)
// answer from o for the candidates of each decision instead of the prefix
// index. nil turns it off (the default): then the only cost is one atomic
// load per decision. The index is still maintained either way (Begin and End
// behave as without an oracle), so turning the oracle off falls back to a
// warm index.
func (r *Router) SetCacheOracle(o CacheOracle) {
	if o == nil {
		r.oracle.Store(nil)
		return
	}
	r.oracle.Store(&oracleBox{o})
}

// oracleMatch fills v's per-replica cached prefix from o for every
// candidate: tokens in v.otok (by ReplicaID), whole blocks in v.ms.
func (v *View) oracleMatch(o CacheOracle) {
	n := len(v.r.reps)
	if cap(v.otok) < n {
		v.otok = make([]int32, n, n+n/2)
	}
	v.otok = v.otok[:n]
	clear(v.otok)
	bt := v.r.bt
	for _, id := range v.cands {
		t := min(max(o.CachedTokens(id, v.req), 0), 1<<31-1)
		if t == 0 {
			continue
		}
		v.otok[id] = int32(t)
		v.ms.raise(id, int32(t/bt)) // lists id as a holder (Sample) even below one block
	}
	v.oracle = true
}
