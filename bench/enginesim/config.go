package enginesim

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
)

// Config configures one simulated engine. Field names follow vLLM's flags
// (--served-model-name, --block-size, --num-gpu-blocks-override, ...). Start
// from DefaultConfig and override; a zero field is NOT replaced by its
// default, Validate rejects it.
type Config struct {
	// ServedModelNames are the names the engine answers to (--served-model-name).
	// The first one is the model_name label of every metric. Default:
	// ["meta-llama/Llama-3.1-8B-Instruct"]. Required, no empty names.
	ServedModelNames []string
	// LoRAModules are extra served model names, each "name" or "name=path"
	// (--lora-modules). Adapters do not share KV blocks with the base model
	// or with each other. Default none.
	LoRAModules []string

	// BlockSize is the number of tokens per KV block (--block-size). Default 16.
	BlockSize int
	// NumGPUBlocks is the KV cache capacity in blocks
	// (--num-gpu-blocks-override). Default 25000 (Llama-3.1-8B, bf16, one
	// H100 80GB at gpu_memory_utilization 0.9; derivation in README.md).
	NumGPUBlocks int
	// MaxNumSeqs bounds the running batch (--max-num-seqs). Default 1024
	// (vLLM's API-server default on a >= 70 GiB GPU such as the H100).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget shared by (chunked)
	// prefills and decodes (--max-num-batched-tokens). Default 8192 (vLLM's
	// API-server default on a >= 70 GiB GPU).
	MaxNumBatchedTokens int
	// MaxModelLen bounds prompt + output tokens of one request
	// (--max-model-len). Default 131072 (Llama-3.1's context).
	MaxModelLen int
	// DisablePrefixCaching turns automatic prefix caching off
	// (--no-enable-prefix-caching). Zero value: caching on, like vLLM V1.
	DisablePrefixCaching bool
	// Slots > 0 switches to llama.cpp's server model (-np / --parallel):
	// Slots requests run at once (MaxNumSeqs is ignored), each in its own
	// slot of NumGPUBlocks/Slots blocks of context, and there is no shared
	// paged prefix cache: each slot keeps the tokens of the last request it
	// ran, and a request reuses only the common prefix with the slot it is
	// given (llama.cpp picks the idle slot whose cached prompt shares the
	// largest fraction of the request, above --slot-prompt-similarity 0.1,
	// else the least recently used idle slot). 0: vLLM's paged cache.
	Slots int
	// CacheRAMTokens is the slot model's host prompt cache (llama.cpp
	// --cache-ram), in tokens: when the engine gives a request the least
	// recently used slot, or a slot that keeps under half its tokens, it
	// saves the slot's prompt there (evicting the oldest to make room),
	// then loads the cached prompt that beats the slot for the request
	// (it leaves the cache) (server get_available_slot, prompt_save /
	// prompt_load, server_prompt_cache, b11669). An empty slot consults
	// nothing.
	// 0: no host cache (--cache-ram 0). llama.cpp's default is 8 GiB:
	// 65,536 tokens of Llama-3.1-8B's 128 KiB per token (bf16).
	CacheRAMTokens int

	// TimeScale maps model time to wall time in the HTTP server: wall =
	// model × TimeScale. 1 is real time, 0.01 runs 100× faster than life.
	// Ignored by the virtual-time Engine. Default 1; must be > 0.
	TimeScale float64
	// Seed makes output lengths, output text and injected errors
	// deterministic. Default 0.
	Seed uint64

	// Timing is the step-duration model. Default: DefaultTiming().
	Timing Timing
	// OutputLen is the output-length distribution used when a request sets
	// no max_tokens. Default: DefaultOutputLen().
	OutputLen OutputLen

	// Faults injected from the start (the admin endpoint and SetFaults
	// change them later). Zero value: no faults.
	Faults Faults
	// EnableAdmin serves POST /admin/faults and POST /admin/restart (anyone
	// who reaches the engine could inject faults or wipe its cache). Default
	// false.
	// Default true.
	EnableAdmin bool

	// Logger receives start-up and fault logs; nil means slog.Default().
	Logger *slog.Logger
}

