package slowpath

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// engineSample is what one /metrics scrape yields. Values are summed over
// label sets (one engine may serve several model names).
type engineSample struct {
	Waiting, Running int
	KVUsage          float64 // 0..1
	KVCapacityTokens int     // 0 = not reported
	// Counter is a monotonically increasing engine counter (prompt tokens or
	// requests processed); a decrease means the engine restarted and lost its
	// cache. -1 = not reported.
	Counter float64
	// PrefixQueries and PrefixHits are the engine's own prefix-cache
	// counters, in tokens (vLLM prefix_cache_queries_total /
	// prefix_cache_hits_total); HitRatio is SGLang's cache_hit_rate. -1 =
	// not reported.
	PrefixQueries, PrefixHits, HitRatio float64
	Known                               bool // at least one known gauge was present
	Llama                               bool // llama.cpp's names: its /props gives the batch slots
	SGLang                              bool // SGLang's names: its /get_server_info gives the batch slots
	// NoPrefixCache: cache_config_info says enable_prefix_caching="False"
	// (vLLM --no-enable-prefix-caching): the engine keeps nothing between
	// requests.
	NoPrefixCache bool
}

// metric families we read, by engine.
var (
	// vLLM
	mVLLMWaiting   = []byte("vllm:num_requests_waiting")
	mVLLMRunning   = []byte("vllm:num_requests_running")
	mVLLMKVUsage   = []byte("vllm:kv_cache_usage_perc")
	mVLLMGPUUsage  = []byte("vllm:gpu_cache_usage_perc") // vLLM < 0.10 name
	mVLLMCacheInfo = []byte("vllm:cache_config_info")
	mVLLMPrompt    = []byte("vllm:prompt_tokens_total")
	mVLLMQueries   = []byte("vllm:prefix_cache_queries_total")
	mVLLMHits      = []byte("vllm:prefix_cache_hits_total")
	mVLLMGPUQuery  = []byte("vllm:gpu_prefix_cache_queries_total") // vLLM < 0.10 names
	mVLLMGPUHits   = []byte("vllm:gpu_prefix_cache_hits_total")
	mSGLHitRate    = []byte("sglang:cache_hit_rate")
	// SGLang
	mSGLWaiting   = []byte("sglang:num_queue_reqs")
	mSGLRunning   = []byte("sglang:num_running_reqs")
	mSGLUsage     = []byte("sglang:token_usage")
	mSGLCacheInfo = []byte("sglang:cache_config_info")
	mSGLPrompt    = []byte("sglang:prompt_tokens_total")
	// llama.cpp (server --metrics)
	mLlamaRunning = []byte("llamacpp:requests_processing")
	mLlamaWaiting = []byte("llamacpp:requests_deferred")
	mLlamaUsage   = []byte("llamacpp:kv_cache_usage_ratio")
	mLlamaPrompt  = []byte("llamacpp:prompt_tokens_total")

	lblBlockSize = []byte("block_size")
	lblNumBlocks = []byte("num_gpu_blocks")
	lblPageSize  = []byte("page_size")
	lblMaxTokens = []byte("max_total_num_tokens")
	lblPrefixOn  = []byte("enable_prefix_caching")
)

