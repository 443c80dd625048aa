package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/analyze"
	"github.com/warmpath/warmpath/bench/live"
	"github.com/warmpath/warmpath/bench/sim"
	"github.com/warmpath/warmpath/bench/suite"
	"github.com/warmpath/warmpath/bench/workload"
)

// benchCommon are the flags both suites take.
type benchCommon struct {
	out      *string
	smoke    *bool
	seed     *uint64
	replicas *int
}

func benchFlags(mode, replicasHelp string, e env) (*flag.FlagSet, benchCommon) {
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs, benchCommon{
		out:      fs.String("out", "bench/results/"+mode, "results folder (report, plots, JSON)"),
		smoke:    fs.Bool("smoke", false, "tiny sizes: a wiring check in seconds, not a measurement"),
		seed:     fs.Uint64("seed", 1, "seed of the workloads and the routers"),
		replicas: fs.Int("replicas", 0, replicasHelp),
	}
}

func benchCmdline(mode string, args []string) string {
	return "warmpath-bench " + strings.Join(append([]string{mode}, args...), " ")
}

// runSim runs the cluster simulator suite: every workload x load x policy.
func runSim(_ context.Context, args []string, e env) error {
	fs, c := benchFlags("sim", "replicas per load ladder (0 = 8)", e)
	trace := fs.String("trace", "", "Mooncake trace (default: ../shared/workloads/mooncake-synthetic.jsonl if present; without one the workload is skipped, saying why)")
	parallel := fs.Int("parallel", 0, "simulations at once (0 = GOMAXPROCS)")
	so := suite.DefaultScaleOut()
	routers := fs.String("routers", joinInts(so.Routers), "scale-out section's router counts (none above 1: no section)")
	syncDelay := fs.Duration("sync-delay", so.SyncDelay, "scale-out peer update propagation delay (virtual time)")
	syncDelays := fs.String("sync-delays", joinDurations(so.Delays), "scale-out delay sweep (\"\": none)")
	delayRouters := fs.Int("delay-routers", 4, "router count of the delay sweep")
	simFleets := fs.String("sim-fleets", strings.Join(suite.DefaultFleets, ","), "fleets of the fleet section (\"\": none); of "+strings.Join(fleetNames(), ", "))
	slotHold := fs.Duration("slot-hold", 0, "the routers' routing.slot_hold (0: the default; negative: no holds)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected argument %q", fs.Arg(0))
	}
	var err error
	if so.Routers, err = parseInts(*routers); err != nil {
		return fmt.Errorf("sim: --routers: %w", err)
	}
	if so.Delays, err = parseDurations(*syncDelays); err != nil {
		return fmt.Errorf("sim: --sync-delays: %w", err)
	}
	so.SyncDelay, so.SweepRouters = *syncDelay, *delayRouters
	if *delayRouters < 2 {
		return fmt.Errorf("sim: --delay-routers must be >= 2, got %d", *delayRouters)
	}
	if err := so.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	sf := []string{}
	for f := range strings.SplitSeq(*simFleets, ",") {
		if f = strings.TrimSpace(f); f != "" {
			if !slices.ContainsFunc(sim.Fleets(), func(i sim.FleetInfo) bool { return i.Name == f && f != "vllm" }) {
				return fmt.Errorf("sim: --sim-fleets: unknown fleet %q (have %s)", f, strings.Join(fleetNames(), ", "))
			}
			sf = append(sf, f)
		}
	}
	res, err := suite.Run(suite.Options{Out: *c.out, Smoke: *c.smoke, Seed: *c.seed, Replicas: *c.replicas, Trace: *trace,
		Parallel: *parallel, Progress: terminalOnly(e.stderr), Log: e.stderr, Command: benchCmdline("sim", args), ScaleOut: &so, Fleets: sf,
		SlotHold: *slotHold})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d simulations in %.0fs; report: %s/report.md\n", len(res.Points), res.Elapsed, *c.out)
	return nil
}

// fleetNames are the fleets --sim-fleets takes: the simulator's, but
// vllm, which every load ladder runs on.
func fleetNames() []string {
	var out []string
	for _, f := range sim.Fleets() {
		if f.Name != "vllm" {
			out = append(out, f.Name)
		}
	}
	return out
}

