// Long because it is one job: the suite's grid (workloads x loads x policies x
// fleets) and the loop that walks it, with its progress; the report is report.go.

package suite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/sim"
	"github.com/warmpath/warmpath/bench/workload"
)

// Options configure a simulator suite run.
type Options struct {
	// Out is the results folder; report.md, plots and results.json go there.
	Out string
	// Smoke shrinks every workload and sweep to seconds (CI).
	Smoke bool
	// Seed seeds the workloads and the routers. 0 means 1.
	Seed uint64
	// Replicas for the per-workload load ladders. 0 means 8.
	Replicas int
	// Trace is the Mooncake trace; "" looks for ../shared/workloads/mooncake-synthetic.jsonl.
	Trace string
	// Parallel runs at once. 0 means GOMAXPROCS.
	Parallel int
	// Progress receives a progress bar (nil: none). It redraws its line
	// with carriage returns: give it a terminal.
	Progress io.Writer
	// Log receives one line per notable event, such as a workload left out
	// and why (nil: none). Plain lines, fit for a file or a pipe.
	Log io.Writer
	// Command is recorded in the report so anyone can reproduce it.
	Command string
	// ScaleOut configures the scale-out section (several routers). nil
	// means DefaultScaleOut().
	ScaleOut *ScaleOut
	// Fleets are the engine fleets of the fleet section (sim.Fleets names
	// other than "vllm", which every ladder runs on). nil means
	// DefaultFleets; empty means no fleet section.
	Fleets []string
	// SlotHold is the routers' routing.slot_hold (affinity.Config.SlotHold):
	// 0 the default, negative no holds.
	SlotHold time.Duration
}

// router is the routers' configuration beyond the policy.
func (o *Options) router() affinity.Config { return affinity.Config{SlotHold: o.SlotHold} }

// DefaultFleets are the fleets the fleet section runs.
var DefaultFleets = []string{"batch-4", "batch-16", "batch-64", "hetero", "no-cache", "llamacpp"}

// fleetWorkloads are the workloads each fleet runs, at fleetLoads.
var (
	fleetWorkloads = []string{"one-company", "gateway", "multi-turn"}
	fleetLoads     = []float64{0.5, 0.8, 0.95}
)

// Loads are the load levels of the ladder, as fractions of the cluster's
// measured capacity (least-request throughput under overload).
var Loads = []float64{0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 1.1}

// headlineLoads are the columns of the headline table.
var headlineLoads = []float64{0.5, 0.8, 0.95}

// Point is one simulated run in the results.
type Point struct {
	Workload string  `json:"workload"`
	Load     float64 `json:"load"` // fraction of capacity (ladder) or 0.8 (sweeps)
	RPS      float64 `json:"rps"`
	Sweep    string  `json:"sweep,omitempty"` // "", "replicas", "cache", "fleet"
	Fleet    string  `json:"fleet,omitempty"` // the fleet section's fleet ("": vllm)
	Param    int     `json:"param,omitempty"` // the swept value
	// Scale-out points ("scaleout", "scaleout-delay"): router count, sync,
	// propagation delay.
	Routers   int         `json:"routers,omitempty"`
	Sync      bool        `json:"sync,omitempty"`
	SyncDelay float64     `json:"sync_delay_seconds,omitempty"`
	Result    *sim.Result `json:"result"`
}

// Results is everything a suite run produced.
type Results struct {
	Started  time.Time          `json:"started"`
	Elapsed  float64            `json:"elapsed_seconds"`
	Seed     uint64             `json:"seed"`
	Replicas int                `json:"replicas"`
	Capacity map[string]float64 `json:"capacity_rps"`
	// FleetCapacity is each fleet's capacity per workload (fleet section).
	FleetCapacity map[string]map[string]float64 `json:"fleet_capacity_rps,omitempty"`
	Workloads     []workloadInfo                `json:"workloads"`
	// Skipped names each workload left out, with the reason.
	Skipped []string `json:"skipped,omitempty"`
	Points  []Point  `json:"points"`
}

type workloadInfo struct {
	Name     string  `json:"name"`
	Params   string  `json:"params"`
	Requests int     `json:"requests"`
	Reuse    float64 `json:"reusable_share"` // unbounded-cache reusable prompt share
}

type job struct {
	w        *workload.Workload
	cfg      sim.Config
	point    Point
	fraction float64
}

