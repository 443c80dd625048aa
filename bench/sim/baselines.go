package sim

import (
	"fmt"

	"github.com/warmpath/warmpath/affinity"
)

// The anchors' policies, from their published formulas and defaults, written
// against the same affinity.View as warmpath's own so every policy sees the
// same router-side index and load. Each type documents its source.

// Random ranks uniformly at random.
type Random struct{}

func (Random) Name() string { return "random" }

func (Random) Rank(v *affinity.View, _ *affinity.Request, d *affinity.Decision) {
	s := v.Scores()
	for i := range s {
		s[i] = float64(v.Random() >> 11)
	}
	v.RankLowest(d)
}

// SGLangCacheAware follows the SGLang model gateway's cache_aware policy
// (sgl-model-gateway router_args.py defaults: cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5):
//
//	imbalanced = max_load - min_load > abs  &&  max_load > rel * min_load
//	imbalanced            -> the worker with the fewest running requests
//	match_rate > threshold -> the worker with the longest cached prefix
//	otherwise             -> the worker with the smallest tree (most free cache)
//
// Load is the router's own count of requests in flight per worker, as the
// gateway keeps it. Its approximate radix tree is modelled by warmpath's
// prefix index (the same speculative inserts), and tree size by the tokens
// routed to each worker.
type SGLangCacheAware struct {
	CacheThreshold float64
	AbsThreshold   int
	RelThreshold   float64
	st             *simState
}

func (*SGLangCacheAware) Name() string { return "sglang-cache-aware" }

func (p *SGLangCacheAware) Rank(v *affinity.View, req *affinity.Request, d *affinity.Decision) {
	c := v.Candidates()
	s := v.Scores()
	minL, maxL := int(^uint(0)>>1), 0
	for _, id := range c {
		l := v.Load(id)
		minL = min(minL, l.InFlight)
		maxL = max(maxL, l.InFlight)
	}
	if maxL-minL > p.AbsThreshold && float64(maxL) > p.RelThreshold*float64(minL) {
		for i, id := range c {
			s[i] = float64(v.Load(id).InFlight)
		}
		v.RankLowest(d)
		return
	}
	best := 0
	for _, id := range c {
		best = max(best, v.CachedTokens(id))
	}
	if req.PromptTokens > 0 && float64(best)/float64(req.PromptTokens) > p.CacheThreshold {
		for i, id := range c {
			s[i] = -float64(v.CachedTokens(id))
		}
	} else {
		for i, id := range c {
			s[i] = float64(p.st.treeTokens[id])
		}
	}
	v.RankLowest(d)
}

// LLMD follows llm-d's default scheduling profile (the inference extension's
// endpoint picker): prefix-cache-scorer weight 3, queue-scorer weight 2,
// kv-cache-utilization-scorer weight 2, max-score picker.
//
//	prefix = cached blocks / request blocks
//	queue  = (max_waiting - waiting) / (max_waiting - min_waiting), 1 when all equal
//	kv     = 1 - kv_cache_usage
//	score  = 3*prefix + 2*queue + 2*kv, highest wins
//
// Waiting and KV usage are the scraped engine metrics (stale ones read 0).
type LLMD struct{}

func (LLMD) Name() string { return "llm-d" }

func (LLMD) Rank(v *affinity.View, req *affinity.Request, d *affinity.Decision) {
	c := v.Candidates()
	s := v.Scores()
	minW, maxW := int(^uint(0)>>1), 0
	for _, id := range c {
		w := v.Load(id).Waiting
		minW = min(minW, w)
		maxW = max(maxW, w)
	}
	blocks := len(req.Hashes)
	for i, id := range c {
		l := v.Load(id)
		prefix := 0.0
		if blocks > 0 {
			prefix = float64(v.CachedBlocks(id)) / float64(blocks)
		}
		queue := 1.0
		if maxW > minW {
			queue = float64(maxW-l.Waiting) / float64(maxW-minW)
		}
		kv := 1 - l.KVUsage
		s[i] = -(3*prefix + 2*queue + 2*kv)
	}
	v.RankLowest(d)
}