// runLive runs the live suite on real processes: the warmpath binary
// beside this one (or --warmpath), nginx and enginesim or llama.cpp.
func runLive(ctx context.Context, args []string, e env) error {
	fs, c := benchFlags("live", "engines (0 = 4)", e)
	skipNginx := fs.Bool("skip-nginx", false, "leave the nginx baseline out")
	commit := fs.String("commit", "", "commit recorded in the report (default: ask git)")
	fleets := fs.String("fleets", "", "engine fleets, comma-separated (\"\" = all; --smoke: enginesim,enginesim-hetero); of "+strings.Join(live.Fleets(), ", "))
	warmpathBin := fs.String("warmpath", "", "warmpath `binary` to measure (default: warmpath beside this binary, as make build puts it; else built with the go tool)")
	enginesimBin := fs.String("enginesim", "", "enginesim `binary` (default: enginesim beside this binary; else built with the go tool)")
	scenario := fs.String("scenario", "", "run one scenario alone: \""+live.ScenarioTenants+"\" (a flooding tenant vs a quiet one, with and without the fair queue; writes tenants.md)")
	routingRounds := fs.Int("routing-rounds", 0, "rounds of every routing point, a fresh workload seed each, configurations interleaved (0 = 3; --smoke: 1)")
	routingOnly := fs.Bool("routing-only", false, "run only the routing points (no router-overhead, keep-alive or proxy-cost parts)")
	policies := fs.String("policies", "", "warmpath policies of the routing rows, comma-separated (\"\" = cost,prefix,least-request,round-robin); a row may set routing knobs beside its policy, NAME+key=value[+key=value], e.g. cost+slot_hold=-1s")
	workloads := fs.String("workloads", "", "routing workloads, comma-separated (\"\" = all); of "+strings.Join(live.Workloads(), ", "))
	routerLogs := fs.String("router-logs", "", "`folder` for every warmpath routing row's access log (JSON lines with the router's predictions) and final /debug/replicas; \"\" = none")
	warmup := fs.Int("warmup", 0, "`requests` each routing row sends first (the same workload and shared prompts with another seed, not counted), so engines' caches and the router's learned models are warm (0 = none)")
	warmupNew := fs.Bool("warmup-new-prompts", false, "draw the warm-up's shared prompts (system prompts, instructions) with its own seed too: measured requests meet caches holding other prompts, as after a prompt change")
	learnWaits := fs.Bool("learn-slot-waits", false, "set routing.learn_slot_waits for the llama.cpp fleets' routers (off: every router runs the defaults)")
	timeScale := fs.Float64("time-scale", 0, "enginesim fleets' wall seconds per model second (0 = 0.5; --smoke: 0.05; the tenants scenario keeps its own 0.5): larger runs slower and makes the router's own latency a smaller share of a model second")
	rerender := fs.String("rerender", "", "rewrite the report beside a results `file` (NAME.json to NAME.md) with this build's report format, running nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("live: unexpected argument %q", fs.Arg(0))
	}
	if *rerender != "" {
		if err := live.Rerender(*rerender); err != nil {
			return fmt.Errorf("live: --rerender: %w", err)
		}
		fmt.Fprintf(e.stdout, "report: %s.md\n", strings.TrimSuffix(*rerender, ".json"))
		return nil
	}
	if *routingRounds < 0 {
		return fmt.Errorf("live: --routing-rounds: must be >= 0, got %d", *routingRounds)
	}
	if *warmup < 0 {
		return fmt.Errorf("live: --warmup: must be >= 0, got %d", *warmup)
	}
	pol, err := parsePolicies(*policies)
	if err != nil {
		return fmt.Errorf("live: --policies: %w", err)
	}
	fl, err := parseFleets(*fleets)
	if err != nil {
		return fmt.Errorf("live: --fleets: %w", err)
	}
	wls, err := parseNames(*workloads, "workload", live.Workloads())
	if err != nil {
		return fmt.Errorf("live: --workloads: %w", err)
	}
	if !(*timeScale >= 0) || math.IsInf(*timeScale, 0) {
		return fmt.Errorf("live: --time-scale: must be a number >= 0, got %g", *timeScale)
	}
	wp, es, err := siblingBinaries(*warmpathBin, *enginesimBin)
	if err != nil {
		return fmt.Errorf("live: %w", err)
	}
	// Progress lines are plain (one per finished configuration), fit for a
	// pipe as much as a terminal.
	res, err := live.Run(ctx, live.Options{Out: *c.out, Smoke: *c.smoke, Seed: *c.seed, Engines: *c.replicas, SkipNginx: *skipNginx,
		Fleets: fl, WarmpathBin: wp, EnginesimBin: es, Progress: e.stderr, Command: benchCmdline("live", args), Commit: *commit, Scenario: *scenario,
		RoutingRounds: *routingRounds, Policies: pol, RoutingOnly: *routingOnly, Workloads: wls, TimeScale: *timeScale, RouterLogs: *routerLogs, Warmup: *warmup, WarmupNewPrompts: *warmupNew,
		LearnSlotWaits: *learnWaits})
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
	fmt.Fprintf(e.stdout, "\nreport: %s/%s\n", *c.out, report)
	return nil
}

// siblingBinaries resolves the live suite's warmpath and enginesim
// binaries: a path given, else the one beside this executable (bin/ after
// make build), else "" (live.Run builds it with the go tool).
func siblingBinaries(warmpath, enginesim string) (string, string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("find own executable: %w", err)
	}
	dir := filepath.Dir(self)
	pick := func(given, name string) (string, error) {
		if given != "" {
			if !isFile(given) {
				return "", fmt.Errorf("--%s %s: not a binary", name, given)
			}
			return given, nil
		}
		if p := filepath.Join(dir, name); isFile(p) {
			return p, nil
		}
		return "", nil
	}
	if warmpath, err = pick(warmpath, "warmpath"); err != nil {
		return "", "", err
	}
	if enginesim, err = pick(enginesim, "enginesim"); err != nil {
		return "", "", err
	}
	return warmpath, enginesim, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// terminalOnly returns w when it is a terminal, else nil: a progress bar
// redraws its line with carriage returns, which in a pipe or a file are
// only noise.
func terminalOnly(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		return w
	}
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
	if err := parseFlags(fs, args); err != nil {
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
func parseFleets(s string) ([]string, error) { return parseNames(s, "fleet", live.Fleets()) }

// parsePolicies reads "cost,least-request,cost+slot_hold=-1s": affinity's
// policy names, each optionally with routing knobs for that row (the live
// bench's PolicySpec), no repeats; "" is nil (the default list).
func parsePolicies(s string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		name, _, err := live.PolicySpec(f)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(affinity.PolicyNames(), name) {
			return nil, fmt.Errorf("unknown policy %q (have %s)", name, strings.Join(affinity.PolicyNames(), ", "))
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("policy %q twice", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// parseNames reads a comma-separated list of names out of known, each once.
func parseNames(s, what string, known []string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("unknown %s %q (have %s)", what, f, strings.Join(known, ", "))
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("%s %q twice", what, f)
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