// Run runs the suite and writes the report into opts.Out.
func Run(opts Options) (*Results, error) {
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	if opts.Replicas == 0 {
		opts.Replicas = 8
	}
	if opts.Parallel <= 0 {
		opts.Parallel = runtime.GOMAXPROCS(0)
	}
	if opts.Out == "" {
		return nil, errors.New("suite: no output folder")
	}
	so := DefaultScaleOut()
	if opts.ScaleOut != nil {
		so = *opts.ScaleOut
	}
	so.withDefaults()
	if err := so.Validate(); err != nil {
		return nil, err
	}
	opts.ScaleOut = &so
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, fmt.Errorf("suite: %w", err)
	}
	ws, skipped, err := workloads(opts)
	if err != nil {
		return nil, err
	}
	if opts.Fleets == nil {
		opts.Fleets = DefaultFleets
	}
	for _, f := range opts.Fleets {
		if _, err := sim.FleetEngines(f, 1); err != nil || f == "vllm" {
			return nil, fmt.Errorf("suite: fleet %q: want one of %v", f, DefaultFleets)
		}
	}
	res := &Results{Started: time.Now(), Seed: opts.Seed, Replicas: opts.Replicas, Capacity: map[string]float64{},
		FleetCapacity: map[string]map[string]float64{}, Skipped: skipped}
	for _, s := range skipped {
		if opts.Log != nil {
			fmt.Fprintln(opts.Log, "suite: workload "+s)
		}
	}
	policies := sim.Policies()
	engine := enginesim.DefaultConfig()

	// 1. capacity of each workload on this cluster
	bar := newBar(opts.Progress, len(ws))
	for _, w := range ws {
		r, total := workload.Reuse(w)
		res.Workloads = append(res.Workloads, workloadInfo{w.Name, w.Params, len(w.Requests), float64(r) / float64(total)})
		capRPS, err := capacity(w, sim.Config{Replicas: opts.Replicas, Engine: engine, Seed: opts.Seed})
		if err != nil {
			return nil, err
		}
		res.Capacity[w.Name] = capRPS
		bar.step("capacity " + w.Name)
	}
	fleetWs := []*workload.Workload{}
	for _, w := range ws {
		if slices.Contains(fleetWorkloads, w.Name) {
			fleetWs = append(fleetWs, w)
		}
	}
	bar = newBar(opts.Progress, len(opts.Fleets)*len(fleetWs))
	for _, f := range opts.Fleets {
		res.FleetCapacity[f] = map[string]float64{}
		engines, _ := sim.FleetEngines(f, opts.Replicas)
		for _, w := range fleetWs {
			capRPS, err := capacity(w, sim.Config{Replicas: opts.Replicas, Engines: engines, Fleet: f, Seed: opts.Seed})
			if err != nil {
				return nil, err
			}
			res.FleetCapacity[f][w.Name] = capRPS
			bar.step("capacity " + f + " " + w.Name)
		}
	}

	// 2. the load ladder: every workload x load x policy
	var jobs []job
	scaleBase := map[string]job{} // the cost policy's 80% point of each scale-out workload
	for _, w := range ws {
		for _, f := range Loads {
			for _, p := range policies {
				j := job{w: w, fraction: f, cfg: sim.Config{Replicas: opts.Replicas, Policy: p.Name, Seed: opts.Seed, Engine: engine, Router: opts.router()},
					point: Point{Workload: w.Name, Load: f, RPS: f * res.Capacity[w.Name]}}
				jobs = append(jobs, j)
				if p.Name == ours && f == scaleLoad && so.enabled() && slices.Contains(so.Workloads, w.Name) {
					scaleBase[w.Name] = j
				}
			}
		}
	}
	// 3. sweeps at 80% load: replicas, and KV cache size per replica
	sweepPolicies := []string{"cost", "least-request", "round-robin", "consistent-hash", "sglang-cache-aware", "llm-d", "dynamo-kv"}
	replicaCounts := []int{4, 16, 64, 256, 1024}
	if opts.Smoke {
		replicaCounts = []int{2, 4}
	}
	for _, n := range replicaCounts {
		w, err := scaledShared(opts, n)
		if err != nil {
			return nil, err
		}
		capRPS, err := capacity(w, sim.Config{Replicas: n, Engine: engine, Seed: opts.Seed})
		if err != nil {
			return nil, err
		}
		for _, p := range sweepPolicies {
			jobs = append(jobs, job{w: w, fraction: 0.8, cfg: sim.Config{Replicas: n, Policy: p, Seed: opts.Seed, Engine: engine, Router: opts.router()},
				point: Point{Workload: w.Name, Load: 0.8, RPS: 0.8 * capRPS, Sweep: "replicas", Param: n}})
		}
	}
	b2b := ws[1]
	blocks := []int{1500, 3000, 6000, 12000, 25000}
	if opts.Smoke {
		blocks = []int{1500, 25000}
	}
	for _, nb := range blocks {
		e := engine
		e.NumGPUBlocks = nb
		for _, p := range sweepPolicies {
			jobs = append(jobs, job{w: b2b, fraction: 0.8, cfg: sim.Config{Replicas: opts.Replicas, Policy: p, Seed: opts.Seed, Engine: e, Router: opts.router()},
				point: Point{Workload: b2b.Name, Load: 0.8, RPS: 0.8 * res.Capacity[b2b.Name], Sweep: "cache", Param: nb}})
		}
	}

	// 3a. fleets: engines as production runs them, the same policies
	for _, f := range opts.Fleets {
		engines, _ := sim.FleetEngines(f, opts.Replicas)
		for _, w := range fleetWs {
			for _, l := range fleetLoads {
				for _, p := range policies {
					rps := l * res.FleetCapacity[f][w.Name]
					jobs = append(jobs, job{w: w, fraction: l,
						cfg:   sim.Config{Replicas: opts.Replicas, Policy: p.Name, Seed: opts.Seed, Engines: engines, Fleet: f, Router: opts.router()},
						point: Point{Workload: w.Name, Load: l, RPS: rps, Sweep: "fleet", Fleet: f}})
				}
			}
		}
	}

	// 3b. scale-out: the cost policy with several routers, synced or not
	for _, w := range ws {
		if j, ok := scaleBase[w.Name]; ok {
			jobs = append(jobs, scaleOutJobs(opts, j)...)
		}
	}

	bar = newBar(opts.Progress, len(jobs))
	points, err := runJobs(opts, jobs, bar)
	if err != nil {
		return nil, err
	}
	res.Points = points
	// 4. the strongest anchor of each scale-out workload, unsynced (needs the ladder)
	if jobs := anchorJobs(opts, res, scaleBase); len(jobs) > 0 {
		points, err := runJobs(opts, jobs, newBar(opts.Progress, len(jobs)))
		if err != nil {
			return nil, err
		}
		res.Points = append(res.Points, points...)
	}
	res.Elapsed = time.Since(res.Started).Seconds()
	if err := writeJSON(filepath.Join(opts.Out, "results.json"), res); err != nil {
		return nil, err
	}
	if err := writeReport(opts, res); err != nil {
		return nil, err
	}
	return res, nil
}

