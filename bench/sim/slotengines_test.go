package sim

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/workload"
)

// BenchmarkOneCompanySlotEngines: the one-company workload (one 4,096-token
// instruction prompt, short questions in bursts) on llama.cpp-like servers
// (llamacpp-cpu: slots each caching their own prompt, one core, prompts at
// 5,000 tokens/s), after one request alone has warmed one slot, so that
// the routers have measured a slot time before the first burst (with
// none, no hold is advised and every policy computes the instructions in
// every slot the first burst reaches). Four fleet sizes and loads, six
// workload seeds each, 400 requests a run; beside it shared-prefix and
// the live bench's llama.cpp multi-turn (8 chats of 4-6 turns after one
// 1,024-token system prompt), on the same servers. Cost (and cost with
// routing.slot_hold off) against least-request and round-robin. Reported
// per point: each policy's geometric mean over the seeds of mean and p99
// TTFT, and cost's ratio to the better of the two baselines, seed by seed
// (geometric mean). A ratio above 1 is where cost loses.
func BenchmarkOneCompanySlotEngines(b *testing.B) {
	type point struct {
		workload                string
		replicas, burst, output int
		rps                     float64
	}
	for _, pt := range []point{{"one-company", 2, 8, 32, 2.5}, {"one-company", 2, 8, 32, 5}, {"one-company", 4, 16, 64, 5}, {"one-company", 8, 16, 128, 3},
		{"shared-prefix", 2, 0, 32, 2.5}, {"shared-prefix", 2, 0, 32, 5}, {"shared-prefix", 4, 0, 64, 5},
		{"multi-turn", 2, 0, 32, 2.5}, {"multi-turn", 2, 0, 32, 5}} {
		b.Run(fmt.Sprintf("%s/replicas=%d/rps=%g", pt.workload, pt.replicas, pt.rps), func(b *testing.B) {
			for b.Loop() {
				means, p99s := runSlotRows(b, pt.replicas, 6, func(seed uint64) (*workload.Workload, int) {
					switch pt.workload {
					case "one-company":
						return oneCompanyAfterOne(b, seed, pt.burst, pt.output, pt.rps), 0
					case "multi-turn":
						return multiTurnSlots(b, seed, pt.output, pt.rps), 0
					}
					return sharedPrefixSlots(b, seed, pt.replicas, pt.output, pt.rps), 0
				})
				reportAgainstBest(b, slotNames(), means, p99s)
			}
		})
	}
}

// runSlotRows runs every row of slotPolicies on replicas llamacpp-cpu
// servers over the workloads gen makes for seeds 1 to seeds, and returns
// each row's mean and p99 TTFT per seed: over the requests from the one
// gen says is the first measured (IDs before it are a warm-up), or, where
// that is 0, over them all as the run reports them.
func runSlotRows(b *testing.B, replicas, seeds int, gen func(seed uint64) (*workload.Workload, int)) (means, p99s [][]float64) {
	eng, err := FleetEngines("llamacpp-cpu", replicas)
	if err != nil {
		b.Fatal(err)
	}
	means, p99s = make([][]float64, len(slotPolicies)), make([][]float64, len(slotPolicies))
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		w, measured := gen(seed)
		for k := range slotPolicies {
			cfg := slotConfig(k, replicas, eng, seed)
			cfg.KeepOutcomes = measured > 0
			r, err := Run(cfg, &workload.Workload{Name: w.Name, Params: w.Params, Requests: slices.Clone(w.Requests)})
			if err != nil {
				b.Fatal(err)
			}
			if measured == 0 {
				means[k] = append(means[k], r.TTFT.Mean)
				p99s[k] = append(p99s[k], r.TTFT.P99)
				continue
			}
			mean, p99 := measuredTTFT(b, r, measured, len(w.Requests)-measured)
			means[k], p99s[k] = append(means[k], mean), append(p99s[k], p99)
		}
	}
	return means, p99s
}

// sharedPrefixSlots is shared-prefix as the live bench runs it on its
// llama.cpp servers (2,048-token system prompts, 64-token questions), with
// four groups per server, as many as its slots, 400 requests at rps.
func sharedPrefixSlots(b *testing.B, seed uint64, replicas, output int, rps float64) *workload.Workload {
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.QuestionTokens, c.OutputTokens, c.Seed = 4*replicas, 400/(4*replicas), 64, output, seed
	w, err := workload.SharedPrefix(c)
	if err != nil {
		b.Fatal(err)
	}
	w.ScaleRate(rps)
	return w
}

// multiTurnSlots is multi-turn as the live bench runs it on its llama.cpp
// servers: 8 conversations of 4-6 turns after the 1,024-token system
// prompt, 64-token questions, output-token answers, 2 s to think, at rps.
func multiTurnSlots(b *testing.B, seed uint64, output int, rps float64) *workload.Workload {
	mt := workload.DefaultMultiTurn()
	mt.Seed, mt.Conversations, mt.MinTurns, mt.MaxTurns, mt.QuestionTokens, mt.AnswerTokens, mt.ThinkSeconds = seed, 8, 4, 6, 64, output, 2
	w, err := workload.MultiTurn(mt)
	if err != nil {
		b.Fatal(err)
	}
	w.ScaleRate(rps)
	return w
}

