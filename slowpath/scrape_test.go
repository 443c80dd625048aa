package slowpath

import (
	"testing"
)

func TestParseEngineMetrics(t *testing.T) {
	tests := []struct {
		name string
		body string
		want engineSample
	}{
		{"vllm", `# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="0",model_name="llama"} 12.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="2048",num_cpu_blocks="None"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="llama"} 12345.0
`, engineSample{Waiting: 3, Running: 12, KVUsage: 0.42, KVCapacityTokens: 32768, Counter: 12345, Known: true}},
		{"vllm without prefix caching", `vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="False",num_gpu_blocks="100"} 1.0
`, engineSample{Waiting: 1, KVCapacityTokens: 1600, Counter: -1, Known: true, NoPrefixCache: true}},
		{"vllm old names, two models summed", `vllm:num_requests_waiting{model_name="a"} 1
vllm:num_requests_waiting{model_name="b"} 2
vllm:num_requests_running{model_name="a"} 4 1700000000000
vllm:gpu_cache_usage_perc{model_name="a"} 0.5
`, engineSample{Waiting: 3, Running: 4, KVUsage: 0.5, Counter: -1, Known: true}},
		{"sglang", `# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen"} 7.0
sglang:num_running_reqs{model_name="qwen"} 9.0
sglang:token_usage{model_name="qwen"} 0.28
sglang:cache_config_info{model_name="qwen",page_size="1",max_total_num_tokens="500000"} 1.0
sglang:prompt_tokens_total{model_name="qwen"} 8.128902e+06
`, engineSample{Waiting: 7, Running: 9, KVUsage: 0.28, KVCapacityTokens: 500000, Counter: 8128902, Known: true, SGLang: true}},
		{"llama.cpp", `# HELP llamacpp:requests_processing Number of requests processing.
llamacpp:requests_processing 2
llamacpp:requests_deferred 5
llamacpp:kv_cache_usage_ratio 0.1
llamacpp:prompt_tokens_total 99
`, engineSample{Waiting: 5, Running: 2, KVUsage: 0.1, Counter: 99, Known: true, Llama: true}},
		{"label with braces and escapes", `vllm:num_requests_waiting{model_name="we}ird \"x\""} 4
`, engineSample{Waiting: 4, Counter: -1, Known: true}},
		{"nothing known", "go_goroutines 12\nprocess_cpu_seconds_total 3\n", engineSample{Counter: -1}},
		{"garbage", "vllm:num_requests_waiting{\nvllm:num_requests_running NaNx\n{}\n", engineSample{Counter: -1}},
		{"usage clamped", "vllm:kv_cache_usage_perc 1.7\n", engineSample{KVUsage: 1, Counter: -1, Known: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want // none of these bodies has prefix-cache metrics (TestParseEngineCacheCounters)
			want.PrefixQueries, want.PrefixHits, want.HitRatio = -1, -1, -1
			if got := parseEngineMetrics([]byte(tc.body)); got != want {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func FuzzParseEngineMetrics(f *testing.F) {
	f.Add([]byte("vllm:num_requests_waiting{model_name=\"a\"} 1\n"))
	f.Add([]byte("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\"} 1\n"))
	f.Add([]byte("sglang:cache_config_info{max_total_num_tokens=\"5\"} 1\nllamacpp:requests_deferred 1"))
	f.Add([]byte("x{a=\"\\\"}\"} 1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := parseEngineMetrics(b)
		if s.KVUsage < 0 || s.KVUsage > 1 || s.KVCapacityTokens < 0 {
			t.Fatalf("out of range: %+v", s)
		}
	})
}

func TestCachedTokensJSON(t *testing.T) {
	tests := []struct {
		name, body string
		want       int
	}{
		{"present", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":64}}}`, 64},
		{"absent", `{"usage":{"prompt_tokens":10}}`, -1},
		{"null details", `{"usage":{"prompt_tokens_details":null},"x":"cached_tokens"}`, -1},
		{"not json", `"cached_tokens"{`, -1},
		{"negative", `{"usage":{"prompt_tokens_details":{"cached_tokens":-3}}}`, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ex := &exchange{}
			if got := usageJSON(&ex.fjParser, []byte(tc.body), &ex.timings); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

// The SSE scanner must find the usage chunk however the stream is split.
func TestSSEScanSplits(t *testing.T) {
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":128}}}\n\n" +
		"data: [DONE]\n\n"
	for size := 1; size <= len(stream); size++ {
		ex := &exchange{cached: -1}
		for i := 0; i < len(stream); i += size {
			ex.scan([]byte(stream[i:min(i+size, len(stream))]))
		}
		if ex.cached != 128 {
			t.Fatalf("split %d: cached %d, want 128", size, ex.cached)
		}
	}
}
