package slowpath

import "testing"

// TestParseEngineCacheCounters: the engines' own prefix-cache metrics are
// read (vLLM's both names, summed over models; SGLang's hit rate, clamped)
// and absent ones stay -1.
func TestParseEngineCacheCounters(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		body                    string
		queries, hits, hitRatio float64
	}{
		{"vllm", "vllm:num_requests_waiting 1\nvllm:prefix_cache_queries_total{model_name=\"a\"} 1000\nvllm:prefix_cache_queries_total{model_name=\"b\"} 24\nvllm:prefix_cache_hits_total{model_name=\"a\"} 640\n", 1024, 640, -1},
		{"vllm old names", "vllm:num_requests_waiting 1\nvllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 0\n", 10, 0, -1},
		{"sglang", "sglang:num_queue_reqs 2\nsglang:cache_hit_rate 0.75\n", -1, -1, 0.75},
		{"sglang clamped", "sglang:num_queue_reqs 2\nsglang:cache_hit_rate 7\n", -1, -1, 1},
		{"none", "vllm:num_requests_waiting 1\n", -1, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := parseEngineMetrics([]byte(tc.body))
			if s.PrefixQueries != tc.queries || s.PrefixHits != tc.hits || s.HitRatio != tc.hitRatio {
				t.Fatalf("queries %v hits %v ratio %v, want %v %v %v", s.PrefixQueries, s.PrefixHits, s.HitRatio, tc.queries, tc.hits, tc.hitRatio)
			}
		})
	}
}

// TestUsageTokens reads prompt and completion tokens from the last usage
// object only; missing or malformed ones are -1.
func TestUsageTokens(t *testing.T) {
	var ex exchange
	for _, tc := range []struct {
		name           string
		body           string
		prompt, output int
	}{
		{"chat", `{"choices":[{"message":{"content":"\"usage\": not this"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`, 12, 5},
		{"stream chunk", `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":2}}}`, 3, 9},
		{"null usage", `{"choices":[],"usage":null}`, -1, -1},
		{"no usage", `{"choices":[]}`, -1, -1},
		{"negative", `{"usage":{"prompt_tokens":-3,"completion_tokens":"x"}}`, -1, -1},
		{"truncated", `{"usage":{"prompt_tokens":3,"completion_tokens":9`, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, o := usageTokens(&ex.fjParser, []byte(tc.body))
			if p != tc.prompt || o != tc.output {
				t.Fatalf("got %d, %d; want %d, %d", p, o, tc.prompt, tc.output)
			}
		})
	}
}
