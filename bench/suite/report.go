// Long because it is one job: the Markdown report, one writer per section, in
// the order the report reads.

package suite

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
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
	p("| engines | %d per ladder; enginesim virtual time, Llama-3.1-8B on one H100 model: %d KV blocks of %d tokens, max %d seqs, %d batched tokens, step = %v + %v/prefill token + %v/decode seq + %v/context token + %v per 1000 prefill attention pairs |\n",
		res.Replicas, e.NumGPUBlocks, e.BlockSize, e.MaxNumSeqs, e.MaxNumBatchedTokens, e.Timing.StepBase, e.Timing.PerPrefillToken, e.Timing.PerDecodeSeq, e.Timing.PerContextToken, e.Timing.PerPrefillKPairs)
	p("| router model | the real affinity code (parser, index, load, policies), told only each replica's name and models: no prefill rate, KV capacity or batch size. It learns from what production gives it: engine signals scraped every 1 s per replica on its own phase (waiting, running, KV usage; vLLM's KV capacity, llama.cpp's slots), measured TTFTs, and usage reported in real tokens (a per-request tokenizer density against its bytes/4 estimate). Its own speculative index, never the engines' caches |\n")
	p("| hit rate | per request: cached tokens at first scheduling (`usage.prompt_tokens_details.cached_tokens`) over prompt tokens, each request once; `pre` is the share of completed requests preempted at least once (each preemption recomputes its KV, and the engine's own hit counter counts the re-admission again) |\n\n")

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
			p(" %.0f%%: p50 | p99 | hit | pre |", l*100)
		}
		p("\n|---|")
		for range headlineLoads {
			p("---|---|---|---|")
		}
		p("\n")
		row := func(label string, pick func(load float64) *Point) {
			p("| %s |", label)
			for _, l := range headlineLoads {
				pt := pick(l)
				if pt == nil {
					p(" - | - | - | - |")
					continue
				}
				r := pt.Result
				name := ""
				if strings.HasPrefix(label, "best") {
					name = " [" + r.Policy + "]"
				}
				p(" %.3f%s | %.3f | %.1f%% | %s |", r.TTFT.P50, name, r.TTFT.P99, 100*r.HitRate, preempted(r))
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
		p("\nAt 80%% load:\n\n| policy | TTFT mean | p50 | p90 | p99 | E2E mean | ITL mean | hit rate | engine hit counter | preempted | imbalance | output tok/s | failed |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range names {
			pt := at(lad[n], 0.8)
			if pt == nil {
				continue
			}
			r := pt.Result
			p("| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.4f | %.1f%% | %.1f%% | %s | %.2f | %.0f | %d |\n", n, r.TTFT.Mean, r.TTFT.P50, r.TTFT.P90,
				r.TTFT.P99, r.E2E.Mean, r.ITLMean, 100*r.HitRate, 100*r.AdmissionHitRate, preempted(r), r.Imbalance, r.OutputTokPerSec, r.Failed)
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
		pl := Plot{Title: sw.title, XLabel: sw.param + " (log scale)", YLabel: "mean TTFT, seconds (log)", LogY: true}
		for _, v := range params {
			pl.XTicks = append(pl.XTicks, Tick{At: math.Log2(float64(v)), Label: strconv.Itoa(v)})
		}
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

	writeFleets(p, res)
	writeEveryPoint(p, res)

	if err := writeScaleOut(w, opts, res); err != nil {
		return err
	}

	p("## Reading these numbers fairly\n\n")
	p("- Every policy sees the same router-side state: warmpath's speculative prefix index (the anchors keep similar approximate trees), router-local in-flight counts, and engine metrics scraped every 1 s. Policies that lean on scraped queue lengths (llm-d's queue and KV scorers) herd onto the same replica between scrapes; llm-d's endpoint picker refreshes its metrics far more often by default, so its rows, above all at hundreds of replicas, are pessimistic for it.\n")
	p("- The session key is the workload's client: one per prefix group in shared-prefix and b2b-saas, one per conversation in multi-turn, one per user in one-company, one per request in the Mooncake replay (the trace names no session). That is the best case for `session` where it exists (a perfect grouping hint that real traffic often lacks); in gateway, three quarters of the users share one client (one address), the case where keying on the client pins many tenants to one replica. warmpath's `cost` policy does not use it.\n")
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

// preempted is the share of completed requests preempted at least once.
func preempted(r *sim.Result) string {
	if r.Completed == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(r.PreemptedRequests)/float64(r.Completed))
}

// verdict compares cost's point o with the best baseline's b: "win" when
// both mean and p99 TTFT are at or below, "tie" within 2%, else "behind".
func verdict(o, b *sim.Result) string {
	switch {
	case o.TTFT.Mean <= b.TTFT.Mean*1.0001 && o.TTFT.P99 <= b.TTFT.P99*1.0001:
		return "win"
	case o.TTFT.Mean <= b.TTFT.Mean*1.02 && o.TTFT.P99 <= b.TTFT.P99*1.02:
		return "tie"
	}
	return "behind"
}

// fleetLadder indexes the fleet section's points of one fleet and workload.
func fleetLadder(res *Results, fleet, wl string) map[string][]Point {
	m := map[string][]Point{}
	for _, p := range res.Points {
		if p.Sweep == "fleet" && p.Fleet == fleet && p.Workload == wl {
			m[p.Result.Policy] = append(m[p.Result.Policy], p)
		}
	}
	for _, ps := range m {
		sort.Slice(ps, func(i, j int) bool { return ps[i].Load < ps[j].Load })
	}
	return m
}

func fleetNames(res *Results) []string {
	var out []string
	for _, f := range sim.Fleets() {
		if _, ok := res.FleetCapacity[f.Name]; ok {
			out = append(out, f.Name)
		}
	}
	return out
}

func fleetWorkloadNames(res *Results, fleet string) []string {
	var out []string
	for _, wi := range res.Workloads {
		if _, ok := res.FleetCapacity[fleet][wi.Name]; ok {
			out = append(out, wi.Name)
		}
	}
	return out
}

// writeFleets is the fleet section: the same policies on engines as
// production runs them.
func writeFleets(p func(string, ...any), res *Results) {
	names := fleetNames(res)
	if len(names) == 0 {
		return
	}
	p("## Fleets\n\nThe same policies on fleets that production has (%d replicas each, capacity measured per fleet and workload with least-request):\n\n| fleet | engines |\n|---|---|\n", res.Replicas)
	for _, f := range sim.Fleets() {
		if slices.Contains(names, f.Name) {
			p("| %s | %s |\n", f.Name, f.About)
		}
	}
	p("\n")
	for _, f := range names {
		p("### %s\n\n| workload | load | capacity req/s | cost mean / p99 | hit | pre | best baseline mean / p99 | hit | pre | least-request mean / p99 | cost is |\n|---|---|---|---|---|---|---|---|---|---|---|\n", f)
		for _, wl := range fleetWorkloadNames(res, f) {
			lad := fleetLadder(res, f, wl)
			for _, l := range fleetLoads {
				o, b, lr := at(lad[ours], l), best(lad, l), at(lad["least-request"], l)
				if o == nil || b == nil || lr == nil {
					continue
				}
				p("| %s | %.0f%% | %.2f | %.3f / %.3f | %.1f%% | %s | [%s] %.3f / %.3f | %.1f%% | %s | %.3f / %.3f | %s |\n", wl, l*100, res.FleetCapacity[f][wl],
					o.Result.TTFT.Mean, o.Result.TTFT.P99, 100*o.Result.HitRate, preempted(o.Result),
					b.Result.Policy, b.Result.TTFT.Mean, b.Result.TTFT.P99, 100*b.Result.HitRate, preempted(b.Result),
					lr.Result.TTFT.Mean, lr.Result.TTFT.P99, verdict(o.Result, b.Result))
			}
		}
		p("\n")
	}
}

// writeEveryPoint lists every (workload, fleet, load) point with the best
// baseline named and the verdict, so where cost loses is in one table.
func writeEveryPoint(p func(string, ...any), res *Results) {
	type row struct {
		wl, fleet string
		load      float64
		o, b      *sim.Result
	}
	var rows []row
	for _, wi := range res.Workloads {
		lad := ladder(res, wi.Name)
		for _, l := range Loads {
			if o, b := at(lad[ours], l), best(lad, l); o != nil && b != nil {
				rows = append(rows, row{wi.Name, "vllm", l, o.Result, b.Result})
			}
		}
	}
	for _, f := range fleetNames(res) {
		for _, wl := range fleetWorkloadNames(res, f) {
			lad := fleetLadder(res, f, wl)
			for _, l := range fleetLoads {
				if o, b := at(lad[ours], l), best(lad, l); o != nil && b != nil {
					rows = append(rows, row{wl, f, l, o.Result, b.Result})
				}
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	count := map[string]int{}
	for _, r := range rows {
		count[verdict(r.o, r.b)]++
	}
	p("## Every point: cost against the best baseline\n\n%d points: cost wins (mean and p99 TTFT at or below the best baseline's) on %d, ties (within 2%%) on %d, is behind on %d.\n\n",
		len(rows), count["win"], count["tie"], count["behind"])
	p("| workload | fleet | load | cost mean / p99 | hit | best baseline | mean / p99 | hit | cost is |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		v := verdict(r.o, r.b)
		if v == "behind" {
			v = fmt.Sprintf("**behind** (%.2fx mean)", r.o.TTFT.Mean/r.b.TTFT.Mean)
		}
		p("| %s | %s | %.0f%% | %.3f / %.3f | %.1f%% | %s | %.3f / %.3f | %.1f%% | %s |\n", r.wl, r.fleet, r.load*100,
			r.o.TTFT.Mean, r.o.TTFT.P99, 100*r.o.HitRate, r.b.Policy, r.b.TTFT.Mean, r.b.TTFT.P99, 100*r.b.HitRate, v)
	}
	p("\n")
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
