package suite

import (
	"bufio"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/warmpath/warmpath/bench/sim"
)

// ScaleOut configures the report's scale-out section: several warmpath
// instances (routers) in front of the same engines, each request sent to
// one at random, with and without sharing what they learn (sim.Config's
// Routers, Sync and SyncDelay), at 80% load.
type ScaleOut struct {
	// Routers are the router counts. 1 is the ladder's single-router point
	// (not run again). No count above 1 leaves the section out.
	Routers []int
	// SyncDelay is the propagation delay of the synced rows.
	SyncDelay time.Duration
	// Delays is the delay sweep, run at SweepRouters routers (empty: none).
	Delays []time.Duration
	// SweepRouters is the router count of the delay sweep. 0 means 4.
	SweepRouters int
	// Workloads names the workloads of the section (those the run has).
	// Empty means shared-prefix, b2b-saas, multi-turn and mooncake.
	Workloads []string
}

// DefaultScaleOut is the section of the default report.
func DefaultScaleOut() ScaleOut {
	return ScaleOut{
		Routers:   []int{1, 2, 4, 8},
		SyncDelay: 5 * time.Millisecond,
		Delays:    []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second},
	}
}

// Sweep labels of the scale-out points.
const (
	sweepScaleOut = "scaleout"       // Param = routers, Sync and SyncDelay set
	sweepDelay    = "scaleout-delay" // Param = routers (SweepRouters), delay varies
)

const scaleLoad = 0.8

func (s *ScaleOut) withDefaults() {
	if s.SweepRouters == 0 {
		s.SweepRouters = 4
	}
	if len(s.Workloads) == 0 {
		s.Workloads = []string{"shared-prefix", "b2b-saas", "multi-turn", "mooncake"}
	}
}

func (s *ScaleOut) enabled() bool {
	return slices.ContainsFunc(s.Routers, func(n int) bool { return n > 1 })
}

// Validate checks the router counts and delays.
func (s *ScaleOut) Validate() error {
	for _, n := range s.Routers {
		if n < 1 || n > 256 {
			return fmt.Errorf("suite: scale-out routers: %d not in [1, 256]", n)
		}
	}
	if s.SweepRouters < 0 || s.SweepRouters > 256 {
		return fmt.Errorf("suite: scale-out sweep routers: %d not in [1, 256]", s.SweepRouters)
	}
	if s.SyncDelay < 0 {
		return fmt.Errorf("suite: scale-out sync delay: %v is negative", s.SyncDelay)
	}
	for _, d := range s.Delays {
		if d < 0 {
			return fmt.Errorf("suite: scale-out delays: %v is negative", d)
		}
	}
	return nil
}

// scaleOutJobs are the cost policy's runs: every router count above 1,
// synced and not, and the delay sweep.
func scaleOutJobs(opts Options, base job) []job {
	so := opts.ScaleOut
	var jobs []job
	mk := func(routers int, sync bool, delay time.Duration, sweep string) job {
		j := base
		j.cfg.Routers, j.cfg.Sync, j.cfg.SyncDelay = routers, sync, delay
		j.point.Sweep, j.point.Param = sweep, routers
		j.point.Routers, j.point.Sync, j.point.SyncDelay = routers, sync, delay.Seconds()
		return j
	}
	for _, n := range so.Routers {
		if n > 1 {
			jobs = append(jobs, mk(n, true, so.SyncDelay, sweepScaleOut), mk(n, false, 0, sweepScaleOut))
		}
	}
	if len(so.Delays) > 0 && so.SweepRouters > 1 && !slices.Contains(so.Routers, so.SweepRouters) {
		jobs = append(jobs, mk(so.SweepRouters, false, 0, sweepDelay))
	}
	for _, d := range so.Delays {
		if so.SweepRouters > 1 && (d != so.SyncDelay || !slices.Contains(so.Routers, so.SweepRouters)) {
			jobs = append(jobs, mk(so.SweepRouters, true, d, sweepDelay))
		}
	}
	return jobs
}

// anchorJobs run the strongest anchor of each scale-out workload (the
// baseline with the lowest mean TTFT at 80% on one router) unsynced: what a
// fleet of anchor routers does today. They need the ladder's results.
func anchorJobs(opts Options, res *Results, ws map[string]job) []job {
	var jobs []job
	for _, name := range opts.ScaleOut.Workloads {
		base, ok := ws[name]
		if !ok {
			continue
		}
		b := best(ladder(res, name), scaleLoad)
		if b == nil {
			continue
		}
		for _, n := range opts.ScaleOut.Routers {
			if n <= 1 {
				continue
			}
			j := base
			j.cfg.Policy = b.Result.Policy
			j.cfg.Routers = n
			j.point.Sweep, j.point.Param, j.point.Routers = sweepScaleOut, n, n
			jobs = append(jobs, j)
		}
	}
	return jobs
}

