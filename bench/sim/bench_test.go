package sim

import (
	"fmt"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

// BenchmarkSimulate reports simulated requests per wall second for warmpath's
// cost policy side by side with round-robin (the cheapest router), so the
// router's share of simulation cost shows.
func BenchmarkSimulate(b *testing.B) {
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens, c.OutputTokens, c.RPS = 64, 32, 512, 64, 32, 400
	w, err := workload.SharedPrefix(c)
	if err != nil {
		b.Fatal(err)
	}
	for _, replicas := range []int{4, 64} {
		for _, p := range []string{"round-robin", "cost"} {
			b.Run(fmt.Sprintf("replicas=%d/policy=%s", replicas, p), func(b *testing.B) {
				n := 0
				b.ReportAllocs()
				for b.Loop() {
					r, err := Run(Config{Replicas: replicas, Policy: p}, w)
					if err != nil {
						b.Fatal(err)
					}
					n += r.Completed
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "sim-req/s")
			})
		}
	}
}

// BenchmarkSimulateScaleOut reports the simulator's cost of scale-out: the
// cost policy on one router side by side with 8 routers unsynced and 8
// synced (every router applies the other 7's updates).
func BenchmarkSimulateScaleOut(b *testing.B) {
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens, c.OutputTokens, c.RPS = 64, 32, 512, 64, 32, 400
	w, err := workload.SharedPrefix(c)
	if err != nil {
		b.Fatal(err)
	}
	for _, rc := range []struct {
		routers int
		sync    bool
	}{{1, false}, {8, false}, {8, true}} {
		b.Run(fmt.Sprintf("routers=%d/sync=%v", rc.routers, rc.sync), func(b *testing.B) {
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				r, err := Run(Config{Replicas: 16, Routers: rc.routers, Sync: rc.sync, SyncDelay: 5e6}, w)
				if err != nil {
					b.Fatal(err)
				}
				n += r.Completed
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "sim-req/s")
		})
	}
}
