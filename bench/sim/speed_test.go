package sim

import (
	"fmt"
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
// a long-prompt trace: 3000 requests of ~8k tokens (a 7680-token document
// shared by 30 questions of 512 tokens, 100 documents), 16 replicas, the
// cost policy and round-robin. It uses only Run and the workload generator,
// so the same file measures an older commit side by side.
func BenchmarkSimulateLongPrompts(b *testing.B) {
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens, c.OutputTokens, c.RPS = 100, 30, 7680, 512, 64, 150
	c.Seed = 1
	w, err := workload.SharedPrefix(c)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{"cost", "round-robin"} {
		b.Run(fmt.Sprintf("policy=%s", p), func(b *testing.B) {
			n := 0
			cpu0 := cpuTime(b)
			for b.Loop() {
				r, err := Run(Config{Replicas: 16, Policy: p, Seed: 1}, w)
				if err != nil {
					b.Fatal(err)
				}
				n += r.Completed
			}
			b.ReportMetric(float64(n)/(cpuTime(b)-cpu0).Seconds(), "sim-req/cpu-s")
		})
	}
}
