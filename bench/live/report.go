package live

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// write puts live.md and live.json into dir (perf.md and perf.json for a
// perf-only run).
func (r *Results) write(dir string) error {
	name := "live"
	if r.Options.PerfOnly {
		name = "perf"
	}
	return r.writeAs(dir, name)
}

// writeAs puts the Markdown report and the JSON results into dir as
// name.md and name.json.
func (r *Results) writeAs(dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	md, err := os.Create(filepath.Join(dir, name+".md"))
	if err != nil {
		return err
	}
	if err := r.WriteMarkdown(md); err != nil {
		md.Close()
		return err
	}
	if err := md.Close(); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), append(js, '\n'), 0o644)
}

// Rerender rewrites the Markdown report beside a results file (NAME.json
// to NAME.md) from the results it holds, with this build's report code:
// a change to the report's format applied to runs already made, running
// nothing.
func Rerender(jsonPath string) error {
	base, ok := strings.CutSuffix(jsonPath, ".json")
	if !ok {
		return fmt.Errorf("rerender %s: want a results file ending in .json", jsonPath)
	}
	js, err := os.ReadFile(jsonPath)
	if err != nil {
		return fmt.Errorf("rerender: %w", err)
	}
	var r Results
	if err := json.Unmarshal(js, &r); err != nil {
		return fmt.Errorf("rerender %s: %w", jsonPath, err)
	}
	if r.Started.IsZero() {
		return fmt.Errorf("rerender %s: not the results of a live bench run (no start time)", jsonPath)
	}
	md, err := os.Create(base + ".md")
	if err != nil {
		return fmt.Errorf("rerender: %w", err)
	}
	if err := r.WriteMarkdown(md); err != nil {
		md.Close()
		return fmt.Errorf("rerender %s: %w", jsonPath, err)
	}
	return md.Close()
}