// parseEngineMetrics reads the Prometheus text exposition of a vLLM, SGLang
// or llama.cpp server. Unknown lines are skipped; it never fails, a body with
// none of the known names returns Known=false.
func parseEngineMetrics(body []byte) engineSample {
	s := engineSample{Counter: -1, PrefixQueries: -1, PrefixHits: -1, HitRatio: -1}
	var usageSum float64
	var usageN int
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, labels, val, ok := splitSample(line)
		if !ok {
			continue
		}
		switch {
		case bytes.Equal(name, mVLLMWaiting), bytes.Equal(name, mSGLWaiting), bytes.Equal(name, mLlamaWaiting):
			s.Waiting += int(val)
			s.Known = true
			s.Llama = s.Llama || bytes.Equal(name, mLlamaWaiting)
			s.SGLang = s.SGLang || bytes.Equal(name, mSGLWaiting)
		case bytes.Equal(name, mVLLMRunning), bytes.Equal(name, mSGLRunning), bytes.Equal(name, mLlamaRunning):
			s.Running += int(val)
			s.Known = true
			s.Llama = s.Llama || bytes.Equal(name, mLlamaRunning)
		case bytes.Equal(name, mVLLMKVUsage), bytes.Equal(name, mVLLMGPUUsage), bytes.Equal(name, mSGLUsage), bytes.Equal(name, mLlamaUsage):
			usageSum += val
			usageN++
			s.Known = true
		case bytes.Equal(name, mVLLMCacheInfo), bytes.Equal(name, mSGLCacheInfo):
			if c := capacityFromLabels(labels); c > 0 {
				s.KVCapacityTokens = c
			}
			// Python's str(False); any other value (True, None, absent)
			// leaves the prefix cache presumed on
			if v := labelValue(labels, lblPrefixOn); v != nil && bytes.EqualFold(v, []byte("false")) {
				s.NoPrefixCache = true
			}
		case bytes.Equal(name, mVLLMQueries), bytes.Equal(name, mVLLMGPUQuery):
			s.PrefixQueries = max(s.PrefixQueries, 0) + val
		case bytes.Equal(name, mVLLMHits), bytes.Equal(name, mVLLMGPUHits):
			s.PrefixHits = max(s.PrefixHits, 0) + val
		case bytes.Equal(name, mSGLHitRate):
			s.HitRatio = min(max(val, 0), 1)
		case bytes.Equal(name, mVLLMPrompt), bytes.Equal(name, mSGLPrompt), bytes.Equal(name, mLlamaPrompt):
			if s.Counter < 0 {
				s.Counter = 0
			}
			s.Counter += val
		}
	}
	if usageN > 0 {
		s.KVUsage = usageSum / float64(usageN)
		if s.KVUsage < 0 {
			s.KVUsage = 0
		}
		if s.KVUsage > 1 {
			s.KVUsage = 1
		}
	}
	return s
}

// splitSample splits `name{labels} value [timestamp]`.
func splitSample(line []byte) (name, labels []byte, val float64, ok bool) {
	i := bytes.IndexAny(line, "{ \t")
	if i <= 0 {
		return nil, nil, 0, false
	}
	name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		j := closingBrace(rest)
		if j < 0 {
			return nil, nil, 0, false
		}
		labels = rest[1:j]
		rest = rest[j+1:]
	}
	rest = bytes.TrimLeft(rest, " \t")
	if k := bytes.IndexAny(rest, " \t"); k >= 0 {
		rest = rest[:k]
	}
	v, err := strconv.ParseFloat(string(rest), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) { // no gauge we read means anything as NaN/Inf
		return nil, nil, 0, false
	}
	return name, labels, v, true
}

// closingBrace finds the '}' that ends a label set, skipping quoted values.
func closingBrace(b []byte) int {
	inQuote := false
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			if inQuote {
				i++
			}
		case '"':
			inQuote = !inQuote
		case '}':
			if !inQuote {
				return i
			}
		}
	}
	return -1
}

// labelValue returns the value of label key in a `k="v",k2="v2"` list.
func labelValue(labels, key []byte) []byte {
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return nil
		}
		k := bytes.TrimSpace(labels[:eq])
		rest := labels[eq+2:]
		end := -1
		for i := 0; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++
				continue
			}
			if rest[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return nil
		}
		if bytes.Equal(k, key) {
			return rest[:end]
		}
		labels = bytes.TrimLeft(rest[end+1:], ", ")
	}
	return nil
}