// scalePoint finds a scale-out result: routers 1 is the ladder's point.
func scalePoint(res *Results, wl, policy string, routers int, sync bool, delay float64, sweep string) *sim.Result {
	if routers == 1 {
		if pt := at(ladder(res, wl)[policy], scaleLoad); pt != nil {
			return pt.Result
		}
		return nil
	}
	for i := range res.Points {
		pt := &res.Points[i]
		if pt.Workload == wl && pt.Result.Policy == policy && pt.Routers == routers && pt.Sync == sync &&
			(!sync || math.Abs(pt.SyncDelay-delay) < 1e-12) && (pt.Sweep == sweep || pt.Sweep == sweepScaleOut) {
			return pt.Result
		}
	}
	return nil
}

func writeScaleOut(w *bufio.Writer, opts Options, res *Results) error {
	so := opts.ScaleOut
	if !so.enabled() {
		return nil
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	routers := slices.Clone(so.Routers)
	if !slices.Contains(routers, 1) {
		routers = append(routers, 1)
	}
	slices.Sort(routers)
	routers = slices.Compact(routers)
	delay := so.SyncDelay.Seconds()
	p("## Scale-out: several routers in front of the same engines (%.0f%% load)\n\n", 100*scaleLoad)
	p("N warmpath instances (behind ECMP or DNS) each get a random share of the requests (a conversation's turns land on random instances too); each runs its own `affinity.Router` over the same %d engines and scrapes their metrics. **Synced**: each instance's updates (index inserts, truncations, its absolute per-replica load; `affinity.PeerSink`) reach every other instance %v later (`ApplyPeer`), the simulator's stand-in for NATS. **Unsynced**: each learns only its own traffic, as a fleet of independent routers does today. The strongest anchor (the baseline with the lowest mean TTFT at %.0f%% on one router) runs unsynced. In brackets: the change against the same policy's single router (hit rate in points, TTFT as a ratio). Not modelled: message loss, clock skew, batching other than as delay (bench/README.md).\n\n",
		res.Replicas, so.SyncDelay, 100*scaleLoad)
	type row struct {
		label, policy string
		sync          bool
	}
	for _, wl := range so.Workloads {
		lad := ladder(res, wl)
		if at(lad[ours], scaleLoad) == nil {
			continue
		}
		rows := []row{{fmt.Sprintf("cost, synced (%v)", so.SyncDelay), ours, true}, {"cost, unsynced", ours, false}}
		if b := best(lad, scaleLoad); b != nil {
			rows = append(rows, row{b.Result.Policy + ", unsynced", b.Result.Policy, false})
		}
		p("### %s\n\n| routers |", wl)
		for _, r := range rows {
			p(" %s: hit | TTFT mean | p99 |", r.label)
		}
		p("\n|---|")
		for range rows {
			p("---|---|---|")
		}
		p("\n")
		hit := Plot{Title: wl + ": hit rate vs routers (80% load)", XLabel: "routers", YLabel: "hit rate", XTicks: routerTicks(routers)}
		ttft := Plot{Title: wl + ": mean TTFT vs routers (80% load)", XLabel: "routers", YLabel: "seconds (log)", LogY: true, XTicks: routerTicks(routers)}
		for _, r := range rows {
			hit.Series = append(hit.Series, Series{Name: r.label})
			ttft.Series = append(ttft.Series, Series{Name: r.label})
		}
		for _, n := range routers {
			p("| %d |", n)
			for ri, r := range rows {
				one := scalePoint(res, wl, r.policy, 1, false, 0, sweepScaleOut)
				x := scalePoint(res, wl, r.policy, n, r.sync, delay, sweepScaleOut)
				if x == nil || one == nil {
					p(" - | - | - |")
					continue
				}
				p(" %s | %s | %s |", hitCell(x, one), ratioCell(x.TTFT.Mean, one.TTFT.Mean), ratioCell(x.TTFT.P99, one.TTFT.P99))
				lx := math.Log2(float64(n))
				hit.Series[ri].X = append(hit.Series[ri].X, lx)
				hit.Series[ri].Y = append(hit.Series[ri].Y, x.HitRate)
				ttft.Series[ri].X = append(ttft.Series[ri].X, lx)
				ttft.Series[ri].Y = append(ttft.Series[ri].Y, x.TTFT.Mean)
			}
			p("\n")
		}
		if nmax := routers[len(routers)-1]; nmax > 1 {
			if x := scalePoint(res, wl, ours, nmax, true, delay, sweepScaleOut); x != nil && x.Decisions > 0 && x.PeerMessages > 0 {
				p("\nPeer traffic at %d synced routers: %.1f messages per request, each to %d peers, %.1f updates per message; applying them took %.1f µs of router CPU per request over the fleet.\n",
					nmax, float64(x.PeerMessages)/float64(x.Decisions), nmax-1, float64(x.PeerUpdates)/float64(x.PeerMessages*(nmax-1)),
					float64(x.ApplyNanos)/float64(x.Decisions)/1e3)
			}
		}
		for _, pl := range []struct {
			plot *Plot
			file string
		}{{&hit, "scaleout-" + wl + "-hit.svg"}, {&ttft, "scaleout-" + wl + "-ttft.svg"}} {
			if err := writePlot(filepath.Join(opts.Out, pl.file), pl.plot); err != nil {
				return err
			}
			p("\n![%s](%s)", pl.plot.Title, pl.file)
		}
		p("\n\n")
	}

	if len(so.Delays) == 0 {
		return nil
	}
	n := so.SweepRouters
	p("### Propagation delay (%d routers, cost policy)\n\n", n)
	p("Hit rate, mean and p99 TTFT (seconds) by the delay between an instance learning something and its peers applying it; a batch interval adds its mean to the delay.\n\n| workload | 1 router | unsynced |")
	for _, d := range so.Delays {
		p(" %v |", d)
	}
	p("\n|---|---|---|")
	for range so.Delays {
		p("---|")
	}
	p("\n")
	pl := Plot{Title: fmt.Sprintf("hit rate vs propagation delay, %d routers (1 = one router)", n), XLabel: "sync delay",
		YLabel: "hit rate / single router's"}
	for _, d := range so.Delays {
		pl.XTicks = append(pl.XTicks, Tick{At: float64(len(pl.XTicks)), Label: d.String()})
	}
	// unsynced is the limit of an infinite delay: the right end
	pl.XTicks = append(pl.XTicks, Tick{At: float64(len(pl.XTicks)), Label: "∞ (unsynced)"})
	for _, wl := range so.Workloads {
		one := scalePoint(res, wl, ours, 1, false, 0, sweepDelay)
		if one == nil {
			continue
		}
		cell := func(r *sim.Result) string {
			if r == nil {
				return "-"
			}
			return fmt.Sprintf("%.1f%% · %.3f · %.3f", 100*r.HitRate, r.TTFT.Mean, r.TTFT.P99)
		}
		alone := scalePoint(res, wl, ours, n, false, 0, sweepDelay)
		p("| %s | %s | %s |", wl, cell(one), cell(alone))
		s := Series{Name: wl}
		for i, d := range so.Delays {
			r := scalePoint(res, wl, ours, n, true, d.Seconds(), sweepDelay)
			p(" %s |", cell(r))
			if r != nil && one.HitRate > 0 {
				s.X = append(s.X, float64(i))
				s.Y = append(s.Y, r.HitRate/one.HitRate)
			}
		}
		if alone != nil && one.HitRate > 0 {
			s.X = append(s.X, float64(len(so.Delays)))
			s.Y = append(s.Y, alone.HitRate/one.HitRate)
		}
		p("\n")
		pl.Series = append(pl.Series, s)
	}
	if err := writePlot(filepath.Join(opts.Out, "scaleout-delay.svg"), &pl); err != nil {
		return err
	}
	p("\n![%s](scaleout-delay.svg)\n\n", pl.Title)
	return nil
}

func routerTicks(routers []int) []Tick {
	var t []Tick
	for _, n := range routers {
		t = append(t, Tick{At: math.Log2(float64(n)), Label: fmt.Sprint(n)})
	}
	return t
}

// hitCell is x's hit rate and its change in points against one's.
func hitCell(x, one *sim.Result) string {
	return fmt.Sprintf("%.1f%% (%+.1f)", 100*x.HitRate, 100*(x.HitRate-one.HitRate))
}

// ratioCell is v in seconds and its ratio to base.
func ratioCell(v, base float64) string {
	if base <= 0 {
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.3f (%.2fx)", v, v/base)
}
