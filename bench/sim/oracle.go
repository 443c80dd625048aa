package sim

import "github.com/warmpath/warmpath/affinity"

// engineOracle feeds the cost policy the engines' true cache state: for each
// candidate it asks that engine how many leading tokens of the request being
// decided (simState.enginePrompt, the engines' own prompt form) its prefix
// cache holds now. The "oracle" policy is the cost policy with this oracle:
// the bound an approximate router (speculative index, corrected only by
// cached_tokens) can hope to reach with the same formula.
type engineOracle struct{ st *simState }

func (o engineOracle) CachedTokens(id affinity.ReplicaID, _ *affinity.Request) int {
	if int(id) < 0 || int(id) >= len(o.st.engines) {
		return 0
	}
	return o.st.engines[id].CachedPrefixTokens(o.st.enginePrompt, o.st.adapter, "")
}

var _ affinity.CacheOracle = engineOracle{}