// DynamoKV follows NVIDIA Dynamo's KV router cost (temperature 0, overlap
// score weight 1):
//
//	prefill_blocks = (pending prefill tokens + request tokens - cached tokens) / block
//	decode_blocks  = (active tokens on the worker + request tokens) / block
//	cost           = overlap_weight * prefill_blocks + decode_blocks, lowest wins
//
// Active tokens are the router's own tally of in-flight requests' prompt and
// output tokens (Dynamo's ActiveSequences); block is the engine block size.
type DynamoKV struct {
	OverlapWeight float64
	BlockTokens   int
	st            *simState
}

func (*DynamoKV) Name() string { return "dynamo-kv" }

func (p *DynamoKV) Rank(v *affinity.View, req *affinity.Request, d *affinity.Decision) {
	c := v.Candidates()
	s := v.Scores()
	bs := float64(p.BlockTokens)
	for i, id := range c {
		l := v.Load(id)
		prefill := float64(l.PendingPrefillTokens+req.PromptTokens-v.CachedTokens(id)) / bs
		decode := float64(p.st.activeTokens[id]+req.PromptTokens) / bs
		s[i] = p.OverlapWeight*prefill + decode
	}
	v.RankLowest(d)
}

// PolicyInfo names a policy the simulator can run and where it comes from.
type PolicyInfo struct {
	Name, Source string
}

// Policies lists every policy the simulator runs: warmpath's built-ins
// (the real affinity code) and the anchors' baselines.
func Policies() []PolicyInfo {
	return []PolicyInfo{
		{"cost", "warmpath default: estimated TTFT (affinity/README.md)"},
		{"round-robin", "warmpath affinity built-in"},
		{"random", "uniform random"},
		{"least-request", "warmpath affinity built-in (fewest in flight)"},
		{"power-of-two", "warmpath affinity built-in (two random choices)"},
		{"consistent-hash", "KubeAI CHWBL: consistent hashing with bounded load 1.25 (affinity built-in)"},
		{"prefix", "vLLM production-stack prefixaware: longest prefix match, random tie, no load (affinity built-in)"},
		{"session", "vLLM production-stack session / sticky sessions (affinity built-in)"},
		{"sglang-cache-aware", "SGLang model gateway cache_aware (threshold 0.3, abs 64, rel 1.5)"},
		{"llm-d", "llm-d default scorers: prefix 3, queue 2, kv-utilization 2, max score"},
		{"dynamo-kv", "NVIDIA Dynamo KV router: overlap_weight*prefill_blocks + decode_blocks"},
		{"oracle", "warmpath cost fed the engines' true cache state (affinity.CacheOracle): the bound for an approximate index"},
	}
}

func newRouter(name string, cfg affinity.Config, st *simState, engineBlock int) (*affinity.Router, error) {
	var p affinity.Policy
	switch name {
	case "random":
		p = Random{}
	case "sglang-cache-aware":
		p = &SGLangCacheAware{CacheThreshold: 0.3, AbsThreshold: 64, RelThreshold: 1.5, st: st}
	case "llm-d":
		p = LLMD{}
	case "dynamo-kv":
		p = &DynamoKV{OverlapWeight: 1, BlockTokens: engineBlock, st: st}
	case "oracle":
		cfg.Policy = "cost"
		r, err := affinity.NewRouter(cfg)
		if err != nil {
			return nil, err
		}
		r.SetCacheOracle(engineOracle{st})
		return r, nil
	default:
		for _, n := range affinity.PolicyNames() {
			if n == name {
				cfg.Policy = name
				return affinity.NewRouter(cfg)
			}
		}
		names := []string{}
		for _, pi := range Policies() {
			names = append(names, pi.Name)
		}
		return nil, fmt.Errorf("sim: policy %q: want one of %v", name, names)
	}
	return affinity.NewRouterWithPolicy(cfg, p)
}

// readsPrefixCacheFlag reports whether the router of the named policy
// learns that an engine runs without prefix caching (the simulator then
// passes vLLM's enable_prefix_caching="False" on in its signals):
// warmpath's policies read it from cache_config_info, and Dynamo sees it
// as the absence of KV events. The SGLang gateway's and llm-d's
// approximate trackers of routed prompts read no such signal.
func readsPrefixCacheFlag(policy string) bool {
	return policy != "sglang-cache-aware" && policy != "llm-d"
}

var (
	_ affinity.Policy = Random{}
	_ affinity.Policy = (*SGLangCacheAware)(nil)
	_ affinity.Policy = LLMD{}
	_ affinity.Policy = (*DynamoKV)(nil)
)