// WriteMarkdown writes the report: how it was made, one routing table per
// workload, and the router-overhead table.
func (r *Results) WriteMarkdown(w io.Writer) error {
	b := bufio.NewWriter(w)
	o := r.Options
	fmt.Fprintf(b, "# warmpath live bench\n\n")
	if r.Command != "" {
		fmt.Fprintf(b, "- command: `%s`\n", r.Command)
	}
	fmt.Fprintf(b, "- commit: `%s`, seed %d, started %s, took %s\n", r.Commit, o.Seed, r.Started.Format("2006-01-02 15:04 UTC"), r.Elapsed.Round(1e9))
	fmt.Fprintf(b, "- machine: %s\n", r.Machine)
	mode := "full"
	if o.Smoke {
		mode = "smoke (tiny sizes: a wiring check, not a measurement)"
	}
	if o.PerfOnly {
		mode = "perf only (the proxy-cost bench)"
	}
	fmt.Fprintf(b, "- mode: %s\n", mode)
	if r.Nginx != "" {
		fmt.Fprintf(b, "- nginx rows left out: %s\n", r.Nginx)
	}
	for _, f := range r.Fleets {
		if f.Skipped != "" {
			fmt.Fprintf(b, "- fleet %s left out: %s\n", f.Name, f.Skipped)
		}
	}

	if r.Tenants != nil { // the tenants scenario alone
		if err := b.Flush(); err != nil {
			return err
		}
		r.Tenants.write(w)
		return nil
	}
	if o.PerfOnly {
		writePerfMarkdown(b, r.Perf, r.PerfShapes, o.Rounds, o.BaselineLabel)
		return b.Flush()
	}
	r.writeHeadline(b)

	fmt.Fprintf(b, "\n## Routing: real processes over loopback\n\n")
	fmt.Fprintf(b, "Per fleet, the engines behind each router are started fresh for every row, so every cache starts cold. "+
		"Open-loop streaming load from `bench/loadgen`; TTFT is measured at the client on the first content byte. "+
		"enginesim engines hold %d KV blocks (%d tokens) each and run with `--time-scale %g` (%gx faster than life): their latencies are "+
		"in model seconds (wall / time scale); llama.cpp's are wall seconds. Hit rate = cached / prompt tokens from the engines' `usage`. "+
		"The direct row sends one engine the share of the workload an even split would give it "+
		"(every Nth request, or whole conversations), at the same arrival times.\n",
		o.EngineKVBlocks, 16*o.EngineKVBlocks, o.TimeScale, 1/o.TimeScale)
	if o.Warmup > 0 {
		prompts := "the same shared prompts (system prompts, instructions)"
		if o.WarmupNewPrompts {
			prompts = "its own shared prompts (`--warmup-new-prompts`: the measured requests meet caches holding other system prompts)"
		}
		fmt.Fprintf(b, "\nWarm-up (`--warmup %d`): before its measured requests every row sends the first %d requests of the same workload drawn with another seed and %s, at the same rate, through the same router to the same engines, and waits for them; they are not counted (nor in the TTFT model's error table, unless a row marked * there).\n", o.Warmup, o.Warmup, prompts)
	}
	for _, f := range r.Fleets {
		fmt.Fprintf(b, "\n### Fleet %s\n\n%s.", f.Name, f.About)
		if f.Skipped != "" {
			fmt.Fprintf(b, " **Left out**: %s\n", f.Skipped)
			continue
		}
		fmt.Fprintf(b, " Latencies in %s.\n", unit(f.TimeScale))
		for _, wl := range r.Workloads {
			if wl.Fleet != f.Name {
				continue
			}
			fmt.Fprintf(b, "\n#### %s: %s at %g req/s (%g per engine)\n\n%d requests per round, %d round(s) pooled (seeds %d..), arrivals rescaled to the rate: `%s`\n\n",
				f.Name, wl.Name, wl.RPS, wl.RPS/float64(f.Engines), wl.Requests, max(wl.Rounds, 1), o.Seed, wl.Params)
			fmt.Fprintf(b, "| configuration | ok / sent | failed | TTFT p50 | p90 | p99 | mean | E2E p50 | E2E p99 | hit rate | TTFT mean per round | busiest replica / mean, per round |\n")
			fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
			for _, row := range wl.Rows {
				means := make([]string, len(row.Rounds))
				imb := make([]string, 0, len(row.Rounds))
				for i, rd := range row.Rounds {
					means[i] = sec(rd.Mean)
					if rd.Imbalance > 0 {
						imb = append(imb, fmt.Sprintf("%.2f", rd.Imbalance))
					}
				}
				if len(imb) == 0 {
					imb = append(imb, "—")
				}
				fmt.Fprintf(b, "| %s | %d / %d | %d | %s | %s | %s | %s | %s | %s | %.1f%% | %s | %s |\n",
					row.Config, row.OK, row.Sent, row.Failed, sec(row.TTFT.P50), sec(row.TTFT.P90), sec(row.TTFT.P99), sec(row.TTFT.Mean),
					sec(row.E2E.P50), sec(row.E2E.P99), 100*row.HitRate, strings.Join(means, ", "), strings.Join(imb, ", "))
			}
			for _, row := range wl.Rows {
				if len(row.Errors) > 0 {
					fmt.Fprintf(b, "\n%s errors: %s\n", row.Config, strings.Join(row.Errors, "; "))
				}
			}
		}
	}

	if len(r.Overhead) > 0 {
		fmt.Fprintf(b, "\n## Router overhead against a trivially fast backend\n\n")
		fmt.Fprintf(b, "One in-process backend answers every chat completion at once with a fixed 4-token answer "+
			"(streamed as SSE when asked). Each target is measured in turn, %d round(s) interleaved, figures are medians over rounds: "+
			"a warm-up, then %d requests at concurrency 1 (latency, wall time, end to end) and %d requests at concurrency %d (throughput). "+
			"CPU is the router process tree's utime+stime from /proc over both phases, per 1,000 requests "+
			"(10 ms resolution). warmpath runs `warmpath serve` with one replica; nginx is round-robin with keep-alive upstream connections "+
			"and `proxy_buffering off`, worker_processes auto. The load generator and the backend share the same cores.\n\n",
			o.Rounds, max(o.OverheadRequests/4, 20), o.OverheadRequests, o.OverheadConcurrency)
		fmt.Fprintf(b, "| target | mode | latency p50 | p99 | added p50 | added p99 | req/s (C=%d) | router CPU s / 1k req | failed / sent |\n", o.OverheadConcurrency)
		fmt.Fprintf(b, "|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, row := range r.Overhead {
			m := "buffered"
			if row.Stream {
				m = "stream"
			}
			added50, added99, cpu := "—", "—", "—"
			if row.Target != "direct" {
				added50, added99 = us(row.AddedP50), us(row.AddedP99)
			}
			if row.CPUPer1k >= 0 {
				cpu = fmt.Sprintf("%.3f", row.CPUPer1k)
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %.0f | %s | %d / %d |\n",
				row.Target, m, us(row.P50), us(row.P99), added50, added99, row.RPS, cpu, row.Fail, row.Requests)
		}
		for _, row := range r.Overhead {
			if len(row.Errors) > 0 {
				fmt.Fprintf(b, "\n%s (stream %v) errors: %s\n", row.Target, row.Stream, strings.Join(row.Errors, "; "))
			}
		}
	}
	if len(r.Perf) > 0 {
		writePerfMarkdown(b, r.Perf, r.PerfShapes, o.Rounds, o.BaselineLabel)
	}
	if len(r.KeepAlive) > 0 {
		fmt.Fprintf(b, "\n## Keep-alive check\n\n"+
			"The fast backend closes connections idle for %s (vLLM's uvicorn closes them after 5s by default). "+
			"Per target: 200 streamed requests at concurrency 8 fill the router's upstream pool, the pool sits idle past the timeout, "+
			"then 200 more go out. Counted: failures of the second burst.\n\n", keepAliveIdle(o))
		fmt.Fprintf(b, "| target | failed / sent after the idle gap | statuses | errors |\n|---|---:|---|---|\n")
		for _, row := range r.KeepAlive {
			fmt.Fprintf(b, "| %s | %d / %d | %s | %s |\n", row.Target, row.Failed, row.Sent, statuses(row.StatusCounts), strings.Join(row.Errors, "; "))
		}
	}
	return b.Flush()
}