// Timing is the step-duration model:
//
//	step = StepBase + prefill_tokens×PerPrefillToken + decode_seqs×PerDecodeSeq
//	       + decode_context_tokens×PerContextToken
//	       + prefill_attention_pairs/1000×PerPrefillKPairs
//	       + prefill_chunks×PerPrefillChunk + chunk_context_tokens×PerChunkContextToken
//
// prefill_tokens counts only tokens computed in the step: cached prefix
// tokens cost nothing. decode_context_tokens is the sum, over sequences
// decoding in the step, of the tokens already in their KV cache (attention
// reads). prefill_attention_pairs is the attention work of the prefill
// chunks: a chunk of n tokens after c computed ones attends to
// n×c + n(n+1)/2 (query, key) pairs, so a cold prompt of L tokens costs
// about L²/2 pairs: the quadratic term of long prompts. prefill_chunks
// counts the sequences prefilling in the step and chunk_context_tokens sums
// their c: what a prompt costs apart from its tokens and pairs, and what a
// short chunk pays to attend over a long context beyond its pairs (on a CPU
// llama.cpp server a 16-token question after 4,096 cached tokens took
// 10-13 ms where its tokens and pairs priced 4 ms; GPU engines batch such
// chunks well, and DefaultTiming has both at 0). All values are model
// time; see README.md for the calibration.
type Timing struct {
	StepBase             time.Duration // default 7ms
	PerPrefillToken      time.Duration // default 40µs
	PerDecodeSeq         time.Duration // default 80µs
	PerContextToken      time.Duration // default 50ns
	PerPrefillKPairs     time.Duration // per 1000 prefill attention pairs; default 1.31µs
	PerPrefillChunk      time.Duration // per sequence prefilling in a step; default 0
	PerChunkContextToken time.Duration // per token in context before a prefill chunk; default 0
}

// DefaultTiming is calibrated to Llama-3.1-8B-Instruct, bf16, on one H100
// SXM 80GB under vLLM (README.md: "Timing model").
func DefaultTiming() Timing {
	return Timing{
		StepBase:        7 * time.Millisecond,
		PerPrefillToken: 40 * time.Microsecond,
		PerDecodeSeq:    80 * time.Microsecond,
		PerContextToken: 50 * time.Nanosecond,
		// attention: 4 × 32 layers × 4096 dims = 524k FLOP per (query,
		// key) pair at the same 400 TFLOP/s as PerPrefillToken (README.md)
		PerPrefillKPairs: 1310 * time.Nanosecond,
	}
}

// OutputLen is a log-normal output-length distribution, clamped to
// [Min, Max] and to the model length. The sampled sequence ends with an EOS
// token (finish_reason "stop").
type OutputLen struct {
	Median int     // default 150 tokens
	Sigma  float64 // log-space standard deviation, default 0.9
	Min    int     // default 1
	Max    int     // default 2048
}

// DefaultOutputLen is a ShareGPT-like answer length: median 150 tokens,
// mean about 225, 95th percentile about 660.
func DefaultOutputLen() OutputLen { return OutputLen{Median: 150, Sigma: 0.9, Min: 1, Max: 2048} }

// Faults are injected failures. The zero value injects nothing.
type Faults struct {
	// Latency is added before each API request (/v1/*) is handled. Model
	// time: the wall delay is Latency×TimeScale.
	Latency time.Duration
	// ErrorRate is the fraction (0..1) of API requests answered with
	// ErrorStatus. Deterministic for a Seed.
	ErrorRate float64
	// ErrorStatus is the status of injected errors; 0 means 500.
	ErrorStatus int
	// Hang makes API requests never answer until the client gives up or
	// the server closes.
	Hang bool
	// CloseAfterChunks > 0 closes the connection of a streaming response
	// after that many content chunks (a non-streaming response is cut
	// before its body). The request is aborted in the engine.
	CloseAfterChunks int
	// StallAfterChunks > 0 stops a streaming response after that many
	// content chunks without closing it: the stream hangs until the client
	// gives up (the request is then aborted in the engine).
	StallAfterChunks int
	// MetricsGarbage makes /metrics answer unparsable text.
	MetricsGarbage bool
	// MetricsStall makes /metrics hang until the client gives up.
	MetricsStall bool
	// Unhealthy makes /health answer 503.
	Unhealthy bool
}