// runJobs runs jobs on opts.Parallel workers; points come back in job order.
func runJobs(opts Options, jobs []job, bar *bar) ([]Point, error) {
	points := make([]Point, len(jobs))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range opts.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				w := rescaled(j.w, j.point.RPS)
				r, err := sim.Run(j.cfg, w)
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("suite: %s %s load %.2f routers %d: %w", j.w.Name, j.cfg.Policy, j.fraction, max(j.cfg.Routers, 1), err)
				}
				j.point.Result = r
				points[i] = j.point
				label := fmt.Sprintf("%s %s %.0f%%", j.w.Name, j.cfg.Policy, j.fraction*100)
				if j.cfg.Fleet != "" {
					label = j.cfg.Fleet + " " + label
				}
				if j.cfg.Routers > 1 {
					label += fmt.Sprintf(" x%d", j.cfg.Routers)
				}
				bar.step(label)
				mu.Unlock()
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return points, first
}

// rescaled returns a copy of w whose arrivals run at rps.
func rescaled(w *workload.Workload, rps float64) *workload.Workload {
	c := *w
	c.Requests = append([]workload.Request(nil), w.Requests...)
	c.ScaleRate(rps)
	return &c
}

// capacity measures the cluster's sustainable request rate for w: the
// throughput least-request reaches when the whole workload is offered at
// once. The ladder's load levels are fractions of it.
func capacity(w *workload.Workload, cfg sim.Config) (float64, error) {
	cfg.Policy = "least-request"
	r, err := sim.Run(cfg, rescaled(w, 1e6))
	if err != nil {
		return 0, fmt.Errorf("suite: capacity of %s: %w", w.Name, err)
	}
	if r.RequestsPerSec <= 0 {
		return 0, fmt.Errorf("suite: capacity of %s: no request completed", w.Name)
	}
	return r.RequestsPerSec, nil
}

