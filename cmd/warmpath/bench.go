package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmpath/warmpath/bench/analyze"
	"github.com/warmpath/warmpath/bench/live"
	"github.com/warmpath/warmpath/bench/suite"
	"github.com/warmpath/warmpath/bench/workload"
)

// runBench runs a bench suite: `warmpath bench sim` (the cluster simulator,
// every workload x load x policy) or `warmpath bench live` (real processes:
// warmpath vs nginx vs direct).
func runBench(ctx context.Context, args []string, e env) error {
	if len(args) == 0 || (args[0] != "sim" && args[0] != "live") {
		fmt.Fprintln(e.stderr, "usage: warmpath bench sim|live [flags]   (-h lists the flags)")
		return errUsage
	}
	mode := args[0]
	fs := flag.NewFlagSet("bench "+mode, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	out := fs.String("out", "bench/results/"+mode, "results folder (report, plots, JSON)")
	smoke := fs.Bool("smoke", false, "tiny sizes: a wiring check in seconds, not a measurement")
	seed := fs.Uint64("seed", 1, "seed of the workloads and the routers")
	replicas := fs.Int("replicas", 0, "sim: replicas per load ladder (0 = 8); live: engines (0 = 4)")
	trace := fs.String("trace", "", "sim: Mooncake trace (default: ../shared/workloads/mooncake-synthetic.jsonl if present)")
	parallel := fs.Int("parallel", 0, "sim: simulations at once (0 = GOMAXPROCS)")
	skipNginx := fs.Bool("skip-nginx", false, "live: leave the nginx baseline out")
	commit := fs.String("commit", "", "live: commit recorded in the report (default: ask git)")
	scenario := fs.String("scenario", "", "live: run one scenario alone: \""+live.ScenarioTenants+"\" (flood vs quiet tenant, with and without the fair queue; writes tenants.md)")
	fleets := fs.String("fleets", "", "live: engine fleets, comma-separated (\"\" = all; --smoke: enginesim,enginesim-hetero); of "+strings.Join(live.Fleets(), ", "))
	so := suite.DefaultScaleOut()
	routers := fs.String("routers", joinInts(so.Routers), "sim: scale-out section's router counts (none above 1: no section)")
	syncDelay := fs.Duration("sync-delay", so.SyncDelay, "sim: scale-out peer update propagation delay (virtual time)")
	syncDelays := fs.String("sync-delays", joinDurations(so.Delays), "sim: scale-out delay sweep (\"\": none)")
	delayRouters := fs.Int("delay-routers", 4, "sim: router count of the delay sweep")
	simFleets := fs.String("sim-fleets", strings.Join(suite.DefaultFleets, ","), "sim: fleets of the fleet section (\"\": none); of "+strings.Join(suite.DefaultFleets, ", "))
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench %s: unexpected argument %q", mode, fs.Arg(0))
	}
	cmdline := "warmpath " + strings.Join(append([]string{"bench"}, args...), " ")
	if mode == "sim" {
		var err error
		if so.Routers, err = parseInts(*routers); err != nil {
			return fmt.Errorf("bench sim: --routers: %w", err)
		}
		if so.Delays, err = parseDurations(*syncDelays); err != nil {
			return fmt.Errorf("bench sim: --sync-delays: %w", err)
		}
		so.SyncDelay, so.SweepRouters = *syncDelay, *delayRouters
		if *delayRouters < 2 {
			return fmt.Errorf("bench sim: --delay-routers must be >= 2, got %d", *delayRouters)
		}
		if err := so.Validate(); err != nil {
			return fmt.Errorf("bench sim: %w", err)
		}
		sf := []string{}
		for f := range strings.SplitSeq(*simFleets, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if !slices.Contains(suite.DefaultFleets, f) {
					return fmt.Errorf("bench sim: --sim-fleets: unknown fleet %q (have %s)", f, strings.Join(suite.DefaultFleets, ", "))
				}
				sf = append(sf, f)
			}
		}
		res, err := suite.Run(suite.Options{Out: *out, Smoke: *smoke, Seed: *seed, Replicas: *replicas, Trace: *trace,
			Parallel: *parallel, Progress: e.stderr, Command: cmdline, ScaleOut: &so, Fleets: sf})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%d simulations in %.0fs; report: %s/report.md\n", len(res.Points), res.Elapsed, *out)
		return nil
	}
	fl, err := parseFleets(*fleets)
	if err != nil {
		return fmt.Errorf("bench live: --fleets: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench live: find own executable: %w", err)
	}
	res, err := live.Run(ctx, live.Options{Out: *out, Smoke: *smoke, Seed: *seed, Engines: *replicas, SkipNginx: *skipNginx,
		Fleets: fl, WarmpathBin: self, Progress: e.stderr, Command: cmdline, Commit: *commit, Scenario: *scenario})
	if err != nil {
		return err
	}
	if err := res.WriteMarkdown(e.stdout); err != nil {
		return err
	}
	report := "live.md"
	if *scenario != "" {
		report = *scenario + ".md"
	}
	fmt.Fprintf(e.stdout, "\nreport: %s/%s\n", *out, report)
	return nil
}

// runAnalyze answers "should this workload use prefix-aware routing at all?"
func runAnalyze(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	trace := fs.String("trace", "", "a Mooncake-format trace (JSON lines: timestamp, input_length, output_length, hash_ids)")
	requests := fs.String("requests", "", "a JSONL file of OpenAI request bodies (chat or completions; optional timestamp in ms)")
	replicas := fs.Int("replicas", 8, "your replica count")
	rps := fs.Float64("rps", 0, "request rate to simulate (0 = the workload's own)")
	fast := fs.Bool("fast", false, "skip the simulated TTFT estimate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var (
		w   *workload.Workload
		err error
	)
	switch {
	case (*trace == "") == (*requests == ""):
		return errors.New("analyze: give exactly one of --trace or --requests")
	case *trace != "":
		w, err = workload.LoadMooncake(*trace, "", 1)
	default:
		f, ferr := os.Open(*requests)
		if ferr != nil {
			return fmt.Errorf("analyze: %w", ferr)
		}
		defer f.Close()
		w, err = analyze.ReadRequests(f)
	}
	if err != nil {
		return err
	}
	if *replicas < 1 {
		return fmt.Errorf("analyze: --replicas must be >= 1, got %d", *replicas)
	}
	rep, err := analyze.Analyze(w, analyze.Options{Replicas: *replicas, RPS: *rps, SkipSimulation: *fast, Seed: 1})
	if err != nil {
		return err
	}
	rep.WriteText(e.stdout)
	return nil
}

// parseInts reads "1,2,4,8".
func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q: not an integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseFleets reads "enginesim,llamacpp": known fleet names, no repeats;
// "" is nil (the default list).
func parseFleets(s string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(live.Fleets(), f) {
			return nil, fmt.Errorf("unknown fleet %q (have %s)", f, strings.Join(live.Fleets(), ", "))
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("fleet %q twice", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// parseDurations reads "0,1ms,10ms"; a bare 0 is zero.
func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", f, err)
		}
		out = append(out, d)
	}
	return out, nil
}

func joinInts(xs []int) string {
	var b []string
	for _, x := range xs {
		b = append(b, strconv.Itoa(x))
	}
	return strings.Join(b, ",")
}

func joinDurations(ds []time.Duration) string {
	var b []string
	for _, d := range ds {
		b = append(b, d.String())
	}
	return strings.Join(b, ",")
}
