package sim

import (
	"fmt"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// FleetInfo names an engine fleet the simulator can run.
type FleetInfo struct {
	Name, About string
}

// Fleets lists the fleets FleetEngines builds: engines as production runs
// them, not all alike.
func Fleets() []FleetInfo {
	return []FleetInfo{
		{"vllm", "vLLM defaults on one H100 each: max_num_seqs 1024, 8192 batched tokens, paged prefix cache (enginesim.DefaultConfig)"},
		{"batch-4", "vLLM with --max-num-seqs 4"},
		{"batch-16", "vLLM with --max-num-seqs 16"},
		{"batch-64", "vLLM with --max-num-seqs 64"},
		{"hetero", "mixed generations: of every 4 replicas 2 at full speed, 1 at 2x and 1 at 3x the step times (an A100-class GPU is ~2-3x slower than an H100)"},
		{"no-cache", "vLLM with --no-enable-prefix-caching"},
		{"llamacpp", "llama.cpp server -np 4 -c 131072 -b 2048: 4 slots of 32768 tokens, each caching only its last prompt, and the default 8 GiB host prompt cache (65,536 tokens)"},
		{"llamacpp-cpu", "the llamacpp fleet on CPU cores, timed like the live bench's llama.cpp servers (BenchmarkEngineTiming): a decode step 0.3 ms and 0.5 ms per running sequence, plus 0.18 ms per 1,000 tokens of their context (1.5 ms alone after a 4,096-token prompt), a prompt 1.9 ms, plus 45 us a token, 55 us per 1,000 attention pairs and 0.8 us per token it reuses (4,096 tokens cold: 0.65 s; 16 new after 4,096 reused: 9.7 ms); a prompt costs more than its answer, the reverse of the GPU fleets"},
	}
}

// FleetEngines returns the per-replica engine configs of fleet name for n
// replicas, built from enginesim.DefaultConfig. Deterministic: a fleet is a
// pattern by replica index, not a draw.
func FleetEngines(name string, n int) ([]enginesim.Config, error) {
	base := enginesim.DefaultConfig()
	out := make([]enginesim.Config, n)
	for i := range out {
		e := base
		switch name {
		case "vllm":
		case "batch-4":
			e.MaxNumSeqs = 4
		case "batch-16":
			e.MaxNumSeqs = 16
		case "batch-64":
			e.MaxNumSeqs = 64
		case "hetero":
			e.Timing = scaleTiming(e.Timing, []float64{1, 1, 2, 3}[i%4])
		case "no-cache":
			e.DisablePrefixCaching = true
		case "llamacpp", "llamacpp-cpu":
			e.Slots = 4
			e.CacheRAMTokens = 65536 // --cache-ram 8192 (MiB, the default) at 128 KiB per token
			e.NumGPUBlocks = 131072 / e.BlockSize
			e.MaxNumBatchedTokens = 2048
			if name == "llamacpp-cpu" {
				// BenchmarkEngineTiming (bench/llamacpp): one live
				// server's own timings fitted to the step model, middle
				// values of runs that moved by a third
				e.Timing = enginesim.Timing{StepBase: 300 * time.Microsecond, PerPrefillToken: 45 * time.Microsecond,
					PerDecodeSeq: 500 * time.Microsecond, PerContextToken: 180 * time.Nanosecond,
					PerPrefillKPairs: 55 * time.Microsecond, PerPrefillChunk: 1900 * time.Microsecond,
					PerChunkContextToken: 800 * time.Nanosecond}
			}
		default:
			var names []string
			for _, f := range Fleets() {
				names = append(names, f.Name)
			}
			return nil, fmt.Errorf("sim: fleet %q: want one of %v", name, names)
		}
		out[i] = e
	}
	return out, nil
}

// scaleTiming makes every step k times longer (a slower GPU).
func scaleTiming(t enginesim.Timing, k float64) enginesim.Timing {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) * k) }
	return enginesim.Timing{StepBase: s(t.StepBase), PerPrefillToken: s(t.PerPrefillToken), PerDecodeSeq: s(t.PerDecodeSeq),
		PerContextToken: s(t.PerContextToken), PerPrefillKPairs: s(t.PerPrefillKPairs),
		PerPrefillChunk: s(t.PerPrefillChunk), PerChunkContextToken: s(t.PerChunkContextToken)}
}
