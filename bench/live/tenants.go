package live

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmpath/warmpath/bench/internal/child"
	"github.com/warmpath/warmpath/bench/loadgen"
	"github.com/warmpath/warmpath/bench/workload"
	"github.com/warmpath/warmpath/slowpath/tenant"
)

// ScenarioTenants selects the flood-vs-quiet-tenant scenario alone
// (Options.Scenario).
const ScenarioTenants = "tenants"

// TenantsResult is the flood-vs-quiet-tenant scenario: one tenant floods
// the fleet closed-loop while another sends a light open-loop stream; the
// quiet tenant's TTFT is compared with its TTFT alone on the same fleet.
type TenantsResult struct {
	About string
	Rows  []TenantsRow
}

// TenantsRow is one configuration. Latencies are model seconds.
type TenantsRow struct {
	Config string
	Quiet  loadgen.Result
	Flood  *loadgen.Result `json:",omitempty"`
	// P99Ratio and P50Ratio are the quiet tenant's TTFT over its TTFT
	// alone.
	P99Ratio, P50Ratio float64
	// RoundsP99 is the quiet p99 of every round (the row is the median's).
	RoundsP99 []float64
	// FloodVs is the flood's wall req/s over that of the row named
	// FloodBase (the same load without the row's policy): the policy's
	// throughput cost for the flood. 0 without a base.
	FloodVs   float64 `json:",omitempty"`
	FloodBase string  `json:",omitempty"`
}

// guardRow is one prefill guard row: tenants.queue.headroom and
// headroom_min.
type guardRow struct{ headroom, least int }

func (g guardRow) String() string {
	if g.least > 1 {
		return fmt.Sprintf("headroom %d, headroom_min %d", g.headroom, g.least)
	}
	return fmt.Sprintf("headroom %d", g.headroom)
}

// tenantsShape is the scenario's sizes.
type tenantsShape struct {
	engines, seqs      int
	floodConc          int
	quietRequests      int
	quietRPS           float64 // model requests per second
	floodTok, floodOut [2]int  // prompt range, output tokens
	quietTok, quietOut [2]int
	warmup             time.Duration // flood alone before the quiet tenant starts
	timeScale          float64       // the engines' --time-scale
	reserve            int           // tenants.queue.reserve of the reserve row
	guards             []guardRow    // the prefill guard rows
	queueTimeout       time.Duration
}

func tenantsSizes(o Options) tenantsShape {
	// 240 quiet requests: their p99 is the third slowest, so neither the
	// one request that always waits (the quiet tenant's first, which finds
	// every slot the flood's) nor one scheduling stall of the shared
	// machine sets it alone.
	s := tenantsShape{engines: 2, seqs: 4, floodConc: 32, quietRequests: 240, quietRPS: 4,
		floodTok: [2]int{512, 1024}, floodOut: [2]int{64, 64}, quietTok: [2]int{128, 256}, quietOut: [2]int{16, 16},
		warmup: 4 * time.Second, queueTimeout: time.Minute, timeScale: 0.5, reserve: 2,
		guards: []guardRow{{headroom: 2, least: 1}, {headroom: 2, least: 2}}}
	if o.Smoke {
		s.floodConc, s.quietRequests, s.warmup, s.timeScale = 8, 16, 500*time.Millisecond, o.TimeScale
	}
	return s
}

