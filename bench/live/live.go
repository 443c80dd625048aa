// Long because it is one job: the live bench's run of fleets x workloads x
// configurations, from starting processes to the result rows.

package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmpath/warmpath/bench/internal/child"
	"github.com/warmpath/warmpath/bench/llamacpp"
	"github.com/warmpath/warmpath/bench/loadgen"
	"github.com/warmpath/warmpath/bench/suite"
	"github.com/warmpath/warmpath/bench/workload"
)

// Options configures a live bench run. Zero fields take the defaults shown
// (full / smoke).
type Options struct {
	// Out is the directory live.md and live.json are written to; "" writes
	// nothing (Results is still returned).
	Out string
	// Smoke shrinks every size so a run finishes in well under a minute.
	Smoke bool
	// Fleets are the engine clusters measured, each behind every router
	// configuration (Fleets(): all / enginesim and enginesim-hetero). The
	// llamacpp fleet needs root (it is left out with a note otherwise).
	Fleets []string
	// Engines is the number of enginesim processes behind each router
	// (4 / 2).
	Engines int
	// HeteroSlowdown is how much slower the enginesim-hetero fleet's last
	// engine is (2.5).
	HeteroSlowdown float64
	// LlamaServers, LlamaSlots and LlamaCtxPerSlot shape the llamacpp
	// fleet: servers (one core each, round-robin), slots per server (-np)
	// and context per slot in tokens (2, 4, 8192).
	LlamaServers, LlamaSlots, LlamaCtxPerSlot int
	// LlamaRequests caps each llamacpp workload's request count (40 / 12).
	LlamaRequests int
	// LlamaRPS are the llamacpp fleet's cluster arrival rates in wall
	// requests per second (2.5, 5 / 4).
	LlamaRPS []float64
	// TimeScale is the engines' --time-scale: wall time per model second
	// (0.5 / 0.05). Routing latencies are reported in model seconds.
	TimeScale float64
	// Seed seeds the workloads, the engines (engine i gets Seed+i) and
	// warmpath's tie-breaking (1).
	Seed uint64
	// Policies are the warmpath policies run in front of the engines
	// (cost, prefix, least-request, round-robin), one row each; a
	// PolicySpec with knobs ("cost+slot_hold=-1s") is a row of its own.
	Policies []string
	// Workloads names the routing workloads to run, of Workloads() (all).
	Workloads []string
	// EngineKVBlocks is each engine's --num-gpu-blocks-override, 16 tokens
	// per block (4096 = 65,536 tokens / 1024). Smaller than the workload's
	// prefix working set, so where a prefix lands matters, as on a real
	// cluster with many tenants.
	EngineKVBlocks int
	// Requests caps each routing workload's request count (512 / 48).
	Requests int
	// RPS are the routing workloads' mean arrival rates in model requests
	// per second over the whole cluster, one run of every configuration per
	// rate (3, 7 and 12 per engine / 3 per engine).
	RPS []float64
	// SkipNginx leaves the nginx rows out (they are also left out, with a
	// note, when nginx is not installed).
	SkipNginx bool
	// NginxBin, WarmpathBin and EnginesimBin are binary paths; "" finds
	// nginx in PATH or /usr/sbin and builds warmpath and enginesim with the
	// go tool (the working directory must be inside the warmpath module).
	// `warmpath-bench live` passes the binaries beside its own.
	NginxBin, WarmpathBin, EnginesimBin string
	// OverheadRequests is the request count of each closed-loop throughput
	// phase of the router-overhead bench (20000 / 300); the unloaded-latency
	// phase sends a quarter of it at concurrency 1.
	OverheadRequests int
	// OverheadConcurrency is the throughput phase's concurrency (32 / 4).
	OverheadConcurrency int
	// RoutingRounds repeats every routing point (fleet, workload, rate)
	// with a fresh workload seed per round (Seed, Seed+1, ...), the
	// configurations interleaved and their order rotated each round; rows
	// pool every round's requests and keep each round's figures (3 / 1).
	// The direct row runs in the first round only.
	RoutingRounds int
	// Rounds repeats the overhead bench, targets interleaved, and reports
	// each figure's median over rounds (3 / 1); the tenants scenario
	// repeats its rows as many times and keeps the median round.
	Rounds int
	// Progress gets one line per finished configuration; nil = none.
	Progress io.Writer `json:"-"`
	// Command is recorded in the report as the command that produced it.
	Command string
	// Commit is recorded as the code's commit; "" asks git in the working
	// directory (with "+dirty" for uncommitted changes). Set it when the
	// binaries were built elsewhere (e.g. from a clean export of a commit).
	Commit string

	// Scenario runs one part alone: "" everything above; ScenarioTenants
	// only the flood-vs-quiet-tenant scenario (written to tenants.md and
	// tenants.json instead of live.md and live.json).
	Scenario string
	// PerfOnly runs only the proxy-cost bench (perf.go) and writes
	// perf.md and perf.json instead of live.md and live.json. A full run
	// (not Smoke) runs it after the router-overhead bench.
	PerfOnly bool
	// BaselineWarmpathBin, when set, is a second warmpath binary measured
	// beside WarmpathBin in the proxy-cost bench (e.g. built from an older
	// commit), labelled BaselineLabel ("baseline" when empty).
	BaselineWarmpathBin, BaselineLabel string
	// PerfShapes, when set, runs only the proxy-cost shapes named (e.g. to
	// profile one shape's router process alone).
	PerfShapes []string

	// RoutingOnly leaves out the router-overhead, keep-alive and proxy-cost
	// parts: only the routing points run.
	RoutingOnly bool
	// RouterLogs, when set, is a folder that gets every warmpath routing
	// row's access log (one JSON line per request: replica, TTFT, cached
	// tokens, and the router's predicted TTFT, cached tokens and busy
	// count at the decision), named fleet_workload_rps_policy_rROUND.jsonl,
	// and its /debug/replicas at the end of the row (.replicas.json).
	RouterLogs string
	// LearnSlotWaits sets routing.learn_slot_waits for the llama.cpp
	// fleets' routers; off, every router runs the defaults.
	LearnSlotWaits bool
	// Warmup, when above 0, sends each routing row that many requests of
	// the same workload drawn with another seed (Seed + warmupSeed, same
	// rate) and the same shared prompts (the measured round's system
	// prompts, company instructions, documents) before the measured ones,
	// through the same router to the same engines, and waits for them to
	// finish: the measured requests meet engine caches holding the
	// deployment's shared prompts and a router whose learned models
	// (prefill rate, batch slots, busy cost, confidence) have samples, as
	// in a running deployment. They are not counted; the router's access
	// log and /metrics include them.
	Warmup int
	// WarmupNewPrompts draws the warm-up's shared prompts with its own
	// seed too: the measured requests meet caches holding other system
	// prompts, as after a deployment changes its prompts.
	WarmupNewPrompts bool
	// sharedSeed, when set, is the seed of the workloads' shared prompts
	// (fleetWorkloads; the warm-up's).
	sharedSeed uint64
}