// capacityFromLabels reads the KV capacity, in tokens, from a
// cache_config_info label set: max_total_num_tokens (SGLang) or
// block_size (or page_size) * num_gpu_blocks (vLLM).
func capacityFromLabels(labels []byte) int {
	if v := labelValue(labels, lblMaxTokens); v != nil {
		n, _ := strconv.Atoi(string(v))
		return max(n, 0)
	}
	bs := labelValue(labels, lblBlockSize)
	if bs == nil {
		bs = labelValue(labels, lblPageSize)
	}
	nb := labelValue(labels, lblNumBlocks)
	if bs == nil || nb == nil {
		return 0
	}
	b, err1 := strconv.Atoi(string(bs))
	n, err2 := strconv.Atoi(string(nb))
	if err1 != nil || err2 != nil || b <= 0 || n <= 0 {
		return 0
	}
	return b * n
}

// engineProps is what an engine's own description says about capacity:
// llama.cpp's GET /props, SGLang's GET /get_server_info.
type engineProps struct {
	TotalSlots  int // requests run at once: llama.cpp total_slots (-np), SGLang max_running_requests
	SlotContext int // llama.cpp default_generation_settings.n_ctx: context per slot
	// NoPrefixCache: SGLang's disable_radix_cache (--disable-radix-cache),
	// which its /metrics do not show.
	NoPrefixCache bool
	// FreshSlots: llama.cpp slots that held no prompt when /props was
	// read (its /slots, read with it; 0 when unreadable, e.g. --no-slots).
	FreshSlots int
}

// maxPropsSlots bounds a believable total_slots.
const maxPropsSlots = 1 << 16

// parseProps reads llama.cpp's /props body (control plane: encoding/json).
func parseProps(body []byte) (engineProps, error) {
	var v struct {
		TotalSlots *int `json:"total_slots"`
		Default    struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return engineProps{}, fmt.Errorf("props: %w", err)
	}
	if v.TotalSlots == nil || *v.TotalSlots < 1 || *v.TotalSlots > maxPropsSlots {
		return engineProps{}, fmt.Errorf("props: total_slots missing or out of range 1..%d", maxPropsSlots)
	}
	return engineProps{TotalSlots: *v.TotalSlots, SlotContext: max(v.Default.NCtx, 0)}, nil
}

// parseSlots counts the slots in llama.cpp's /slots body that run nothing
// and hold no prompt: a slot that never ran a task has no n_prompt_tokens
// (b11669). Control plane: encoding/json.
func parseSlots(body []byte) (fresh int, err error) {
	var v []struct {
		Processing bool `json:"is_processing"`
		Prompt     int  `json:"n_prompt_tokens"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return 0, fmt.Errorf("slots: %w", err)
	}
	for _, sl := range v {
		if !sl.Processing && sl.Prompt == 0 {
			fresh++
		}
	}
	return fresh, nil
}

// parseServerInfo reads SGLang's /get_server_info body: its server
// arguments at the top level, and each scheduler's effective values in
// internal_states (max_running_requests is null among the arguments
// unless --max-running-requests was given, and the scheduler's figure
// is what it runs). Control plane: encoding/json.
func parseServerInfo(body []byte) (engineProps, error) {
	var v struct {
		MaxRunning        *int  `json:"max_running_requests"`
		DisableRadixCache *bool `json:"disable_radix_cache"`
		Internal          []struct {
			MaxRunning *int `json:"max_running_requests"`
		} `json:"internal_states"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return engineProps{}, fmt.Errorf("get_server_info: %w", err)
	}
	n := 0
	for _, st := range v.Internal {
		if st.MaxRunning != nil && *st.MaxRunning > n {
			n = *st.MaxRunning
		}
	}
	if n == 0 && v.MaxRunning != nil {
		n = *v.MaxRunning
	}
	if n < 1 || n > maxPropsSlots {
		return engineProps{}, fmt.Errorf("get_server_info: max_running_requests missing or out of range 1..%d", maxPropsSlots)
	}
	return engineProps{TotalSlots: n, NoPrefixCache: v.DisableRadixCache != nil && *v.DisableRadixCache}, nil
}
