package suite

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/sim"
)

// ours is warmpath's default policy; oracle is its cache-oracle-fed twin when present.
const ours = "cost"

func writeReport(opts Options, res *Results) error {
	f, err := os.Create(filepath.Join(opts.Out, "report.md"))
	if err != nil {
		return fmt.Errorf("suite: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }

	p("# warmpath bench report: cluster simulator\n\n")
	p("Reproduce with:\n\n```\n%s\n```\n\n", opts.Command)
	p("| | |\n|---|---|\n")
	p("| seed | %d |\n| commit | %s |\n| machine | %s |\n| elapsed | %.0f s |\n", res.Seed, commit(), Machine(), res.Elapsed)
	e := enginesim.DefaultConfig()
	p("| engines | %d per ladder; enginesim virtual time, Llama-3.1-8B on one H100 model: %d KV blocks of %d tokens, max %d seqs, %d batched tokens, step = %v + %v/prefill token + %v/decode seq + %v/context token |\n",
		res.Replicas, e.NumGPUBlocks, e.BlockSize, e.MaxNumSeqs, e.MaxNumBatchedTokens, e.Timing.StepBase, e.Timing.PerPrefillToken, e.Timing.PerDecodeSeq, e.Timing.PerContextToken)
	p("| router model | the real affinity code (parser, index, load, policies); engine signals scraped every 500 ms; its own speculative index, never the engines' caches |\n\n")

	p("## Workloads\n\n| workload | requests | reusable prompt share (unbounded cache) | capacity on %d replicas (req/s) | parameters |\n|---|---|---|---|---|\n", res.Replicas)
	for _, wi := range res.Workloads {
		p("| %s | %d | %.1f%% | %.2f | %s |\n", wi.Name, wi.Requests, 100*wi.Reuse, res.Capacity[wi.Name], wi.Params)
	}
	for _, sk := range res.Skipped {
		p("\nLeft out: %s\n", sk)
	}
	p("\nCapacity is the throughput least-request reaches when the whole workload is offered at once; the load levels below are fractions of it.\n\n")

	p("## Headline: TTFT p50 / p99 (seconds) and prompt-cache hit rate\n\n")
	p("Best baseline = the non-warmpath policy with the lowest mean TTFT at that load (its name in brackets).\n\n")
	var misses []string
	for _, wi := range res.Workloads {
		lad := ladder(res, wi.Name)
		p("### %s\n\n| policy |", wi.Name)
		for _, l := range headlineLoads {
			p(" %.0f%%: p50 | p99 | hit |", l*100)
		}
		p("\n|---|")
		for range headlineLoads {
			p("---|---|---|")
		}
		p("\n")
		row := func(label string, pick func(load float64) *Point) {
			p("| %s |", label)
			for _, l := range headlineLoads {
				pt := pick(l)
				if pt == nil {
					p(" - | - | - |")
					continue
				}
				r := pt.Result
				name := ""
				if strings.HasPrefix(label, "best") {
					name = " [" + r.Policy + "]"
				}
				p(" %.3f%s | %.3f | %.1f%% |", r.TTFT.P50, name, r.TTFT.P99, 100*r.HitRate)
			}
			p("\n")
		}
		row("**warmpath (cost)**", func(l float64) *Point { return at(lad[ours], l) })
		row("best baseline", func(l float64) *Point { return best(lad, l) })
		row("least-request", func(l float64) *Point { return at(lad["least-request"], l) })
		row("round-robin", func(l float64) *Point { return at(lad["round-robin"], l) })
		if _, ok := lad["oracle"]; ok {
			row("oracle-fed cost", func(l float64) *Point { return at(lad["oracle"], l) })
		}
		p("\n")
		for _, l := range Loads {
			o, b := at(lad[ours], l), best(lad, l)
			if o == nil || b == nil {
				continue
			}
			if o.Result.TTFT.Mean > b.Result.TTFT.Mean*1.0001 || o.Result.TTFT.P99 > b.Result.TTFT.P99*1.0001 {
				kind := "tie"
				if o.Result.TTFT.Mean > b.Result.TTFT.Mean*1.02 || o.Result.TTFT.P99 > b.Result.TTFT.P99*1.02 {
					kind = "behind"
				}
				misses = append(misses, fmt.Sprintf("%s: %s at %.0f%%: cost mean %.3f / p99 %.3f vs %s mean %.3f / p99 %.3f",
					kind, wi.Name, l*100, o.Result.TTFT.Mean, o.Result.TTFT.P99, b.Result.Policy, b.Result.TTFT.Mean, b.Result.TTFT.P99))
			}
		}
	}
	p("## Where warmpath stands against the goal\n\nGoal: mean and p99 TTFT at or below the best baseline on every workload and load level.\n\n")
	if len(misses) == 0 {
		p("Met on every workload and load level of this run.\n\n")
	} else {
		sort.SliceStable(misses, func(i, j int) bool { return misses[i] < misses[j] })
		behind := 0
		for _, m := range misses {
			if strings.HasPrefix(m, "behind") {
				behind++
			}
		}
		p("Missed on %d of %d (workload, load) points: %d within 2%% of the best baseline on both mean and p99 (tie), %d further behind:\n\n",
			len(misses), len(res.Workloads)*len(Loads), len(misses)-behind, behind)
		for _, m := range misses {
			p("- %s\n", m)
		}
		p("\n")
	}

	p("## The TTFT model's error\n\nHow far warmpath's per-replica TTFT model (`affinity/ttft.go`) was from each completed request's TTFT under the `cost` policy, as the factor max(actual / predicted, predicted / actual): median / 90th percentile.\n\n| workload |")
	for _, l := range Loads {
		p(" %.0f%% |", l*100)
	}
	p("\n|---|%s\n", strings.Repeat("---|", len(Loads)))
	for _, wi := range res.Workloads {
		lad := ladder(res, wi.Name)
		p("| %s |", wi.Name)
		for _, l := range Loads {
			if pt := at(lad["cost"], l); pt != nil && pt.Result.TTFTModelError.P50 > 0 {
				p(" %.2f / %.2f |", pt.Result.TTFTModelError.P50, pt.Result.TTFTModelError.P90)
			} else {
				p(" - |")
			}
		}
		p("\n")
	}
	p("\n")

	for _, wi := range res.Workloads {
		lad := ladder(res, wi.Name)
		names := policyOrder(lad)
		p("## %s\n\n", wi.Name)
		for _, k := range []struct {
			file, title, y string
			val            func(*sim.Result) float64
			log            bool
		}{
			{"ttft-mean", "mean TTFT vs load", "seconds (log)", func(r *sim.Result) float64 { return r.TTFT.Mean }, true},
			{"ttft-p99", "p99 TTFT vs load", "seconds (log)", func(r *sim.Result) float64 { return r.TTFT.P99 }, true},
			{"hit", "prompt-cache hit rate vs load", "hit rate", func(r *sim.Result) float64 { return r.HitRate }, false},
		} {
			pl := Plot{Title: wi.Name + ": " + k.title, XLabel: "load (fraction of capacity)", YLabel: k.y, LogY: k.log}
			for _, n := range names {
				s := Series{Name: n}
				for _, pt := range lad[n] {
					s.X = append(s.X, pt.Load)
					s.Y = append(s.Y, k.val(pt.Result))
				}
				pl.Series = append(pl.Series, s)
			}
			file := fmt.Sprintf("%s-%s.svg", wi.Name, k.file)
			if err := writePlot(filepath.Join(opts.Out, file), &pl); err != nil {
				return err
			}
			p("![%s](%s)\n", pl.Title, file)
		}
		p("\nAt 80%% load:\n\n| policy | TTFT mean | p50 | p90 | p99 | E2E mean | ITL mean | hit rate | imbalance | output tok/s | failed |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range names {
			pt := at(lad[n], 0.8)
			if pt == nil {
				continue
			}
			r := pt.Result
			p("| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.4f | %.1f%% | %.2f | %.0f | %d |\n", n, r.TTFT.Mean, r.TTFT.P50, r.TTFT.P90,
				r.TTFT.P99, r.E2E.Mean, r.ITLMean, 100*r.HitRate, r.Imbalance, r.OutputTokPerSec, r.Failed)
		}
		p("\n")
	}

	for _, sw := range []struct{ name, title, param string }{
		{"replicas", "Replica sweep (shared-prefix sized to the fleet, 80% load)", "replicas"},
		{"cache", "KV cache size sweep (b2b-saas, 80% load)", "KV blocks per replica"},
	} {
		m := map[string][]Point{}
		var params []int
		for _, pt := range res.Points {
			if pt.Sweep == sw.name {
				m[pt.Result.Policy] = append(m[pt.Result.Policy], pt)
				if !containsInt(params, pt.Param) {
					params = append(params, pt.Param)
				}
			}
		}
		if len(m) == 0 {
			continue
		}
		sort.Ints(params)
		names := policyOrder(m)
		p("## %s\n\n| policy |", sw.title)
		for _, v := range params {
			p(" %d: TTFT mean | hit |", v)
		}
		p("\n|---|")
		for range params {
			p("---|---|")
		}
		p("\n")
		pl := Plot{Title: sw.title, XLabel: sw.param + " (log2)", YLabel: "mean TTFT, seconds (log)", LogY: true}
		for _, n := range names {
			p("| %s |", n)
			s := Series{Name: n}
			for _, v := range params {
				var r *sim.Result
				for _, pt := range m[n] {
					if pt.Param == v {
						r = pt.Result
					}
				}
				if r == nil {
					p(" - | - |")
					continue
				}
				p(" %.3f | %.1f%% |", r.TTFT.Mean, 100*r.HitRate)
				s.X = append(s.X, math.Log2(float64(v)))
				s.Y = append(s.Y, r.TTFT.Mean)
			}
			p("\n")
			pl.Series = append(pl.Series, s)
		}
		file := "sweep-" + sw.name + ".svg"
		if err := writePlot(filepath.Join(opts.Out, file), &pl); err != nil {
			return err
		}
		p("\n![%s](%s)\n\n", pl.Title, file)
		if sw.name == "replicas" {
			p("Router CPU in these runs (parse + hash + decide, wall time per request, one core):\n\n| policy |")
			for _, v := range params {
				p(" %d |", v)
			}
			p("\n|---|")
			for range params {
				p("---|")
			}
			p("\n")
			for _, n := range names {
				p("| %s |", n)
				for _, v := range params {
					for _, pt := range m[n] {
						if pt.Param == v && pt.Result.Decisions > 0 {
							p(" %.1f µs |", float64(pt.Result.DecideNanos)/float64(pt.Result.Decisions)/1e3)
						}
					}
				}
				p("\n")
			}
			p("\n")
		}
	}

	if err := writeScaleOut(w, opts, res); err != nil {
		return err
	}

	p("## Reading these numbers fairly\n\n")
	p("- Every policy sees the same router-side state: warmpath's speculative prefix index (the anchors keep similar approximate trees), router-local in-flight counts, and engine metrics scraped every 500 ms. Policies that lean on scraped queue lengths (llm-d's queue and KV scorers) herd onto the same replica between scrapes; llm-d's endpoint picker refreshes its metrics far more often by default, so its rows, above all at hundreds of replicas, are pessimistic for it.\n")
	p("- The session key is the workload's client: one per prefix group in shared-prefix and b2b-saas, one per conversation in multi-turn. That is the best case for `session` (a perfect grouping hint that real traffic often lacks); warmpath's `cost` policy does not use it.\n")
	p("- Multi-turn conversations run closed loop with the engine's real answers (a turn arrives its think time after the previous one finished), so engine-cached answer blocks are reused; the router's index only learns prompt blocks it routed.\n")
	p("- `failed` counts requests the engines refuse: 10 Mooncake requests ask for more than max_model_len (131,072 tokens), as vLLM would refuse them, under every policy.\n")
	p("- Capacity, and so every load level, is measured per workload with least-request; a policy that reuses more cache has more headroom than the level says.\n\n")
	p("## Policies\n\n| policy | source |\n|---|---|\n")
	for _, pi := range sim.Policies() {
		p("| %s | %s |\n", pi.Name, pi.Source)
	}
	p("\nFormulas: affinity/README.md (warmpath's) and bench/sim/baselines.go (the anchors').\n")
	return w.Flush()
}

func at(ps []Point, load float64) *Point {
	for i := range ps {
		if math.Abs(ps[i].Load-load) < 1e-9 {
			return &ps[i]
		}
	}
	return nil
}

// best is the non-warmpath, non-oracle policy with the lowest mean TTFT at
// load; a tie goes to the first in Policies order, so the choice is stable.
func best(lad map[string][]Point, load float64) *Point {
	var b *Point
	for _, name := range policyOrder(lad) {
		if name == ours || name == "oracle" {
			continue
		}
		pt := at(lad[name], load)
		if pt != nil && (b == nil || pt.Result.TTFT.Mean < b.Result.TTFT.Mean) {
			b = pt
		}
	}
	return b
}

// policyOrder puts warmpath's policy first, then the rest in Policies order.
func policyOrder(m map[string][]Point) []string {
	var out []string
	if _, ok := m[ours]; ok {
		out = append(out, ours)
	}
	for _, pi := range sim.Policies() {
		if _, ok := m[pi.Name]; ok && pi.Name != ours {
			out = append(out, pi.Name)
		}
	}
	if _, ok := m["oracle"]; ok && !containsStr(out, "oracle") {
		out = append(out, "oracle")
	}
	return out
}

func containsInt(xs []int, v int) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

func containsStr(xs []string, v string) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

func writePlot(path string, pl *Plot) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("suite: %w", err)
	}
	if err := pl.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("suite: %w", err)
	}
	return f.Close()
}