// warmupSeed offsets the warm-up workload's seed from the measured one's.
const warmupSeed = 1 << 20

// warmupWorkload is the warm-up (Options.Warmup) of the workload name in
// the round whose options are ro, at rps; nil without one.
func warmupWorkload(ro Options, f fleet, name string, rps float64) *workload.Workload {
	if ro.Warmup <= 0 {
		return nil
	}
	wo := ro
	wo.Seed += warmupSeed
	if !ro.WarmupNewPrompts {
		wo.sharedSeed = ro.Seed
	}
	for _, w := range fleetWorkloads(wo, f) {
		if w.Name == name {
			w = atRate(w, rps)
			w.Requests = w.Requests[:min(ro.Warmup, len(w.Requests))]
			return w
		}
	}
	return nil
}

func (o Options) withDefaults() Options {
	pick := func(full, smoke int) int {
		if o.Smoke {
			return smoke
		}
		return full
	}
	if len(o.Fleets) == 0 {
		o.Fleets = Fleets()
		if o.Smoke {
			o.Fleets = []string{FleetEnginesim, FleetHetero}
		}
	}
	if o.Engines <= 0 {
		o.Engines = pick(4, 2)
	}
	if o.HeteroSlowdown <= 0 {
		o.HeteroSlowdown = 2.5
	}
	if o.LlamaServers <= 0 {
		o.LlamaServers = 2
	}
	if o.LlamaSlots <= 0 {
		o.LlamaSlots = 4
	}
	if o.LlamaCtxPerSlot <= 0 {
		o.LlamaCtxPerSlot = 8192
	}
	if o.LlamaRequests <= 0 {
		o.LlamaRequests = pick(40, 12)
	}
	if len(o.LlamaRPS) == 0 {
		o.LlamaRPS = []float64{2.5, 5}
		if o.Smoke {
			o.LlamaRPS = []float64{4}
		}
	}
	if o.TimeScale <= 0 {
		// Twice life's pace. At 0.1 the engines, the load generator and
		// the router ran ten times their real rate on the bench's two
		// cores and the CPU contention decided points: warmpath's and
		// nginx's round-robins, which route alike, were up to 2x apart in
		// a round (bench/README.md, Rounds).
		o.TimeScale = 0.5
		if o.Smoke {
			o.TimeScale = 0.05
		}
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if len(o.Policies) == 0 {
		o.Policies = []string{"cost", "prefix", "least-request", "round-robin"}
	}
	if o.EngineKVBlocks <= 0 {
		o.EngineKVBlocks = pick(4096, 1024)
	}
	if o.Requests <= 0 {
		o.Requests = pick(512, 48)
	}
	if len(o.RPS) == 0 {
		o.RPS = []float64{3 * float64(o.Engines), 7 * float64(o.Engines), 12 * float64(o.Engines)}
		if o.Smoke {
			o.RPS = o.RPS[:1]
		}
	}
	if o.OverheadRequests <= 0 {
		o.OverheadRequests = pick(20000, 300)
	}
	if o.OverheadConcurrency <= 0 {
		o.OverheadConcurrency = pick(32, 4)
	}
	if o.Rounds <= 0 {
		o.Rounds = pick(3, 1)
	}
	if o.RoutingRounds <= 0 {
		o.RoutingRounds = pick(3, 1)
	}
	if o.BaselineWarmpathBin != "" && o.BaselineLabel == "" {
		o.BaselineLabel = "baseline"
	}
	return o
}

// Results is one live bench run.
type Results struct {
	Command, Commit, Machine string
	Started                  time.Time
	Elapsed                  time.Duration
	Options                  Options
	// Nginx is "" when the nginx rows ran, else why they did not.
	Nginx     string
	Fleets    []FleetResult
	Workloads []WorkloadResult
	Overhead  []OverheadRow
	KeepAlive []KeepAliveRow
	Tenants   *TenantsResult `json:",omitempty"`
	// Perf is the proxy-cost bench per answer shape (perf.go).
	Perf       []PerfRow   `json:",omitempty"`
	PerfShapes []PerfShape `json:",omitempty"`
}

// KeepAliveRow is one target of the keep-alive check: requests sent after
// the pool sat idle longer than the backend's keep-alive timeout (uvicorn,
// vLLM's server, closes idle connections after 5s by default).
type KeepAliveRow struct {
	Target       string
	Sent, Failed int
	StatusCounts map[int]int
	Errors       []string
}

// FleetResult is one fleet of the run: what it is, or why it was left out.
type FleetResult struct {
	Name, About string
	Engines     int
	// TimeScale is the wall seconds per model second its latencies are
	// divided by: Options.TimeScale for enginesim, 1 (wall seconds) for
	// llama.cpp.
	TimeScale float64
	Skipped   string // "" when it ran
}

// WorkloadResult is one workload at one arrival rate on one fleet through
// every configuration.
type WorkloadResult struct {
	Fleet        string
	Name, Params string
	Requests     int     // per round
	Rounds       int     // rounds pooled in each row (the direct row: 1)
	RPS          float64 // cluster arrival rate, requests per (model) second
	Rows         []RoutingRow
}

// RoutingRow is one configuration (router + fresh engines) on one workload.
// Latencies are model seconds.
type RoutingRow struct {
	Config  string // "warmpath cost", "nginx round-robin", "direct (1 engine)"
	Engines int
	loadgen.Result
	HitRate float64
	// TTFTModel is warmpath's per-replica TTFT model against the TTFTs it
	// measured (its ttft_prediction_ratio histogram over every replica);
	// zero for other routers.
	TTFTModel TTFTModelError `json:",omitempty"`
	// Imbalance is the busiest replica's request count over the mean
	// (warmpath rows; 1 = even); pooled rows keep the largest round's.
	Imbalance float64 `json:",omitempty"`
	// Rounds are each round's own figures, in round order; the row's
	// Result pools them.
	Rounds []RoundFigures `json:",omitempty"`
}

// RoundFigures is one round of a routing row.
type RoundFigures struct {
	Seed      uint64
	OK, Sent  int
	Mean, P99 float64 // TTFT
	HitRate   float64
	Imbalance float64 // RoutingRow.Imbalance of this round
}

// OverheadRow is one target of the router-overhead bench in one mode;
// figures are medians over rounds. Latencies are wall seconds.
type OverheadRow struct {
	Target string // "direct", "warmpath cost", "warmpath round-robin", "nginx"
	Stream bool
	// P50, P99: end-to-end latency at concurrency 1; Added*: minus direct's.
	P50, P99, AddedP50, AddedP99 float64
	// RPS is completed requests per second at OverheadConcurrency.
	RPS float64
	// CPUPer1k is the router process tree's CPU seconds (utime+stime from
	// /proc) per 1,000 requests over both phases; -1 for direct.
	CPUPer1k       float64
	Requests, Fail int
	Errors         []string // the first few distinct errors over rounds
}

var errUnsupported = errors.New("live bench: needs Linux (/proc, process groups)")

// Run runs the live bench: every routing configuration on every workload,
// then the router-overhead bench; it writes live.md and live.json into
// opts.Out when set. Every child process is stopped before Run returns,
// on every path.
func Run(ctx context.Context, opts Options) (*Results, error) {
	if !child.Supported {
		return nil, errUnsupported
	}
	opts = opts.withDefaults()
	if opts.Scenario != "" && opts.Scenario != ScenarioTenants {
		return nil, fmt.Errorf("live: unknown scenario %q (have %q)", opts.Scenario, ScenarioTenants)
	}
	for _, w := range opts.Workloads {
		if !slices.Contains(Workloads(), w) {
			return nil, fmt.Errorf("live: unknown workload %q (have %v)", w, Workloads())
		}
	}
	for _, p := range opts.Policies {
		if _, _, err := PolicySpec(p); err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
	}
	if opts.RouterLogs != "" {
		if err := os.MkdirAll(opts.RouterLogs, 0o755); err != nil {
			return nil, fmt.Errorf("live: router logs: %w", err)
		}
	}
	if len(opts.Workloads) > 0 && len(fleetWorkloads(opts, fleet{requests: 1})) == 0 {
		return nil, fmt.Errorf("live: workloads %v: none runs in this mode (smoke runs shared-prefix and one-company)", opts.Workloads)
	}
	if !(opts.TimeScale > 0) || math.IsInf(opts.TimeScale, 0) {
		return nil, fmt.Errorf("live: time scale %g: want a finite number > 0", opts.TimeScale)
	}
	res := &Results{Command: opts.Command, Commit: opts.Commit, Machine: suite.Machine(), Started: time.Now().UTC(), Options: opts}
	if res.Commit == "" {
		res.Commit = commit()
	}
	tmp, err := os.MkdirTemp("", "warmpath-live-")
	if err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	defer os.RemoveAll(tmp)

	if opts.WarmpathBin == "" || opts.EnginesimBin == "" {
		wp, es, err := buildBinaries(ctx, tmp)
		if err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
		if opts.WarmpathBin == "" {
			opts.WarmpathBin = wp
		}
		if opts.EnginesimBin == "" {
			opts.EnginesimBin = es
		}
	}
	if opts.Scenario == ScenarioTenants {
		if res.Tenants, err = runTenants(ctx, opts, tmp); err != nil {
			return nil, fmt.Errorf("live: tenants: %w", err)
		}
		return res.done(opts.Out, res.writeTenants)
	}
	nginx := ""
	switch {
	case opts.SkipNginx:
		res.Nginx = "skipped (Options.SkipNginx)"
	default:
		if nginx, err = findNginx(opts.NginxBin); err != nil {
			res.Nginx = err.Error()
			nginx = ""
			progress(opts, "nginx rows left out: %v", err)
		}
	}

	if opts.PerfOnly {
		if res.Perf, res.PerfShapes, err = runPerf(ctx, opts, tmp, nginx); err != nil {
			return nil, fmt.Errorf("live: perf: %w", err)
		}
		return res.done(opts.Out, res.write)
	}
	if err := knownFleets(opts.Fleets); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	for _, name := range opts.Fleets {
		f, err := fleetSpec(opts, name)
		if err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
		fr := FleetResult{Name: f.name, About: f.about, Engines: f.engines, TimeScale: f.timeScale}
		if f.llama {
			if _, err := llamacpp.SetupWith(ctx, opts.Progress); err != nil {
				fr.Skipped = err.Error()
				progress(opts, "fleet %s left out: %v", name, err)
				res.Fleets = append(res.Fleets, fr)
				continue
			}
		}
		res.Fleets = append(res.Fleets, fr)
		for _, w := range fleetWorkloads(opts, f) {
			for _, rps := range f.rps {
				wr, err := runPoint(ctx, opts, tmp, nginx, f, w.Name, rps)
				if err != nil {
					return nil, fmt.Errorf("live: %s: %s at %g req/s: %w", name, w.Name, rps, err)
				}
				res.Workloads = append(res.Workloads, *wr)
			}
		}
	}
	if !opts.RoutingOnly {
		if res.Overhead, err = runOverhead(ctx, opts, tmp, nginx); err != nil {
			return nil, fmt.Errorf("live: overhead: %w", err)
		}
		if res.KeepAlive, err = runKeepAlive(ctx, opts, tmp, nginx); err != nil {
			return nil, fmt.Errorf("live: keep-alive check: %w", err)
		}
	}
	if !opts.RoutingOnly && !opts.Smoke {
		if res.Perf, res.PerfShapes, err = runPerf(ctx, opts, tmp, nginx); err != nil {
			return nil, fmt.Errorf("live: perf: %w", err)
		}
	}
	return res.done(opts.Out, res.write)
}

// done stamps the run's elapsed time and, when out is set, writes the
// report into it with write.
func (r *Results) done(out string, write func(dir string) error) (*Results, error) {
	r.Elapsed = time.Since(r.Started)
	if out != "" {
		if err := write(out); err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
	}
	return r, nil
}

func progress(o Options, format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "live: "+format+"\n", args...)
	}
}