// DefaultConfig returns a Llama-3.1-8B-on-one-H100 engine in real time.
func DefaultConfig() Config {
	return Config{
		ServedModelNames:    []string{"meta-llama/Llama-3.1-8B-Instruct"},
		BlockSize:           16,
		NumGPUBlocks:        25000,
		MaxNumSeqs:          1024,
		MaxNumBatchedTokens: 8192,
		MaxModelLen:         131072,
		TimeScale:           1,
		Timing:              DefaultTiming(),
		OutputLen:           DefaultOutputLen(),
		EnableAdmin:         false, // fault injection and restarts are for tests: asked for, never by default
	}
}

// Validate reports the first invalid field, naming it and its allowed range.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(c.ServedModelNames) == 0 {
		bad("ServedModelNames: at least one name required")
	}
	seen := map[string]bool{}
	names := append(append([]string(nil), c.ServedModelNames...), c.loraNames()...)
	for _, n := range names {
		switch {
		case strings.TrimSpace(n) == "":
			bad("ServedModelNames/LoRAModules: empty name")
		case seen[n]:
			bad("ServedModelNames/LoRAModules: duplicate name %q", n)
		}
		seen[n] = true
	}
	if c.BlockSize < 1 || c.BlockSize > 1024 {
		bad("BlockSize: %d not in [1, 1024]", c.BlockSize)
	}
	if c.NumGPUBlocks < 1 || c.NumGPUBlocks > 1<<30 {
		bad("NumGPUBlocks: %d not in [1, 2^30]", c.NumGPUBlocks)
	}
	if c.MaxNumSeqs < 1 {
		bad("MaxNumSeqs: %d must be >= 1", c.MaxNumSeqs)
	}
	if c.CacheRAMTokens < 0 {
		bad("CacheRAMTokens: %d, want >= 0", c.CacheRAMTokens)
	}
	if c.Slots < 0 || (c.Slots > 0 && c.Slots > c.NumGPUBlocks) {
		bad("Slots: %d not in [0, NumGPUBlocks=%d]", c.Slots, c.NumGPUBlocks)
	}
	if c.MaxNumBatchedTokens < 1 {
		bad("MaxNumBatchedTokens: %d must be >= 1", c.MaxNumBatchedTokens)
	}
	if c.MaxModelLen < 2 {
		bad("MaxModelLen: %d must be >= 2", c.MaxModelLen)
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		bad("TimeScale: %v must be > 0 and finite", c.TimeScale)
	}
	t := c.Timing
	if t.StepBase < 0 || t.PerPrefillToken < 0 || t.PerDecodeSeq < 0 || t.PerContextToken < 0 || t.PerPrefillKPairs < 0 ||
		t.PerPrefillChunk < 0 || t.PerChunkContextToken < 0 {
		bad("Timing: durations must be >= 0")
	}
	if t.StepBase+t.PerPrefillToken+t.PerDecodeSeq <= 0 {
		bad("Timing: StepBase + PerPrefillToken + PerDecodeSeq must be > 0 (steps would take no time)")
	}
	o := c.OutputLen
	if o.Median < 1 || o.Min < 1 || o.Max < o.Min || o.Sigma < 0 || math.IsNaN(o.Sigma) {
		bad("OutputLen: need Median >= 1, 1 <= Min <= Max, Sigma >= 0 (got %+v)", o)
	}
	if err := c.Faults.validate(); err != nil {
		bad("%w", err)
	}
	return errors.Join(errs...)
}

func (f Faults) validate() error {
	if !(f.ErrorRate >= 0 && f.ErrorRate <= 1) {
		return fmt.Errorf("Faults.ErrorRate: %v not in [0, 1]", f.ErrorRate)
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		return fmt.Errorf("Faults.ErrorStatus: %d not in [400, 599]", f.ErrorStatus)
	}
	if f.Latency < 0 {
		return fmt.Errorf("Faults.Latency: %v must be >= 0", f.Latency)
	}
	if f.CloseAfterChunks < 0 {
		return fmt.Errorf("Faults.CloseAfterChunks: %d must be >= 0", f.CloseAfterChunks)
	}
	if f.StallAfterChunks < 0 {
		return fmt.Errorf("Faults.StallAfterChunks: %d must be >= 0", f.StallAfterChunks)
	}
	return nil
}

// loraNames returns the adapter names of LoRAModules ("name=path" -> name).
func (c Config) loraNames() []string {
	out := make([]string, 0, len(c.LoRAModules))
	for _, m := range c.LoRAModules {
		name, _, _ := strings.Cut(m, "=")
		out = append(out, strings.TrimSpace(name))
	}
	return out
}
