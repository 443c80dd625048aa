package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

// BenchmarkTwoServerChats: the live bench's llamacpp-smallcache fleet in
// the simulator, where its tail can be told from noise. Two llama.cpp
// servers (4 slots, a host prompt cache of 4,096 or 16,384 tokens), the
// fleet's multi-turn workload (24 conversations of 6-8 turns, a 512-token
// system prompt, 128-token questions, 64-token answers) at 4, 8 and 12
// req/s, cost and least-request, 24 seeds of workload and router pooled
// (about 4,000 requests a point, where one live round has 160 and its
// p99 is its second-slowest request). Reported per policy: pooled mean,
// p90 and p99 TTFT (seconds) and the mean hit rate. A measurement, not a
// check: run with -bench TwoServerChats -benchtime 1x.
func BenchmarkTwoServerChats(b *testing.B) {
	const seeds = 24
	for _, ram := range []int{4096, 16384} {
		for _, rps := range []float64{4, 8, 12} {
			for _, pol := range []string{"cost", "least-request"} {
				b.Run(fmt.Sprintf("ram=%d/rps=%g/%s", ram, rps, pol), func(b *testing.B) {
					for b.Loop() {
						var ttft []float64
						hit := 0.0
						for seed := uint64(1); seed <= seeds; seed++ {
							mt := workload.DefaultMultiTurn()
							mt.Seed, mt.Conversations, mt.SharedTokens, mt.QuestionTokens, mt.AnswerTokens = seed, 24, 512, 128, 64
							mt.MinTurns, mt.MaxTurns, mt.ThinkSeconds = 6, 8, 4
							w, err := workload.MultiTurn(mt)
							if err != nil {
								b.Fatal(err)
							}
							w.ScaleRate(rps)
							eng, err := FleetEngines("llamacpp", 2)
							if err != nil {
								b.Fatal(err)
							}
							for i := range eng {
								eng[i].CacheRAMTokens = ram
							}
							r, err := Run(Config{Replicas: 2, Policy: pol, Seed: seed, Engines: eng, Fleet: "llamacpp", KeepOutcomes: true}, w)
							if err != nil {
								b.Fatal(err)
							}
							for _, o := range r.Outcomes {
								ttft = append(ttft, o.TTFT)
							}
							hit += r.HitRate / seeds
						}
						slices.Sort(ttft)
						mean := 0.0
						for _, x := range ttft {
							mean += x / float64(len(ttft))
						}
						b.ReportMetric(mean, "mean-s")
						b.ReportMetric(ttft[len(ttft)*90/100], "p90-s")
						b.ReportMetric(ttft[len(ttft)*99/100], "p99-s")
						b.ReportMetric(hit, "hit")
					}
				})
			}
		}
	}
}