// atRate returns a copy of w with arrivals rescaled to rps.
func atRate(w *workload.Workload, rps float64) *workload.Workload {
	c := &workload.Workload{Name: w.Name, Params: w.Params, Requests: slices.Clone(w.Requests)}
	c.ScaleRate(rps)
	return c
}

// everyNth keeps the requests an engine behind an even split would get:
// whole conversations (multi-turn) or every nth request, arrival times
// kept, so one engine sees the per-engine load of the routed cluster.
func everyNth(w *workload.Workload, n int) *workload.Workload {
	out := &workload.Workload{Name: w.Name, Params: w.Params}
	for i, r := range w.Requests {
		k := i
		if r.Conversation >= 0 {
			k = r.Conversation
		}
		if k%n == 0 {
			out.Requests = append(out.Requests, r)
		}
	}
	return out
}

// config is one routing configuration.
type config struct {
	name    string
	policy  string // warmpath policy; "" for nginx and direct
	nginx   bool
	engines int
}

// direct is the one-engine reference row (no router).
func (c config) direct() bool { return c.policy == "" && !c.nginx }

// runPoint runs every configuration on workload name at rate rps,
// RoutingRounds times (fresh seed per round, configurations interleaved,
// order rotated), and pools each configuration's rounds into one row.
func runPoint(ctx context.Context, o Options, tmp, nginx string, f fleet, name string, rps float64) (*WorkloadResult, error) {
	var cfgs []config
	for _, p := range o.Policies {
		cfgs = append(cfgs, config{name: "warmpath " + p, policy: p, engines: f.engines})
	}
	if nginx != "" {
		cfgs = append(cfgs, config{name: "nginx round-robin", nginx: true, engines: f.engines})
	}
	cfgs = append(cfgs, config{name: "direct (1 engine, 1/" + strconv.Itoa(f.engines) + " of the load)", engines: 1})
	wr := &WorkloadResult{Fleet: f.name, Name: name, RPS: rps, Rounds: o.RoutingRounds}
	per := make([][]*RoutingRow, len(cfgs))
	for round := range o.RoutingRounds {
		ro := o
		ro.Seed = o.Seed + uint64(round)
		i := slices.IndexFunc(fleetWorkloads(ro, f), func(w *workload.Workload) bool { return w.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("workload %s not generated for seed %d", name, ro.Seed)
		}
		w := atRate(fleetWorkloads(ro, f)[i], rps)
		warm := warmupWorkload(ro, f, name, rps)
		if round == 0 {
			wr.Params, wr.Requests = w.Params, len(w.Requests)
		}
		for k := range cfgs {
			ci := (k + round) % len(cfgs)
			c := cfgs[ci]
			if c.direct() && round > 0 {
				continue
			}
			row, err := runConfig(ctx, ro, tmp, nginx, f, c, w, warm, fmt.Sprintf("%s_%s_%g_%s_r%d", f.name, name, rps, c.policy, round+1))
			if err != nil {
				return nil, fmt.Errorf("%s (round %d): %w", c.name, round+1, err)
			}
			progress(o, "%s: %s at %g req/s / %s, round %d/%d: ok %d/%d failed %d, TTFT mean %.3fs p99 %.3fs, hit %.1f%%",
				f.name, name, rps, c.name, round+1, o.RoutingRounds, row.OK, row.Sent, row.Failed, row.TTFT.Mean, row.TTFT.P99, 100*row.HitRate)
			per[ci] = append(per[ci], row)
		}
	}
	for i, c := range cfgs {
		wr.Rows = append(wr.Rows, poolRounds(c, per[i], o.Seed))
	}
	return wr, nil
}

// poolRounds folds one configuration's rounds into one row.
func poolRounds(c config, rounds []*RoutingRow, seed uint64) RoutingRow {
	results := make([]*loadgen.Result, len(rounds))
	row := RoutingRow{Config: c.name, Engines: c.engines}
	for i, r := range rounds {
		results[i] = &r.Result
		row.TTFTModel = row.TTFTModel.merge(r.TTFTModel)
		row.Imbalance = max(row.Imbalance, r.Imbalance)
		row.Rounds = append(row.Rounds, RoundFigures{Seed: seed + uint64(i), OK: r.OK, Sent: r.Sent,
			Mean: r.TTFT.Mean, P99: r.TTFT.P99, HitRate: r.HitRate, Imbalance: r.Imbalance})
	}
	row.Result = *loadgen.Merge(results...)
	row.HitRate = row.Result.HitRate()
	return row
}

// runConfig starts fresh engines (cold caches) and the router, sends the
// warm-up workload (when not nil) and then the measured one, and stops
// everything it started.
// logName names the row's files in Options.RouterLogs.
func runConfig(ctx context.Context, o Options, tmp, nginx string, f fleet, c config, w, warm *workload.Workload, logName string) (*RoutingRow, error) {
	var g child.Group
	defer g.Stop()
	addrs, engineFailure, stopEngines, err := startEngines(ctx, o, f, c.engines, &g)
	if err != nil {
		return nil, err
	}
	defer stopEngines()
	url := "http://" + addrs[0]
	adminURL, access := "", ""
	switch {
	case c.policy != "":
		// The access log is always written: the TTFT model's error is read
		// from it (ttftErrorFromLog).
		access = filepath.Join(tmp, logName+".jsonl")
		if o.RouterLogs != "" {
			access = filepath.Join(o.RouterLogs, logName+".jsonl")
		}
		p, listen, admin, err := startWarmpath(ctx, o.WarmpathBin, tmp, routerSetup{
			policy: c.policy, model: workload.DefaultModel, replicas: addrs,
			kvTokens: f.kvTokens, timeScale: f.timeScale, prefillRate: f.prefillRate, seed: o.Seed,
			accessLog: access, learnSlotWaits: f.llama && o.LearnSlotWaits,
		})
		if err != nil {
			return nil, err
		}
		g.Add(p)
		url, adminURL = "http://"+listen, "http://"+admin
	case c.nginx:
		p, listen, err := startNginx(ctx, nginx, tmp, addrs)
		if err != nil {
			return nil, err
		}
		g.Add(p)
		url = "http://" + listen
	default:
		w = everyNth(w, f.engines)
		if warm != nil {
			warm = everyNth(warm, f.engines)
		}
	}
	if warm != nil && len(warm.Requests) > 0 {
		if _, err := loadgen.Run(ctx, loadgen.Config{
			URL: url, Workload: warm, TimeScale: f.timeScale, Stream: true,
			MaxDuration: 3 * time.Minute, RequestTimeout: time.Minute,
		}); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	res, err := loadgen.Run(ctx, loadgen.Config{
		URL: url, Workload: w, TimeScale: f.timeScale, Stream: true,
		MaxDuration: 3 * time.Minute, RequestTimeout: time.Minute,
	})
	if err != nil {
		return nil, err
	}
	// A crash during the run is a finding, not a row.
	if err := g.Failure(); err != nil {
		return nil, err
	}
	if err := engineFailure(); err != nil {
		return nil, err
	}
	row := &RoutingRow{Config: c.name, Engines: c.engines, Result: *res, HitRate: res.HitRate()}
	if adminURL != "" {
		// The router's own record of its TTFT model; a failed scrape
		// leaves the row without it.
		row.TTFTModel, row.Imbalance, _ = scrapeRouter(ctx, adminURL+"/metrics")
		skip := 0
		if warm != nil {
			skip = len(warm.Requests)
		}
		if m, err := ttftErrorFromLog(access, skip, skip+len(w.Requests)); err == nil {
			m.cum = row.TTFTModel.cum
			row.TTFTModel = m
		}
		if o.RouterLogs != "" {
			if err := saveURL(ctx, adminURL+"/debug/replicas", filepath.Join(o.RouterLogs, logName+".replicas.json")); err != nil {
				return nil, fmt.Errorf("router logs: %w", err)
			}
		}
	}
	return row, nil
}

func startEngine(ctx context.Context, o Options, i uint64, extra []string) (p *child.Proc, addr string, err error) {
	err = child.RetryBind(func() (err error) {
		p, addr, err = startEngineOnce(ctx, o, i, extra)
		return err
	})
	return p, addr, err
}

func startEngineOnce(ctx context.Context, o Options, i uint64, extra []string) (*child.Proc, string, error) {
	addr, err := child.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	args := append([]string{"--listen", addr, "--served-model-name", workload.DefaultModel,
		"--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64),
		"--seed", strconv.FormatUint(o.Seed+i, 10),
		"--num-gpu-blocks-override", strconv.Itoa(o.EngineKVBlocks),
		"--enable-admin=false", "--log-level", "warn"}, extra...)
	p, err := child.Start("enginesim "+addr, o.EnginesimBin, args...)
	if err != nil {
		return nil, "", err
	}
	if err := child.WaitReady(ctx, p, "http://"+addr+"/health", 10*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, "", err
	}
	return p, addr, nil
}

// overheadTarget is one front of the fast backend.
type overheadTarget struct {
	name string
	url  string
	pid  int // router process (tree) whose CPU is counted; 0 = none
}

// runOverhead measures the routers against the trivially fast backend:
// per round, per mode (buffered, streamed), per target in turn: a warm-up,
// an unloaded-latency phase (concurrency 1) and a throughput phase
// (OverheadConcurrency), with the router's CPU read around both phases.
func runOverhead(ctx context.Context, o Options, tmp, nginx string) ([]OverheadRow, error) {
	fast, err := startFast(workload.DefaultModel, 0)
	if err != nil {
		return nil, err
	}
	defer fast.close()
	var g child.Group
	defer g.Stop()
	targets := []overheadTarget{{name: "direct", url: "http://" + fast.addr()}}
	for _, pol := range []string{"cost", "round-robin"} {
		p, listen, _, err := startWarmpath(ctx, o.WarmpathBin, tmp, routerSetup{
			policy: pol, model: workload.DefaultModel, replicas: []string{fast.addr()}, timeScale: 1, seed: o.Seed,
		})
		if err != nil {
			return nil, err
		}
		g.Add(p)
		targets = append(targets, overheadTarget{name: "warmpath " + pol, url: "http://" + listen, pid: p.Pid()})
	}
	if nginx != "" {
		p, listen, err := startNginx(ctx, nginx, tmp, []string{fast.addr()})
		if err != nil {
			return nil, err
		}
		g.Add(p)
		targets = append(targets, overheadTarget{name: "nginx", url: "http://" + listen, pid: p.Pid()})
	}

	sp := workload.DefaultSharedPrefix()
	sp.Seed, sp.Groups, sp.PromptsPerGroup, sp.SystemTokens, sp.QuestionTokens, sp.OutputTokens = o.Seed, 8, 8, 256, 32, 4
	w, err := workload.SharedPrefix(sp)
	if err != nil {
		return nil, err
	}
	type sample struct{ p50, p99, rps, cpu1k float64 }
	samples := map[string][]sample{} // key: target + mode
	fails := map[string]int{}
	errs := map[string][]string{}
	reqs := map[string]int{}
	latN := max(o.OverheadRequests/4, 20)
	for round := range o.Rounds {
		for _, stream := range []bool{false, true} {
			for _, t := range targets {
				key := t.name + "/" + strconv.FormatBool(stream)
				run := func(conc, n int) (*loadgen.Result, error) {
					return loadgen.RunClosed(ctx, loadgen.ClosedConfig{
						URL: t.url, Workload: w, Concurrency: conc, Requests: n, Stream: stream,
						MaxDuration: 2 * time.Minute, RequestTimeout: 10 * time.Second,
					})
				}
				if _, err := run(o.OverheadConcurrency, min(200, o.OverheadRequests)); err != nil { // warm-up: connections, pools
					return nil, err
				}
				var cpu0 time.Duration
				if t.pid != 0 {
					if cpu0, err = treeCPU(t.pid); err != nil {
						return nil, err
					}
				}
				lat, err := run(1, latN)
				if err != nil {
					return nil, err
				}
				thr, err := run(o.OverheadConcurrency, o.OverheadRequests)
				if err != nil {
					return nil, err
				}
				s := sample{p50: lat.E2E.P50, p99: lat.E2E.P99, rps: thr.RPS, cpu1k: -1}
				if t.pid != 0 {
					cpu1, err := treeCPU(t.pid)
					if err != nil {
						return nil, err
					}
					s.cpu1k = (cpu1 - cpu0).Seconds() / float64(lat.Sent+thr.Sent) * 1000
				}
				samples[key] = append(samples[key], s)
				fails[key] += lat.Failed + thr.Failed
				for _, e := range append(lat.Errors, thr.Errors...) {
					if len(errs[key]) < 4 && !slices.Contains(errs[key], e) {
						errs[key] = append(errs[key], e)
					}
				}
				reqs[key] += lat.Sent + thr.Sent
				progress(o, "overhead round %d %s stream=%v: p50 %.0fµs p99 %.0fµs, %.0f req/s, cpu %.3fs/1k, failed %d",
					round+1, t.name, stream, 1e6*s.p50, 1e6*s.p99, s.rps, s.cpu1k, lat.Failed+thr.Failed)
			}
		}
	}
	for _, p := range g.Procs {
		if err := p.Failure(); err != nil {
			return nil, err
		}
	}
	var rows []OverheadRow
	for _, stream := range []bool{false, true} {
		var direct OverheadRow
		for _, t := range targets {
			key := t.name + "/" + strconv.FormatBool(stream)
			ss := samples[key]
			med := func(f func(sample) float64) float64 {
				v := make([]float64, len(ss))
				for i, s := range ss {
					v[i] = f(s)
				}
				slices.Sort(v)
				return v[len(v)/2]
			}
			r := OverheadRow{Target: t.name, Stream: stream,
				P50: med(func(s sample) float64 { return s.p50 }), P99: med(func(s sample) float64 { return s.p99 }),
				RPS: med(func(s sample) float64 { return s.rps }), CPUPer1k: med(func(s sample) float64 { return s.cpu1k }),
				Requests: reqs[key], Fail: fails[key], Errors: errs[key]}
			if t.name == "direct" {
				direct = r
			}
			r.AddedP50, r.AddedP99 = r.P50-direct.P50, r.P99-direct.P99
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// commit is the checkout's commit (with "+dirty" for local changes), or
// "unknown" outside a git checkout.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "+dirty"
	}
	return c
}

// runKeepAlive is the keep-alive check: a fast backend that closes idle
// connections after a short timeout; per target, a burst fills the router's
// upstream pool, the pool sits idle past the timeout, and a second burst
// goes out. A router that reuses a connection the backend closed must retry
// it on a fresh one, not fail the request or blame the replica.
func runKeepAlive(ctx context.Context, o Options, tmp, nginx string) ([]KeepAliveRow, error) {
	idle := keepAliveIdle(o)
	fast, err := startFast(workload.DefaultModel, idle)
	if err != nil {
		return nil, err
	}
	defer fast.close()
	var g child.Group
	defer g.Stop()
	targets := []overheadTarget{{name: "direct", url: "http://" + fast.addr()}}
	p, listen, _, err := startWarmpath(ctx, o.WarmpathBin, tmp, routerSetup{
		policy: "cost", model: workload.DefaultModel, replicas: []string{fast.addr()}, timeScale: 1, seed: o.Seed,
	})
	if err != nil {
		return nil, err
	}
	g.Add(p)
	targets = append(targets, overheadTarget{name: "warmpath cost", url: "http://" + listen})
	if nginx != "" {
		p, listen, err := startNginx(ctx, nginx, tmp, []string{fast.addr()})
		if err != nil {
			return nil, err
		}
		g.Add(p)
		targets = append(targets, overheadTarget{name: "nginx", url: "http://" + listen})
	}
	sp := workload.DefaultSharedPrefix()
	sp.Seed, sp.Groups, sp.PromptsPerGroup, sp.SystemTokens, sp.QuestionTokens, sp.OutputTokens = o.Seed, 4, 4, 64, 16, 4
	w, err := workload.SharedPrefix(sp)
	if err != nil {
		return nil, err
	}
	var rows []KeepAliveRow
	for _, t := range targets {
		var last *loadgen.Result
		for phase := range 2 {
			if phase == 1 {
				select {
				case <-time.After(idle + idle/2):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			r, err := loadgen.RunClosed(ctx, loadgen.ClosedConfig{
				URL: t.url, Workload: w, Concurrency: 8, Requests: 200, Stream: true,
				MaxDuration: 30 * time.Second, RequestTimeout: 5 * time.Second,
			})
			if err != nil {
				return nil, err
			}
			last = r
		}
		rows = append(rows, KeepAliveRow{Target: t.name, Sent: last.Sent, Failed: last.Failed, StatusCounts: last.StatusCounts, Errors: last.Errors})
		progress(o, "keep-alive check %s: failed %d/%d after an idle gap %v", t.name, last.Failed, last.Sent, idle+idle/2)
	}
	return rows, nil
}