// keepAliveIdle is the keep-alive check's backend idle timeout.
func keepAliveIdle(o Options) time.Duration {
	if o.Smoke {
		return 200 * time.Millisecond
	}
	return time.Second
}

func sec(s float64) string { return fmt.Sprintf("%.3fs", s) }

func us(s float64) string { return fmt.Sprintf("%.0fµs", s*1e6) }

// statuses renders status counts as "200 x 196, 503 x 4", by status.
func statuses(m map[int]int) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d × %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// unit names the seconds a fleet's latencies are in.
func unit(timeScale float64) string {
	if timeScale == 1 {
		return "wall seconds"
	}
	return "model seconds"
}

// baselines are the configurations warmpath's cost policy is held against
// in the headline: what a user runs without prefix-aware routing.
var baselines = []string{"warmpath least-request", "warmpath round-robin", "nginx round-robin"}

// headlinePoint is one (fleet, workload, rate) of the headline.
type headlinePoint struct {
	fleet, workload string
	rps             float64
	cost, best      *RoutingRow
	// roundMean and roundP99 are cost / the round's best baseline, per round.
	roundMean, roundP99 []float64
	// rrMean and rrP99 are how far apart warmpath's and nginx's
	// round-robin rows are (the larger over the smaller, 0 without both):
	// the two route alike, so what separates them is the proxy and the
	// machine's noise, a scale for the ratios.
	rrMean, rrP99 float64
}

// spread is the larger of a and b over the smaller (0 unless both > 0).
func spread(a, b float64) float64 {
	if !(a > 0) || !(b > 0) {
		return 0
	}
	return max(a, b) / min(a, b)
}

// roundRatios are cost / best baseline of the same round, per round, for
// mean and p99 TTFT: each round's best is the lowest of that round's
// baseline figures (nil when a row lacks rounds).
func (r *Results) roundRatios(wl *WorkloadResult) (mean, p99 []float64) {
	var cost *RoutingRow
	var base []*RoutingRow
	for i := range wl.Rows {
		row := &wl.Rows[i]
		switch {
		case row.Config == "warmpath cost":
			cost = row
		case slices.Contains(baselines, row.Config):
			base = append(base, row)
		}
	}
	if cost == nil || len(base) == 0 {
		return nil, nil
	}
	for i, c := range cost.Rounds {
		bm, bp := 0.0, 0.0
		for _, b := range base {
			if i >= len(b.Rounds) || b.Rounds[i].OK == 0 {
				continue
			}
			if bm == 0 || b.Rounds[i].Mean < bm {
				bm = b.Rounds[i].Mean
			}
			if bp == 0 || b.Rounds[i].P99 < bp {
				bp = b.Rounds[i].P99
			}
		}
		if bm <= 0 || bp <= 0 || c.OK == 0 {
			continue
		}
		mean, p99 = append(mean, c.Mean/bm), append(p99, c.P99/bp)
	}
	return mean, p99
}