// oneCompanyAfterOne is one-company (400 requests, 32 users) at rps with
// its first request moved to time 0, alone, and the rest 3 s later.
func oneCompanyAfterOne(b *testing.B, seed uint64, burst, output int, rps float64) *workload.Workload {
	oc := workload.DefaultOneCompany()
	oc.Requests, oc.Users, oc.BurstSize, oc.OutputTokens, oc.Seed = 400, 32, burst, output, seed
	w, err := workload.OneCompany(oc)
	if err != nil {
		b.Fatal(err)
	}
	w.ScaleRate(rps)
	first := w.Requests[0]
	first.Arrival, first.ID = 0, 0
	for i := range w.Requests {
		w.Requests[i].Arrival += 3e9
		w.Requests[i].ID++
	}
	w.Requests = append([]workload.Request{first}, w.Requests...)
	return w
}

// reportAgainstBest reports each policy's geometric mean over the seeds
// of its mean and p99 TTFT (means[k][seed], p99s[k][seed] for policy
// names[k]), and each but the last two (the baselines: least-request and
// round-robin) against the better of those two, seed by seed (geometric
// mean of the ratios).
func reportAgainstBest(b *testing.B, names []string, means, p99s [][]float64) {
	for k, name := range names {
		b.ReportMetric(geomean(means[k]), name+"-mean-s")
		b.ReportMetric(geomean(p99s[k]), name+"-p99-s")
	}
	lr, rr := len(names)-2, len(names)-1
	for k := range lr {
		var rm, rp []float64
		for i := range means[k] {
			rm = append(rm, means[k][i]/min(means[lr][i], means[rr][i]))
			rp = append(rp, p99s[k][i]/min(p99s[lr][i], p99s[rr][i]))
		}
		b.ReportMetric(geomean(rm), names[k]+"/best-mean")
		b.ReportMetric(geomean(rp), names[k]+"/best-p99")
	}
}

func geomean(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += math.Log(v)
	}
	return math.Exp(s / float64(len(x)))
}

// slotPolicies are the rows the slot-engine benchmarks run: cost, cost
// with routing.copy_computed, cost with routing.slot_hold off, and the two
// baselines last (reportAgainstBest compares every row with them).
var slotPolicies = []struct {
	name                 string
	policy               string
	noHold, copyComputed bool
}{{"cost", "cost", false, false}, {"cost-copy-computed", "cost", false, true}, {"cost-no-hold", "cost", true, false},
	{"least-request", "least-request", false, false}, {"round-robin", "round-robin", false, false}}

// slotConfig is the simulator's config for row k of slotPolicies.
func slotConfig(k, replicas int, eng []enginesim.Config, seed uint64) Config {
	p := slotPolicies[k]
	cfg := Config{Replicas: replicas, Engines: eng, Policy: p.policy, Seed: seed}
	if p.noHold {
		cfg.Router.SlotHold = -1
	}
	cfg.Router.CopyComputed = p.copyComputed
	return cfg
}

// BenchmarkOneCompanyAfterWarmup: the one-company workload on llama.cpp-like
// servers (llamacpp-cpu) after a warm-up as the live bench runs it: 40
// requests, then, 3 s after the last of them, the company's measured 40.
// start=steady: the warm-up carries the company's instructions with other
// questions (the live bench's default: a deployment that has been
// running); start=new-prompts: it carries other instructions (its
// --warmup-new-prompts: the company's instructions just changed, cold
// everywhere, its first bursts measured). Eight workload seeds a point;
// TTFT over the 40 measured requests only. Reported per point: each row's
// geometric mean over the seeds of mean and p99 TTFT, and its ratio to the
// better of least-request and round-robin, seed by seed (geometric mean).
func BenchmarkOneCompanyAfterWarmup(b *testing.B) {
	type point struct {
		replicas, burst, output int
		rps                     float64
	}
	for _, start := range []string{"steady", "new-prompts"} {
		for _, pt := range []point{{2, 8, 32, 2.5}, {2, 8, 32, 5}, {4, 16, 64, 5}} {
			b.Run(fmt.Sprintf("start=%s/replicas=%d/rps=%g", start, pt.replicas, pt.rps), func(b *testing.B) {
				for b.Loop() {
					means, p99s := runSlotRows(b, pt.replicas, 8, func(seed uint64) (*workload.Workload, int) {
						return oneCompanyAfterWarmup(b, seed, start == "steady", pt.burst, pt.output, pt.rps)
					})
					reportAgainstBest(b, slotNames(), means, p99s)
				}
			})
		}
	}
}

// slotNames are slotPolicies' row names.
func slotNames() []string {
	var names []string
	for _, p := range slotPolicies {
		names = append(names, p.name)
	}
	return names
}

// oneCompanyAfterWarmup is 40 one-company requests with other questions
// (and, unless same, other instructions) at rps, then, 3 s after the last
// of them, 40 carrying the company's own (seed), at rps. It returns the
// workload and the ID of the first measured request (the IDs before it are
// the warm-up's).
func oneCompanyAfterWarmup(b testing.TB, seed uint64, same bool, burst, output int, rps float64) (*workload.Workload, int) {
	gen := func(seed, shared uint64) *workload.Workload {
		oc := workload.DefaultOneCompany()
		oc.Requests, oc.Users, oc.BurstSize, oc.OutputTokens, oc.Seed, oc.SharedSeed = 40, 32, burst, output, seed, shared
		w, err := workload.OneCompany(oc)
		if err != nil {
			b.Fatal(err)
		}
		w.ScaleRate(rps)
		return w
	}
	shared := seed + 1000
	if same {
		shared = seed
	}
	warm, w := gen(seed+1000, shared), gen(seed, seed)
	start := warm.Requests[len(warm.Requests)-1].Arrival + 3e9
	for i := range w.Requests {
		w.Requests[i].Arrival += start
		w.Requests[i].ID += len(warm.Requests)
	}
	w.Requests = append(warm.Requests, w.Requests...)
	return w, len(warm.Requests)
}
