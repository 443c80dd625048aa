package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// listFlag is a string list flag: comma-separated and/or repeated.
type listFlag struct {
	vals []string
	set  bool
}

func (l *listFlag) String() string { return strings.Join(l.vals, ",") }

func (l *listFlag) Set(v string) error {
	if !l.set { // the first use replaces the default
		l.vals, l.set = nil, true
	}
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			l.vals = append(l.vals, p)
		}
	}
	return nil
}

// run parses args, serves until ctx ends, and reports the listening
// address on ready (may be nil).
func run(ctx context.Context, args []string, logOut io.Writer, ready chan<- string) error {
	cfg := enginesim.DefaultConfig()
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	fs.SetOutput(logOut)
	listen := fs.String("listen", ":8000", "address to listen on")
	names := &listFlag{vals: cfg.ServedModelNames}
	fs.Var(names, "served-model-name", "served model name(s), comma-separated or repeated; the first labels the metrics")
	lora := &listFlag{}
	fs.Var(lora, "lora-modules", "LoRA adapters served as extra models, name or name=path, comma-separated or repeated")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks-override", cfg.NumGPUBlocks, "KV cache capacity in blocks")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "maximum running sequences per step")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.MaxNumBatchedTokens, "token budget per step (chunked prefill + decode)")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "maximum prompt + output tokens per request")
	fs.BoolVar(&cfg.DisablePrefixCaching, "no-enable-prefix-caching", false, "disable automatic prefix caching")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "wall time per model time (0.01 = 100x faster than life)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed for output lengths, text and injected errors")
	fs.DurationVar(&cfg.Timing.StepBase, "step-base", cfg.Timing.StepBase, "timing: fixed cost per engine step")
	fs.DurationVar(&cfg.Timing.PerPrefillToken, "per-prefill-token", cfg.Timing.PerPrefillToken, "timing: cost per uncached prompt token")
	fs.DurationVar(&cfg.Timing.PerDecodeSeq, "per-decode-seq", cfg.Timing.PerDecodeSeq, "timing: cost per decoding sequence")
	fs.DurationVar(&cfg.Timing.PerContextToken, "per-context-token", cfg.Timing.PerContextToken, "timing: cost per context token read by a decode")
	fs.DurationVar(&cfg.Timing.PerPrefillKPairs, "per-prefill-kpairs", cfg.Timing.PerPrefillKPairs, "timing: cost per 1000 prefill attention (query, key) pairs")
	fs.DurationVar(&cfg.Timing.PerPrefillChunk, "per-prefill-chunk", cfg.Timing.PerPrefillChunk, "timing: cost per sequence prefilling in a step")
	fs.DurationVar(&cfg.Timing.PerChunkContextToken, "per-chunk-context-token", cfg.Timing.PerChunkContextToken, "timing: cost per token in context before a prefill chunk")
	fs.IntVar(&cfg.OutputLen.Median, "output-len-median", cfg.OutputLen.Median, "median sampled output length when max_tokens is absent")
	fs.IntVar(&cfg.OutputLen.Max, "output-len-max", cfg.OutputLen.Max, "maximum sampled output length")
	fs.DurationVar(&cfg.Faults.Latency, "fault-latency", 0, "fault: latency added before each API request (model time)")
	fs.Float64Var(&cfg.Faults.ErrorRate, "fault-error-rate", 0, "fault: fraction of API requests answered with --fault-error-status")
	fs.IntVar(&cfg.Faults.ErrorStatus, "fault-error-status", 500, "fault: HTTP status of injected errors")
	fs.BoolVar(&cfg.Faults.Hang, "fault-hang", false, "fault: API requests never answer")
	fs.IntVar(&cfg.Faults.CloseAfterChunks, "fault-close-after", 0, "fault: close streaming connections after N content chunks")
	fs.IntVar(&cfg.Faults.StallAfterChunks, "fault-stall-after", 0, "fault: streaming responses stop (connection kept open) after N content chunks")
	fs.BoolVar(&cfg.Faults.MetricsGarbage, "fault-metrics-garbage", false, "fault: /metrics answers unparsable text")
	fs.BoolVar(&cfg.Faults.MetricsStall, "fault-metrics-stall", false, "fault: /metrics never answers")
	fs.BoolVar(&cfg.Faults.Unhealthy, "fault-unhealthy", false, "fault: /health answers 503")
	fs.BoolVar(&cfg.EnableAdmin, "enable-admin", cfg.EnableAdmin, "serve POST /admin/faults and /admin/restart")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lvl}))
	cfg.ServedModelNames, cfg.LoRAModules = names.vals, lora.vals

	s, err := enginesim.NewServer(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case <-ctx.Done():
		s.Close()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
}