// ratios are cost / best for mean and p99 TTFT (0 when either is missing).
func (h headlinePoint) ratios() (mean, p99 float64) {
	if h.cost == nil || h.best == nil || h.best.TTFT.Mean <= 0 || h.best.TTFT.P99 <= 0 {
		return 0, 0
	}
	return h.cost.TTFT.Mean / h.best.TTFT.Mean, h.cost.TTFT.P99 / h.best.TTFT.P99
}

// headline pairs each point's cost row with its best baseline by mean TTFT.
func (r *Results) headline() []headlinePoint {
	var out []headlinePoint
	for _, wl := range r.Workloads {
		h := headlinePoint{fleet: wl.Fleet, workload: wl.Name, rps: wl.RPS}
		h.roundMean, h.roundP99 = r.roundRatios(&wl)
		var wrr, nrr *RoutingRow
		for i := range wl.Rows {
			row := &wl.Rows[i]
			if row.OK == 0 {
				continue
			}
			switch row.Config {
			case "warmpath cost":
				h.cost = row
			case "warmpath round-robin":
				wrr = row
			case "nginx round-robin":
				nrr = row
			}
			if slices.Contains(baselines, row.Config) && (h.best == nil || row.TTFT.Mean < h.best.TTFT.Mean) {
				h.best = row
			}
		}
		if wrr != nil && nrr != nil {
			h.rrMean, h.rrP99 = spread(wrr.TTFT.Mean, nrr.TTFT.Mean), spread(wrr.TTFT.P99, nrr.TTFT.P99)
		}
		out = append(out, h)
	}
	return out
}

// writeHeadline writes, per fleet, workload and rate, warmpath's default
// (cost) policy against the best baseline, the ratios, and where cost loses.
func (r *Results) writeHeadline(b *bufio.Writer) {
	if len(r.Workloads) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Headline\n\nwarmpath's default policy (`cost`) against the best baseline at each point: the lowest mean TTFT of %s. "+
		"TTFT mean / p99 and prompt-cache hit rate over every round's requests pooled (%d round(s), a fresh workload seed each); "+
		"ratio = cost / best (below 1: cost is faster). Per round (lowest first): cost / the best baseline of that round, "+
		"which shares the round's seed and, configurations interleaved, its stretch of machine noise. "+
		"Round-robins apart: warmpath round-robin and nginx round-robin route alike, so the larger of their mean (p99) TTFTs over the smaller "+
		"is what the proxy and the machine's noise alone move a row at that point. "+
		"enginesim fleets in model seconds, llamacpp in wall seconds.\n\n", strings.Join(baselines, ", "), r.Options.RoutingRounds)
	fmt.Fprintf(b, "| fleet | workload | req/s | warmpath cost | best baseline | mean ratio | p99 ratio | mean ratio per round | p99 ratio per round | round-robins apart, mean / p99 |\n|---|---|---:|---|---|---:|---:|---|---|---:|\n")
	cell := func(row *RoutingRow) string {
		if row == nil {
			return "—"
		}
		return fmt.Sprintf("%s / %s, %.1f%%", sec(row.TTFT.Mean), sec(row.TTFT.P99), 100*row.HitRate)
	}
	ratio := func(x float64) string {
		if x <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2fx", x)
	}
	var losses []string
	var points, ahead, within int // mean ratio: all, at most 1, above 1 but within the round-robins' spread
	for _, h := range r.headline() {
		best := "—"
		if h.best != nil {
			best = h.best.Config + ": " + cell(h.best)
		}
		m, p := h.ratios()
		apart := "—"
		if h.rrMean > 0 {
			apart = ratio(h.rrMean) + " / " + ratio(h.rrP99)
		}
		fmt.Fprintf(b, "| %s | %s | %g | %s | %s | %s | %s | %s | %s | %s |\n", h.fleet, h.workload, h.rps, cell(h.cost), best, ratio(m), ratio(p),
			ratioList(h.roundMean, ratio), ratioList(h.roundP99, ratio), apart)
		if m > 0 {
			points++
			switch {
			case m <= 1:
				ahead++
			case m <= h.rrMean:
				within++
			}
		}
		var what []string
		if m > 1 {
			what = append(what, "mean "+ratio(m))
		}
		if p > 1 {
			what = append(what, "p99 "+ratio(p))
		}
		if len(what) > 0 {
			line := fmt.Sprintf("- %s / %s at %g req/s: %s against %s (cost ahead on mean in %d of %d rounds",
				h.fleet, h.workload, h.rps, strings.Join(what, ", "), h.best.Config, atMost1(h.roundMean), len(h.roundMean))
			if h.rrMean > 0 {
				line += "; the round-robins " + ratio(h.rrMean) + " / " + ratio(h.rrP99) + " apart"
			}
			losses = append(losses, line+")")
		}
	}
	if points > 0 {
		fmt.Fprintf(b, "\nMean TTFT: cost at or below the best baseline at %d of %d points", ahead, points)
		if within > 0 {
			fmt.Fprintf(b, "; at %d more, above it by no more than the two round-robins differ there", within)
		}
		fmt.Fprintf(b, ".\n")
	}
	if len(losses) == 0 {
		fmt.Fprintf(b, "\nWhere cost loses: nowhere (its mean and p99 TTFT are at or below the best baseline's at every point).\n")
		r.writeTTFTModel(b)
		return
	}
	fmt.Fprintf(b, "\nWhere cost loses (ratio above 1):\n\n%s\n", strings.Join(losses, "\n"))
	r.writeTTFTModel(b)
}