// Machine describes the host for reports: CPU model, CPU count, OS/arch,
// kernel and Go version.
func Machine() string {
	cpu := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d CPUs, %s/%s, kernel %s, %s", cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, kernel, runtime.Version())
}

func commit() string {
	// read .git/HEAD without running git; in a worktree .git is a file
	// naming the git dir, whose commondir holds the branch refs
	for _, dir := range []string{".", "..", "../.."} {
		gitDir := filepath.Join(dir, ".git")
		if b, err := os.ReadFile(gitDir); err == nil {
			g, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
			if !ok {
				continue
			}
			if !filepath.IsAbs(g) {
				g = filepath.Join(dir, g)
			}
			gitDir = g
		}
		b, err := os.ReadFile(filepath.Join(gitDir, "HEAD"))
		if err != nil {
			continue
		}
		ref := strings.TrimSpace(string(b))
		name, isRef := strings.CutPrefix(ref, "ref: ")
		if !isRef {
			return ref[:min(12, len(ref))]
		}
		dirs := []string{gitDir}
		if c, err := os.ReadFile(filepath.Join(gitDir, "commondir")); err == nil {
			cd := strings.TrimSpace(string(c))
			if !filepath.IsAbs(cd) {
				cd = filepath.Join(gitDir, cd)
			}
			dirs = append(dirs, cd)
		}
		for _, d := range dirs {
			if h, err := os.ReadFile(filepath.Join(d, name)); err == nil {
				return strings.TrimSpace(string(h))[:12]
			}
			if packed, err := os.ReadFile(filepath.Join(d, "packed-refs")); err == nil {
				for _, l := range strings.Split(string(packed), "\n") {
					if h, ok := strings.CutSuffix(l, " "+name); ok && len(h) >= 12 {
						return h[:12]
					}
				}
			}
		}
		return ref
	}
	return "unknown"
}