// runTenants runs the scenario: quiet alone, then flood + quiet without
// and with the fair queue, each on fresh engines.
func runTenants(ctx context.Context, o Options, tmp string) (*TenantsResult, error) {
	sh := tenantsSizes(o)
	// Slower engines than the routing bench's: on a shared 2-core machine
	// the tail of a 10x-faster-than-life engine is the machine's, not the
	// queue's.
	o.TimeScale = sh.timeScale
	f := fleet{name: "tenants", engines: sh.engines, timeScale: o.TimeScale,
		args:     func(int) []string { return []string{"--max-num-seqs", strconv.Itoa(sh.seqs)} },
		kvTokens: 16 * o.EngineKVBlocks, prefillRate: 25000 / o.TimeScale}
	flood, err := workload.NoSharing(workload.NoSharingConfig{Requests: 512, MinTokens: sh.floodTok[0], MaxTokens: sh.floodTok[1],
		OutputTokens: sh.floodOut[0], RPS: 1, Seed: o.Seed})
	if err != nil {
		return nil, err
	}
	quiet, err := workload.NoSharing(workload.NoSharingConfig{Requests: sh.quietRequests, MinTokens: sh.quietTok[0], MaxTokens: sh.quietTok[1],
		OutputTokens: sh.quietOut[0], RPS: sh.quietRPS, Seed: o.Seed + 1000})
	if err != nil {
		return nil, err
	}
	keys := filepath.Join(tmp, "tenants-keys.yaml")
	kf := "keys:\n  - sha256: " + tenant.HashKey("sk-flood") + "\n    tenant: flood\n  - sha256: " + tenant.HashKey("sk-quiet") + "\n    tenant: quiet\n"
	if err := os.WriteFile(keys, []byte(kf), 0o600); err != nil {
		return nil, err
	}
	res := &TenantsResult{About: fmt.Sprintf("%d enginesim engines with `--max-num-seqs %d` (`--time-scale %g`). "+
		"The flooding tenant runs %d closed-loop streams of %d-%d-token prompts and %d output tokens (from %s before the quiet tenant starts until it ends); "+
		"the quiet tenant sends %d streamed requests of %d-%d-token prompts and %d output tokens, Poisson at %g req/s (model time). "+
		"Without the fair queue the router has no per-replica cap: the requests pile onto the engines, which queue beyond %d running FIFO. "+
		"With it, `max_in_flight: %d` per replica (the engines' batch) and `tenants.queue.enabled`: the rest waits at the router, "+
		"deficit round-robin between the two tenants. The reserve row also holds %d of the %d slots back from any one tenant (`tenants.queue.reserve`); "+
		"the prefill guard rows (`tenants.queue.headroom`) hold the tenant over its equal share back, while the other is active, from starting a request where another's first token is pending "+
		"or where it already prefills, and from taking the last free slots (headroom, less the slots the other tenant holds, at least `headroom_min`) on replicas without its prefill. "+
		"The flood-alone rows run the flood for as long as the quiet tenant's schedule lasts, without it. Latencies in model seconds.",
		sh.engines, sh.seqs, o.TimeScale, sh.floodConc, sh.floodTok[0], sh.floodTok[1], sh.floodOut[0], sh.warmup,
		sh.quietRequests, sh.quietTok[0], sh.quietTok[1], sh.quietOut[0], sh.quietRPS, sh.seqs, sh.seqs, sh.reserve, sh.engines*sh.seqs)}
	type cfg struct {
		name         string
		quiet, flood bool
		fair         bool
		reserve      int
		guard        guardRow
		base         int // the row whose flood req/s this row's is compared with; -1 none
	}
	slots := sh.engines * sh.seqs
	cfgs := []cfg{
		{"quiet tenant alone", true, false, false, 0, guardRow{}, -1},
		{"flood + quiet, no fair queue", true, true, false, 0, guardRow{}, -1},
		{"flood + quiet, fair queue", true, true, true, 0, guardRow{}, 1},
		{fmt.Sprintf("flood + quiet, fair queue, reserve %d of %d slots", sh.reserve, slots), true, true, true, sh.reserve, guardRow{}, 2},
	}
	for _, g := range sh.guards {
		cfgs = append(cfgs, cfg{fmt.Sprintf("flood + quiet, fair queue, prefill guard (%s)", g), true, true, true, 0, g, 2})
	}
	alone := len(cfgs)
	cfgs = append(cfgs, cfg{"flood alone, fair queue", false, true, true, 0, guardRow{}, -1})
	for _, g := range sh.guards {
		cfgs = append(cfgs, cfg{fmt.Sprintf("flood alone, fair queue, prefill guard (%s)", g), false, true, true, 0, g, alone})
	}
	// Rounds interleave the configurations; each row is the round with
	// the median quiet p99 (one noisy round on a shared machine does not
	// make the row).
	runs := make([][]TenantsRow, len(cfgs))
	for round := range o.Rounds {
		for i, c := range cfgs {
			row, err := runTenantsConfig(ctx, o, tmp, f, sh, keys, flood, quiet, c.quiet, c.flood, c.fair, c.reserve, c.guard)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			row.Config = c.name
			frps := 0.0
			if row.Flood != nil {
				frps = row.Flood.RPS
			}
			progress(o, "tenants: round %d: %s: quiet ok %d/%d TTFT p50 %.3fs p99 %.3fs; flood %.1f req/s", round+1, c.name, row.Quiet.OK, row.Quiet.Sent,
				row.Quiet.TTFT.P50, row.Quiet.TTFT.P99, frps)
			runs[i] = append(runs[i], *row)
		}
	}
	for i, c := range cfgs {
		rs := runs[i]
		if c.quiet {
			slices.SortFunc(rs, func(a, b TenantsRow) int { return cmp.Compare(a.Quiet.TTFT.P99, b.Quiet.TTFT.P99) })
		} else {
			slices.SortFunc(rs, func(a, b TenantsRow) int { return cmp.Compare(a.Flood.RPS, b.Flood.RPS) })
		}
		row := rs[len(rs)/2]
		for _, r := range rs {
			if c.quiet {
				row.RoundsP99 = append(row.RoundsP99, r.Quiet.TTFT.P99)
			}
		}
		res.Rows = append(res.Rows, row)
	}
	if alone := res.Rows[0].Quiet.TTFT; alone.P99 > 0 && alone.P50 > 0 {
		for i := range res.Rows {
			if cfgs[i].quiet {
				res.Rows[i].P99Ratio, res.Rows[i].P50Ratio = res.Rows[i].Quiet.TTFT.P99/alone.P99, res.Rows[i].Quiet.TTFT.P50/alone.P50
			}
		}
	}
	for i, c := range cfgs {
		if r := &res.Rows[i]; c.base >= 0 && r.Flood != nil && res.Rows[c.base].Flood != nil && res.Rows[c.base].Flood.RPS > 0 {
			r.FloodVs, r.FloodBase = r.Flood.RPS/res.Rows[c.base].Flood.RPS, cfgs[c.base].name
		}
	}
	return res, nil
}