// ratioList prints per-round ratios, lowest first ("—" when none).
func ratioList(xs []float64, f func(float64) string) string {
	if len(xs) == 0 {
		return "—"
	}
	s := slices.Sorted(slices.Values(xs))
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = f(x)
	}
	return strings.Join(out, ", ")
}

// atMost1 counts the ratios at or below 1 (rounds cost did not lose).
func atMost1(xs []float64) int {
	n := 0
	for _, x := range xs {
		if x <= 1 {
			n++
		}
	}
	return n
}

// writeTTFTModel writes, per fleet, how far warmpath cost's TTFT model was
// from the TTFTs it measured, pooled over that fleet's rows.
func (r *Results) writeTTFTModel(b *bufio.Writer) {
	fmt.Fprintf(b, "\n### The TTFT model's error per fleet\n\nMeasured / predicted TTFT of every streamed request of each `warmpath cost` row, all replicas, rounds pooled: "+
		"read from the row's access log (the router's `predicted_ttft_ms` beside its `ttft_ms` less any `held_ms` (the prediction is made after a hold), the measured requests only), the ratio's 10th, 50th and 90th percentiles, "+
		"and the error's size whichever way it misses (exp |ln ratio|: 1.25 is a quarter over or a fifth under). "+
		"A row marked * had no readable log: its figures are the router's `warmpath_affinity_ttft_prediction_ratio` histogram (warm-up included), each the upper bound of its bucket (0.125, 0.25, 0.5, 0.8, 1.25, 2, 4, 8).\n\n")
	fmt.Fprintf(b, "| fleet | workload | req/s | checked | ratio p10 | p50 | p90 | error p50 | error p90 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, h := range r.headline() {
		if h.cost == nil || h.cost.TTFTModel.Checked == 0 {
			continue
		}
		m := h.cost.TTFTModel
		if !m.Exact {
			fmt.Fprintf(b, "| %s | %s | %g | %d* | — | %s | %s | — | — |\n", h.fleet, h.workload, h.rps, m.Checked, fmtRatio(m.P50), fmtRatio(m.P90))
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %g | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", h.fleet, h.workload, h.rps, m.Checked, m.P10, m.P50, m.P90, m.AbsP50, m.AbsP90)
	}
}