// workloads builds the suite's workloads; skipped names those left out, with why.
func workloads(opts Options) (ws []*workload.Workload, skipped []string, err error) {
	seed := opts.Seed
	sp := workload.DefaultSharedPrefix()
	b2b := workload.B2BSaaS()
	mt := workload.DefaultMultiTurn()
	ns := workload.DefaultNoSharing()
	mx := workload.DefaultMixed()
	oc := workload.DefaultOneCompany()
	gw := workload.DefaultGateway()
	sp.Seed, b2b.Seed, mt.Seed, ns.Seed, mx.Seed, oc.Seed, gw.Seed = seed, seed, seed, seed, seed, seed, seed
	traceScale := 1.0
	if opts.Smoke {
		sp.Groups, sp.PromptsPerGroup = 8, 4
		b2b.Groups, b2b.PromptsPerGroup, b2b.OutputTokens = 8, 3, 100
		mt.Conversations, mt.MinTurns, mt.MaxTurns = 6, 3, 4
		ns.Requests = 40
		mx.Requests = 40
		oc.Requests = 48
		gw.Requests = 48
	}
	var out []*workload.Workload
	for _, mk := range []func() (*workload.Workload, error){
		func() (*workload.Workload, error) { return workload.SharedPrefix(sp) },
		func() (*workload.Workload, error) {
			w, err := workload.SharedPrefix(b2b)
			rename(w, "b2b-saas")
			return w, err
		},
		func() (*workload.Workload, error) { return workload.MultiTurn(mt) },
		func() (*workload.Workload, error) { return workload.NoSharing(ns) },
		func() (*workload.Workload, error) { return workload.Mixed(mx) },
		func() (*workload.Workload, error) { return workload.OneCompany(oc) },
		func() (*workload.Workload, error) { return workload.Gateway(gw) },
	} {
		w, err := mk()
		if err != nil {
			return nil, nil, fmt.Errorf("suite: %w", err)
		}
		out = append(out, w)
	}
	trace := opts.Trace
	if trace == "" {
		var why string
		if trace, why = findTrace(); trace == "" {
			skipped = append(skipped, "mooncake skipped: "+why)
		}
	}
	if trace != "" {
		w, err := workload.LoadMooncake(trace, "", traceScale)
		if err != nil {
			return nil, nil, fmt.Errorf("suite: %w", err)
		}
		if opts.Smoke {
			w.Requests = w.Requests[:60]
		}
		out = append(out, w)
	}
	return out, skipped, nil
}

func rename(w *workload.Workload, name string) {
	if w != nil {
		w.Name = name
	}
}

// scaledShared is the shared-prefix shape sized for n replicas (8 groups per
// replica, 8 prompts each, shorter prompts so 1024 replicas stay quick).
func scaledShared(opts Options, n int) (*workload.Workload, error) {
	c := workload.SharedPrefixConfig{Groups: 8 * n, PromptsPerGroup: 8, SystemTokens: 1024, QuestionTokens: 64,
		OutputTokens: 64, RPS: 1, Seed: opts.Seed}
	if opts.Smoke {
		c.Groups, c.PromptsPerGroup = 2*n, 3
	}
	w, err := workload.SharedPrefix(c)
	if err != nil {
		return nil, fmt.Errorf("suite: %w", err)
	}
	w.Name = fmt.Sprintf("shared-prefix-x%d", n)
	return w, nil
}

// traceCandidates are where findTrace looks for the Mooncake trace.
var traceCandidates = []string{"../shared/workloads/mooncake-synthetic.jsonl", "../../shared/workloads/mooncake-synthetic.jsonl",
	"../../../shared/workloads/mooncake-synthetic.jsonl"}

// findTrace returns the first trace candidate that exists, or "" and why
// there is none.
func findTrace() (path, why string) {
	for _, p := range traceCandidates {
		if _, err := os.Stat(p); err == nil {
			return p, ""
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Sprintf("trace %s unreadable: %v (pass --trace FILE)", p, err)
		}
	}
	return "", "no trace: none of " + strings.Join(traceCandidates, ", ") + " exists (pass --trace FILE, a Mooncake-format JSONL)"
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// bar is a one-line progress bar.
type bar struct {
	w     io.Writer
	n, i  int
	start time.Time
	mu    sync.Mutex
}

func newBar(w io.Writer, n int) *bar { return &bar{w: w, n: n, start: time.Now()} }

func (b *bar) step(label string) {
	if b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.i++
	const width = 30
	done := b.i * width / max(b.n, 1)
	fmt.Fprintf(b.w, "\r[%-*s] %d/%d %5.1fs %-40.40s", width, string(repeat('#', done)), b.i, b.n, time.Since(b.start).Seconds(), label)
	if b.i == b.n {
		fmt.Fprintln(b.w)
	}
}

func repeat(c byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// byPolicy indexes points of one workload's ladder.
func ladder(res *Results, wl string) map[string][]Point {
	m := map[string][]Point{}
	for _, p := range res.Points {
		if p.Workload == wl && p.Sweep == "" {
			m[p.Result.Policy] = append(m[p.Result.Policy], p)
		}
	}
	for _, ps := range m {
		sort.Slice(ps, func(i, j int) bool { return ps[i].Load < ps[j].Load })
	}
	return m
}