func runTenantsConfig(ctx context.Context, o Options, tmp string, f fleet, sh tenantsShape, keys string,
	flood, quiet *workload.Workload, withQuiet, withFlood, fair bool, reserve int, guard guardRow) (*TenantsRow, error) {
	var g child.Group
	defer g.Stop()
	addrs, engineFailure, stopEngines, err := startEngines(ctx, o, f, f.engines, &g)
	if err != nil {
		return nil, err
	}
	defer stopEngines()
	setup := routerSetup{policy: "cost", model: workload.DefaultModel, replicas: addrs, kvTokens: f.kvTokens,
		timeScale: f.timeScale, prefillRate: f.prefillRate, seed: o.Seed}
	setup.extra = "tenants:\n  keys_file: " + strconv.Quote(keys) + "\n"
	if fair {
		setup.maxInFlight = sh.seqs
		setup.extra += fmt.Sprintf("  queue:\n    enabled: true\n    timeout: %s\n    reserve: %d\n    headroom: %d\n    headroom_min: %d\n",
			sh.queueTimeout, reserve, guard.headroom, max(guard.least, 1))
	}
	setup.authKey = "sk-quiet"
	p, listen, _, err := startWarmpath(ctx, o.WarmpathBin, tmp, setup)
	if err != nil {
		return nil, err
	}
	g.Add(p)
	url := "http://" + listen
	hdr := func(key string) http.Header { return http.Header{"Authorization": {"Bearer " + key}} }
	row := &TenantsRow{}
	fctx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	floodDone := make(chan *loadgen.Result, 1)
	if withFlood {
		go func() {
			r, err := loadgen.RunClosed(fctx, loadgen.ClosedConfig{URL: url, Workload: flood, Concurrency: sh.floodConc,
				Requests: 1 << 20, MaxDuration: 5 * time.Minute, RequestTimeout: 5 * time.Minute, Stream: true, Header: hdr("sk-flood")})
			if err != nil {
				r = &loadgen.Result{Errors: []string{err.Error()}}
			}
			floodDone <- r
		}()
		select {
		case <-time.After(sh.warmup):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if withQuiet {
		qr, err := loadgen.Run(ctx, loadgen.Config{URL: url, Workload: quiet, TimeScale: f.timeScale, Stream: true,
			MaxDuration: 3 * time.Minute, RequestTimeout: 2 * time.Minute, Header: hdr("sk-quiet")})
		if err != nil {
			return nil, err
		}
		row.Quiet = *qr
	} else {
		// The flood alone, for as long as the quiet tenant's schedule.
		select {
		case <-time.After(time.Duration(float64(sh.quietRequests) / sh.quietRPS * f.timeScale * float64(time.Second))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if withFlood {
		stopFlood()
		row.Flood = <-floodDone
	}
	if err := g.Failure(); err != nil {
		return nil, err
	}
	if err := engineFailure(); err != nil {
		return nil, err
	}
	return row, nil
}

// writeTenants puts tenants.md and tenants.json into dir.
func (r *Results) writeTenants(dir string) error { return r.writeAs(dir, "tenants") }

// write writes the scenario's section.
func (t *TenantsResult) write(w io.Writer) {
	b := bufio.NewWriter(w)
	defer b.Flush()
	fmt.Fprintf(b, "\n## Tenants: a flooding tenant and a quiet one\n\n%s\n\n", t.About)
	fmt.Fprintf(b, "Each row with the quiet tenant is the round with the median quiet p99 of %d rounds (configurations interleaved, fresh engines for each); every round's p99 is listed, lowest first. A flood-alone row is the round with the median flood req/s. "+
		"**flood vs base** is the flood's req/s over that of the row named in the cell (the same load without the row's policy): what the policy costs the flood.\n\n", len(t.Rows[0].RoundsP99))
	fmt.Fprintf(b, "| configuration | quiet ok/sent | quiet TTFT p50 | quiet TTFT p99 | p50 vs alone | **p99 vs alone** | p99 of each round | quiet statuses | flood completed | flood req/s (wall) | **flood vs base** | flood statuses |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var bases []string
	for _, r := range t.Rows {
		fl, frps, fvs, fst := "-", "-", "-", "-"
		if r.Flood != nil {
			fl, frps, fst = strconv.Itoa(r.Flood.OK), fmt.Sprintf("%.1f", r.Flood.RPS), statuses(r.Flood.StatusCounts)
		}
		if r.FloodVs > 0 {
			fvs = fmt.Sprintf("**%.2fx** (%s)", r.FloodVs, r.FloodBase)
			if !slices.Contains(bases, r.FloodBase) {
				bases = append(bases, r.FloodBase)
			}
		}
		if r.Quiet.Sent == 0 {
			fmt.Fprintf(b, "| %s | - | - | - | - | - | - | - | %s | %s | %s | %s |\n", r.Config, fl, frps, fvs, fst)
			continue
		}
		var each []string
		for _, p := range r.RoundsP99 {
			each = append(each, sec(p))
		}
		fmt.Fprintf(b, "| %s | %d/%d | %s | %s | %.2fx | **%.2fx** | %s | %s | %s | %s | %s | %s |\n", r.Config, r.Quiet.OK, r.Quiet.Sent,
			sec(r.Quiet.TTFT.P50), sec(r.Quiet.TTFT.P99), r.P50Ratio, r.P99Ratio, strings.Join(each, ", "), statuses(r.Quiet.StatusCounts), fl, frps, fvs, fst)
	}
	fmt.Fprintf(b, "\nThe flood's last streams are cancelled when the quiet tenant's run ends (counted as failures in its statuses, status 0).\n")
}
