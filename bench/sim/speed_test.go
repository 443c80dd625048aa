package sim

import (
	"errors"
	"io/fs"
	"syscall"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/workload"
)

// cpuTime is the process's user + system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSimulateLongPrompts reports simulated requests per CPU-second on
// long-prompt traces, 16 replicas: "docs", 3000 requests of ~8k tokens (a
// 7680-token document shared by 30 questions of 512 tokens, 100
// documents), under the cost policy and round-robin; "unique", 1500
// prompts of 7-9k tokens that share nothing; "mooncake", the Mooncake
// trace replay (3,993 requests, ~15k tokens on average, 512-token blocks
// shared across requests) when ../shared/workloads holds it. It uses only
// Run and the workload generators, so the same file measures an older
// commit side by side.
func BenchmarkSimulateLongPrompts(b *testing.B) {
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens, c.OutputTokens, c.RPS = 100, 30, 7680, 512, 64, 150
	c.Seed = 1
	docs, err := workload.SharedPrefix(c)
	if err != nil {
		b.Fatal(err)
	}
	ns := workload.NoSharingConfig{Requests: 1500, MinTokens: 7168, MaxTokens: 9216, OutputTokens: 64, RPS: 30, Seed: 1}
	unique, err := workload.NoSharing(ns)
	if err != nil {
		b.Fatal(err)
	}
	moon, err := workload.LoadMooncake("../../../shared/workloads/mooncake-synthetic.jsonl", "", 1)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		w    *workload.Workload
	}{
		{"trace=docs/policy=cost", docs}, {"trace=docs/policy=round-robin", docs},
		{"trace=unique/policy=cost", unique}, {"trace=mooncake/policy=cost", moon},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.w == nil {
				b.Skip("no Mooncake trace beside the checkout")
			}
			policy := "cost"
			if tc.name == "trace=docs/policy=round-robin" {
				policy = "round-robin"
			}
			n := 0
			cpu0 := cpuTime(b)
			for b.Loop() {
				r, err := Run(Config{Replicas: 16, Policy: policy, Seed: 1}, tc.w)
				if err != nil {
					b.Fatal(err)
				}
				n += r.Completed
			}
			b.ReportMetric(float64(n)/(cpuTime(b)-cpu0).Seconds(), "sim-req/cpu-s")
		})
	}
}
