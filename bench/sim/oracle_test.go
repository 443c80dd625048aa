package sim

import (
	"testing"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// TestOracle: the oracle-fed cost policy predicts what the engines then
// report, and reaches at least the cost policy's hit rate on a shared-prefix
// run, with ample KV and with KV small enough that the speculative index goes
// stale under eviction.
func TestOracle(t *testing.T) {
	tests := []struct {
		name   string
		blocks int // KV blocks per engine
	}{
		{"ample KV", 25000},
		{"scarce KV", 1500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := smallShared(t, 60)
			eng := enginesim.DefaultConfig()
			eng.NumGPUBlocks = tc.blocks
			run := func(p string) *Result {
				t.Helper()
				r, err := Run(Config{Replicas: 4, Policy: p, Seed: 1, Engine: eng, KeepOutcomes: true}, w)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			cost, oracle := run("cost"), run("oracle")
			if oracle.HitRate < cost.HitRate {
				t.Fatalf("oracle hit rate %.3f below cost's %.3f", oracle.HitRate, cost.HitRate)
			}
			exact := 0
			for _, o := range oracle.Outcomes {
				if o.Predicted == o.CachedTokens {
					exact++
				}
			}
			if exact*10 < len(oracle.Outcomes)*9 {
				t.Fatalf("oracle predicted the engine's hit exactly for %d of %d requests", exact, len(oracle.Outcomes))
			}
			t.Logf("hit rate cost %.3f oracle %.3f; TTFT mean cost %.4f oracle %.4f; exact predictions %d/%d",
				cost.HitRate, oracle.HitRate, cost.TTFT.Mean, oracle.TTFT.Mean, exact, len(oracle.Outcomes))
		})
	}
}
