package live

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/internal/child"
	"github.com/warmpath/warmpath/bench/workload"
	"github.com/warmpath/warmpath/slowpath"
)

// trackChildren records every child the package starts and, at cleanup,
// asserts that none of their process groups has a live member left and that
// the run's temp directory (under a test-private TMPDIR) is gone.
func trackChildren(t *testing.T) (pids func() []int, retries func() int) {
	t.Helper()
	if !child.Supported {
		t.Skip("live bench is Linux only")
	}
	var mu sync.Mutex
	var started []int
	rebound := 0
	child.OnStart = func(pid int) { mu.Lock(); started = append(started, pid); mu.Unlock() }
	child.OnBindRetry = func() { mu.Lock(); rebound++; mu.Unlock() }
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Cleanup(func() {
		child.OnStart, child.OnBindRetry = nil, nil
		mu.Lock()
		defer mu.Unlock()
		for _, pg := range started {
			if left := liveInGroup(pg); len(left) > 0 {
				t.Errorf("process group %d still has live processes %v", pg, left)
			}
		}
		if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
			t.Errorf("temp files left in TMPDIR: %v", ents)
		}
	})
	return func() []int { mu.Lock(); defer mu.Unlock(); return append([]int(nil), started...) },
		func() int { mu.Lock(); defer mu.Unlock(); return rebound }
}

// TestSmoke runs the whole live bench with tiny sizes: real enginesim and
// warmpath processes (built here), nginx when installed, on loopback.
func TestSmoke(t *testing.T) {
	pids, retries := trackChildren(t)
	out := filepath.Join(t.TempDir(), "out")
	_, nginxErr := findNginx("")
	if _, err := exec.LookPath("nginx"); err == nil && nginxErr != nil {
		t.Fatalf("nginx in PATH but not found: %v", nginxErr)
	}
	opts := Options{Smoke: true, Out: out, Progress: testWriter{t}, Command: "go test ./bench/live -run TestSmoke"}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	o := opts.withDefaults()

	wantConfigs := []string{"warmpath cost", "warmpath prefix", "warmpath least-request", "warmpath round-robin"}
	if nginxErr == nil {
		wantConfigs = append(wantConfigs, "nginx round-robin")
		if res.Nginx != "" {
			t.Fatalf("nginx installed but rows left out: %s", res.Nginx)
		}
	} else if res.Nginx == "" {
		t.Fatal("nginx missing but the report does not say so")
	}
	wantConfigs = append(wantConfigs, "direct (1 engine, 1/2 of the load)")
	// Smoke: two fleets, two workloads each, one rate.
	wantPoints := []string{"enginesim/shared-prefix", "enginesim/one-company", "enginesim-hetero/shared-prefix", "enginesim-hetero/one-company"}
	if len(res.Fleets) != 2 || res.Fleets[0].Skipped != "" || res.Fleets[1].Skipped != "" {
		t.Fatalf("fleets %+v", res.Fleets)
	}
	if len(res.Workloads) != len(wantPoints) {
		t.Fatalf("%d workload points, want %v", len(res.Workloads), wantPoints)
	}
	for k, wl := range res.Workloads {
		if got := wl.Fleet + "/" + wl.Name; got != wantPoints[k] {
			t.Fatalf("point %d is %s, want %s", k, got, wantPoints[k])
		}
		if len(wl.Rows) != len(wantConfigs) {
			t.Fatalf("rows %d, want %d (%v)", len(wl.Rows), len(wantConfigs), wantConfigs)
		}
		for i, row := range wl.Rows {
			if row.Config != wantConfigs[i] {
				t.Fatalf("row %d is %q, want %q", i, row.Config, wantConfigs[i])
			}
			want := wl.Requests
			if strings.HasPrefix(row.Config, "direct") {
				want = (wl.Requests + o.Engines - 1) / o.Engines
			}
			if row.Sent != want || row.OK != want || row.Failed != 0 {
				t.Fatalf("%s %s: sent %d ok %d failed %d, want %d all ok; errors %v", wantPoints[k], row.Config, row.Sent, row.OK, row.Failed, want, row.Errors)
			}
			// Shared prompts: whatever the router, later prompts find the
			// shared part cached somewhere they land.
			if row.HitRate <= 0 || row.HitRate >= 1 || row.TTFT.P50 <= 0 || row.E2E.P50 < row.TTFT.P50 {
				t.Fatalf("%s %s: hit rate %.3f, TTFT %+v, E2E %+v", wantPoints[k], row.Config, row.HitRate, row.TTFT, row.E2E)
			}
		}
	}

	targets := []string{"direct", "warmpath cost", "warmpath round-robin"}
	if nginxErr == nil {
		targets = append(targets, "nginx")
	}
	if len(res.Overhead) != 2*len(targets) {
		t.Fatalf("overhead rows %d, want %d", len(res.Overhead), 2*len(targets))
	}
	for i, row := range res.Overhead {
		if row.Target != targets[i%len(targets)] || row.Stream != (i >= len(targets)) {
			t.Fatalf("overhead row %d is %s stream=%v", i, row.Target, row.Stream)
		}
		if row.Fail != 0 || row.Requests == 0 || row.RPS <= 0 || row.P50 <= 0 || row.P99 < row.P50 {
			t.Fatalf("overhead %+v", row)
		}
		if (row.Target == "direct") != (row.CPUPer1k < 0) {
			t.Fatalf("%s: cpu per 1k %g (want -1 only for direct)", row.Target, row.CPUPer1k)
		}
	}

	// The keep-alive check: every target, warmpath included, answers the
	// burst sent after the engines closed the pooled idle connections.
	kaTargets := []string{"direct", "warmpath cost"}
	if nginxErr == nil {
		kaTargets = append(kaTargets, "nginx")
	}
	if len(res.KeepAlive) != len(kaTargets) {
		t.Fatalf("keep-alive rows %d, want %d", len(res.KeepAlive), len(kaTargets))
	}
	for i, row := range res.KeepAlive {
		if row.Target != kaTargets[i] || row.Sent != 200 {
			t.Fatalf("keep-alive row %d: %+v", i, row)
		}
		if row.Failed != 0 {
			t.Fatalf("keep-alive %s: %d failed: %v", row.Target, row.Failed, row.Errors)
		}
	}

	md, err := os.ReadFile(filepath.Join(out, "live.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(wantConfigs, "## Router overhead", "| warmpath cost | stream |", "## Keep-alive check", "## Headline",
		"### Fleet enginesim-hetero", "| enginesim-hetero | one-company |") {
		if !strings.Contains(string(md), c) {
			t.Fatalf("live.md lacks %q:\n%s", c, md)
		}
	}
	var back Results
	b, err := os.ReadFile(filepath.Join(out, "live.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Workloads) != len(wantPoints) || len(back.Workloads[0].Rows) != len(wantConfigs) || len(back.Overhead) != len(res.Overhead) {
		t.Fatalf("live.json does not round-trip: %d workloads", len(back.Workloads))
	}
	// The report rendered again from live.json alone is the one the run
	// wrote: the results file holds everything the report shows.
	if err := Rerender(filepath.Join(out, "live.json")); err != nil {
		t.Fatal(err)
	}
	if again, err := os.ReadFile(filepath.Join(out, "live.md")); err != nil || string(again) != string(md) {
		t.Fatalf("live.md rendered from live.json differs (err %v):\n%s\n--- the run's:\n%s", err, again, md)
	}
	if err := Rerender(filepath.Join(out, "live.md")); err == nil || !strings.Contains(err.Error(), "want a results file ending in .json") {
		t.Fatalf("Rerender of a .md: %v", err)
	}
	// 2 engines + a router per routing row (direct: 1 engine), 2 warmpath
	// and nginx for the overhead part, warmpath and nginx for the keep-alive
	// check.
	wantProcs := len(wantPoints)*(3*(len(wantConfigs)-1)+1) + 2 + 1
	if nginxErr == nil {
		wantProcs += 2
	}
	// A child that lost its port to another process between FreeAddr and
	// its bind was started again (child.RetryBind): it counts once.
	if n, r := len(pids()), retries(); n-r != wantProcs {
		t.Fatalf("started %d child processes, %d of them again after losing a port; want %d", n, r, wantProcs)
	}
}

// TestRoutingRounds: each point runs every configuration once per round,
// each round on its own workload seed; a row pools its rounds' requests and
// keeps each round's figures, the direct row runs once. With RouterLogs,
// every warmpath row of every round leaves its access log (a line per
// request, with the router's predictions) and its /debug/replicas.
func TestRoutingRounds(t *testing.T) {
	trackChildren(t)
	logs := filepath.Join(t.TempDir(), "logs")
	opts := Options{Smoke: true, SkipNginx: true, Fleets: []string{FleetEnginesim}, Policies: []string{"cost", "round-robin"},
		RoutingRounds: 2, Progress: testWriter{t}, RoutingOnly: true, RouterLogs: logs, Warmup: 5}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Workloads) != 2 {
		t.Fatalf("%d points, want shared-prefix and one-company", len(res.Workloads))
	}
	for _, wl := range res.Workloads {
		if wl.Rounds != 2 || len(wl.Rows) != 3 {
			t.Fatalf("%s: %d rounds, %d rows", wl.Name, wl.Rounds, len(wl.Rows))
		}
		for _, row := range wl.Rows {
			rounds := 2
			if strings.HasPrefix(row.Config, "direct") {
				rounds = 1
			}
			if len(row.Rounds) != rounds {
				t.Fatalf("%s %s: %d rounds, want %d", wl.Name, row.Config, len(row.Rounds), rounds)
			}
			sent, lo, hi := 0, row.Rounds[0].Mean, row.Rounds[0].Mean
			for i, rd := range row.Rounds {
				if rd.Seed != o1(opts)+uint64(i) || rd.OK != rd.Sent || rd.Mean <= 0 || rd.P99 < rd.Mean/2 {
					t.Fatalf("%s %s round %d: %+v", wl.Name, row.Config, i, rd)
				}
				sent += rd.Sent
				lo, hi = min(lo, rd.Mean), max(hi, rd.Mean)
			}
			// warmpath rows say how evenly they spread the requests (two
			// engines: between 1 and 2).
			if w := strings.HasPrefix(row.Config, "warmpath"); w != (row.Imbalance >= 1 && row.Imbalance <= 2) {
				t.Fatalf("%s %s: imbalance %g", wl.Name, row.Config, row.Imbalance)
			}
			if row.Sent != sent || row.OK != sent || row.TTFT.Mean < lo*0.999 || row.TTFT.Mean > hi*1.001 {
				t.Fatalf("%s %s: pooled sent %d ok %d mean %g, rounds %+v", wl.Name, row.Config, row.Sent, row.OK, row.TTFT.Mean, row.Rounds)
			}
			if policy, ok := strings.CutPrefix(row.Config, "warmpath "); ok {
				// The TTFT model's error is read from the access logs: one
				// prediction per measured (streamed) request, rounds pooled.
				if m := row.TTFTModel; !m.Exact || m.Checked != uint64(row.OK) || !(m.P10 > 0 && m.P10 <= m.P50 && m.P50 <= m.P90) || m.AbsP50 < 1 || m.AbsP90 < m.AbsP50 {
					t.Fatalf("%s %s: TTFT model error %+v, want the exact figures of %d requests", wl.Name, row.Config, m, row.OK)
				}
				for i, rd := range row.Rounds {
					// The router answered the warm-up too; the row counts
					// only the measured requests.
					checkRouterLog(t, filepath.Join(logs, fmt.Sprintf("%s_%s_%g_%s_r%d", wl.Fleet, wl.Name, wl.RPS, policy, i+1)), rd.OK+opts.Warmup)
				}
			}
		}
	}
	// Rounds draw different workloads: the first round's prompts differ
	// from the second's for the same configuration.
	var a, b strings.Builder
	for i, seed := range []uint64{1, 2} {
		o := opts.withDefaults()
		o.Seed = seed
		w := fleetWorkloads(o, fleet{requests: 1 << 20})[0]
		fmt.Fprint([]*strings.Builder{&a, &b}[i], w.Requests[0].Messages)
	}
	if a.String() == b.String() {
		t.Fatal("seeds 1 and 2 give the same first request")
	}
}

// checkRouterLog: base.jsonl holds one access-log line per answered request,
// each with the router's prediction, and base.replicas.json the router's
// replicas.
func checkRouterLog(t *testing.T, base string, want int) {
	t.Helper()
	raw, err := os.ReadFile(base + ".jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != want {
		t.Fatalf("%s: %d lines, want %d", base, len(lines), want)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: %q: %v", base, l, err)
		}
		if p, _ := m["predicted_ttft_ms"].(float64); p <= 0 || m["ttft_ms"] == nil || m["replica"] == nil {
			t.Fatalf("%s: line without the prediction or the outcome: %q", base, l)
		}
	}
	raw, err = os.ReadFile(base + ".replicas.json")
	if err != nil {
		t.Fatal(err)
	}
	var reps struct {
		Replicas []struct {
			Name string `json:"name"`
		} `json:"replicas"`
	}
	if err := json.Unmarshal(raw, &reps); err != nil || len(reps.Replicas) != 2 {
		t.Fatalf("%s.replicas.json: %v, %d replicas:\n%s", base, err, len(reps.Replicas), raw)
	}
}

// TestSmallCacheFleet: the llamacpp-smallcache fleet starts its servers
// with a small host cache and runs multi-turn alone, with more and longer
// conversations than the llamacpp fleet, within its request cap.
func TestSmallCacheFleet(t *testing.T) {
	o := Options{}.withDefaults()
	f, err := fleetSpec(o, FleetLlamaSmallCache)
	if err != nil {
		t.Fatal(err)
	}
	if !f.llama || strings.Join(f.llamaArgs, " ") != "--cache-ram 4" || f.requests != 4*o.LlamaRequests {
		t.Fatalf("fleet %+v: want llama-server with --cache-ram 4 and 4x the request cap", f)
	}
	plain, err := fleetSpec(o, FleetLlamacpp)
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.llamaArgs) != 0 {
		t.Fatalf("llamacpp fleet's extra flags %v, want none", plain.llamaArgs)
	}
	ws := fleetWorkloads(o, f)
	if len(ws) != 1 || ws[0].Name != "multi-turn" {
		t.Fatalf("%d workloads, want multi-turn alone", len(ws))
	}
	convs := map[int]bool{}
	for _, r := range ws[0].Requests {
		convs[r.Conversation] = true
	}
	var base int
	for _, w := range fleetWorkloads(o, plain) {
		if w.Name == "multi-turn" {
			seen := map[int]bool{}
			for _, r := range w.Requests {
				seen[r.Conversation] = true
			}
			base = len(seen)
		}
	}
	if len(ws[0].Requests) > f.requests || len(convs) != 24 || base >= len(convs) {
		t.Fatalf("%d requests (cap %d) of %d conversations (llamacpp's: %d), want 24 within the cap",
			len(ws[0].Requests), f.requests, len(convs), base)
	}
}

// TestTenantsFleet: the llamacpp-tenants fleet starts its servers with a
// small host cache and runs shared-prefix alone, with twice as many
// system prompts as the servers have slots, several requests each within
// its request cap.
func TestTenantsFleet(t *testing.T) {
	o := Options{}.withDefaults()
	f, err := fleetSpec(o, FleetLlamaTenants)
	if err != nil {
		t.Fatal(err)
	}
	if !f.llama || strings.Join(f.llamaArgs, " ") != "--cache-ram 4" || f.requests != 2*o.LlamaRequests {
		t.Fatalf("fleet %+v: want llama-server with --cache-ram 4 and 2x the request cap", f)
	}
	ws := fleetWorkloads(o, f)
	if len(ws) != 1 || ws[0].Name != "shared-prefix" {
		t.Fatalf("%d workloads, want shared-prefix alone", len(ws))
	}
	perGroup := map[int]int{}
	for _, r := range ws[0].Requests {
		perGroup[r.Group]++
	}
	slots := o.LlamaServers * o.LlamaSlots
	if len(ws[0].Requests) != f.requests || len(perGroup) != 2*slots {
		t.Fatalf("%d requests (cap %d) of %d groups, want the cap and %d groups", len(ws[0].Requests), f.requests, len(perGroup), 2*slots)
	}
	for g, n := range perGroup {
		if n < 2 {
			t.Fatalf("group %d: %d requests, want it to come back (%v)", g, n, perGroup)
		}
	}
}

// TestWorkloadsFilter: Workloads() names every routing workload, in the
// order they run, and Options.Workloads keeps only those it names.
func TestWorkloadsFilter(t *testing.T) {
	o := Options{}.withDefaults()
	var names []string
	for _, w := range fleetWorkloads(o, fleet{requests: 1 << 20}) {
		names = append(names, w.Name)
	}
	if strings.Join(names, ",") != strings.Join(Workloads(), ",") {
		t.Fatalf("fleet workloads %v, Workloads() %v", names, Workloads())
	}
	o.Workloads = []string{"no-sharing", "one-company"}
	names = names[:0]
	for _, w := range fleetWorkloads(o, fleet{requests: 1 << 20}) {
		names = append(names, w.Name)
	}
	if strings.Join(names, ",") != "one-company,no-sharing" {
		t.Fatalf("filtered to %v, want one-company,no-sharing", names)
	}
	// Refused before anything starts: a name not known, a filter that
	// leaves nothing in smoke mode, a time scale that is not a number.
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Workloads: []string{"nope"}}, `unknown workload "nope"`},
		{Options{Smoke: true, Workloads: []string{"multi-turn"}}, "none runs in this mode"},
		{Options{TimeScale: math.NaN()}, "time scale NaN"},
	} {
		if _, err := Run(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.o.Workloads, err, tc.want)
		}
	}
}

// TestWarmupKeepsSharedPrompts: each workload's warm-up carries the
// measured round's shared prompts (the system and instruction messages)
// and questions of its own; with WarmupNewPrompts its shared prompts are
// its own as well.
func TestWarmupKeepsSharedPrompts(t *testing.T) {
	o := Options{Warmup: 40}.withDefaults()
	f := fleet{requests: 1 << 20}
	msgs := func(w *workload.Workload, role workload.Role) map[uint64]bool {
		m := map[uint64]bool{}
		for _, r := range w.Requests {
			for _, msg := range r.Messages {
				for _, s := range msg.Segments {
					if msg.Role == role {
						m[s.ID] = true
					}
				}
			}
		}
		return m
	}
	shares := func(a, b map[uint64]bool) bool {
		for id := range a {
			if b[id] {
				return true
			}
		}
		return false
	}
	for _, w := range fleetWorkloads(o, f) {
		warm := warmupWorkload(o, f, w.Name, 2)
		if warm == nil || len(warm.Requests) != 40 {
			t.Fatalf("%s: warm-up %v, want 40 requests", w.Name, warm)
		}
		sys, user := msgs(w, workload.System), msgs(w, workload.User)
		if len(sys) > 0 && !shares(msgs(warm, workload.System), sys) {
			t.Errorf("%s: the warm-up carries none of the measured shared prompts", w.Name)
		}
		if shares(msgs(warm, workload.User), user) {
			t.Errorf("%s: the warm-up repeats measured questions", w.Name)
		}
		fresh := o
		fresh.WarmupNewPrompts = true
		if shares(msgs(warmupWorkload(fresh, f, w.Name, 2), workload.System), sys) {
			t.Errorf("%s: WarmupNewPrompts, the warm-up carries measured shared prompts", w.Name)
		}
	}
	o.Warmup = 0
	if w := warmupWorkload(o, f, "multi-turn", 2); w != nil {
		t.Fatalf("no warm-up asked for: %d requests", len(w.Requests))
	}
}

// o1 is the first round's seed under opts' defaults.
func o1(opts Options) uint64 { return opts.withDefaults().Seed }

// TestFailureStopsEverything: a router that dies at start-up (after leaving
// a grandchild behind) fails the run with its output in the error, and
// every process the run started, grandchild included, is gone.
func TestFailureStopsEverything(t *testing.T) {
	pids, retries := trackChildren(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad-warmpath")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\nsleep 300 &\necho bad router on purpose >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, es, err := buildBinaries(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Options{Smoke: true, WarmpathBin: bad, EnginesimBin: es, SkipNginx: true})
	if err == nil || !strings.Contains(err.Error(), "bad router on purpose") {
		t.Fatalf("err = %v, want the router's exit with its output", err)
	}
	if n := len(pids()) - retries(); n != 3 { // 2 engines + the bad router
		t.Fatalf("started %d processes before failing, want 3", n)
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procStat
		wantErr bool
	}{
		{name: "plain", in: "42 (nginx) S 7 42 42 0 -1 4194560 1 0 0 0 150 25 3 4 20 0 1 0 1 1 1",
			want: procStat{state: 'S', ppid: 7, pgrp: 42, cpuTicks: 175, childTicks: 7}},
		{name: "command with spaces and parens", in: "9 (a (b) c) R 1 9 9 0 -1 0 0 0 0 0 10 5 0 0 20 0",
			want: procStat{state: 'R', ppid: 1, pgrp: 9, cpuTicks: 15}},
		{name: "truncated", in: "9 (x) R 1 9", wantErr: true},
		{name: "no command", in: "9 x R 1", wantErr: true},
		{name: "bad number", in: "9 (x) R 1 9 9 0 -1 0 0 0 0 0 zz 5 0 0 20 0", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat([]byte(tc.in))
			if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
				t.Fatalf("parseStat = %+v, %v; want %+v, err %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestTreeCPUCountsChildren(t *testing.T) {
	if !child.Supported {
		t.Skip("Linux only")
	}
	// A shell whose child burns CPU: the tree's time grows, the shell's alone
	// does not.
	p, err := child.Start("burner", "/bin/sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done & wait")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(time.Second) })
	var tree time.Duration
	deadline := time.Now().Add(20 * time.Second)
	for tree < 50*time.Millisecond && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if tree, err = treeCPU(p.Pid()); err != nil {
			t.Fatal(err)
		}
	}
	own, err := readStat(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	if tree < 50*time.Millisecond || time.Duration(own.cpuTicks)*time.Second/userHZ >= tree {
		t.Fatalf("tree cpu %v, shell alone %d ticks", tree, own.cpuTicks)
	}
}

func TestNginxConf(t *testing.T) {
	c := nginxConf("/tmp/x", "127.0.0.1:9000", []string{"127.0.0.1:1", "127.0.0.1:2"}, 2)
	for _, want := range []string{
		"worker_processes 2;", "pid /tmp/x/nginx.pid;", "listen 127.0.0.1:9000;",
		"server 127.0.0.1:1 max_fails=0;", "server 127.0.0.1:2 max_fails=0;",
		"proxy_buffering off;", "proxy_http_version 1.1;", "keepalive 1024;", "proxy_temp_path /tmp/x/proxy_temp;",
	} {
		if !strings.Contains(c, want) {
			t.Fatalf("config lacks %q:\n%s", want, c)
		}
	}
	if strings.Contains(c, "least_conn") || strings.Contains(c, "hash ") {
		t.Fatal("baseline must be nginx's default round-robin")
	}
}

func TestWarmpathConfScalesWithTime(t *testing.T) {
	s := routerSetup{policy: "cost", model: "m", replicas: []string{"127.0.0.1:1"}, kvTokens: 4096, timeScale: 0.1, seed: 3}
	c := warmpathConf("127.0.0.1:2", "127.0.0.1:3", s)
	for _, want := range []string{"policy: cost", "default_prefill_tokens_per_sec: 250000", "load_penalty_seconds: 0.0005",
		"kv_penalty_seconds: 0.05", "interval: 100ms", "kv_capacity_tokens: 4096", "seed: 3"} {
		if !strings.Contains(c, want) {
			t.Fatalf("config lacks %q:\n%s", want, c)
		}
	}
	if strings.Contains(c, "learn_slot_waits") {
		t.Fatalf("learn_slot_waits set for enginesim:\n%s", c)
	}
	s.learnSlotWaits = true // Options.LearnSlotWaits, for a llama.cpp fleet
	c = warmpathConf("127.0.0.1:2", "127.0.0.1:3", s)
	if _, err := slowpath.ParseConfig([]byte(c)); err != nil || !strings.Contains(c, "  learn_slot_waits: true\n") {
		t.Fatalf("llama.cpp config (%v):\n%s", err, c)
	}

	// A row's knobs go into its routing section, and the router takes
	// them: slot holds off beside the default cost row.
	s.policy = "cost+slot_hold=-1s+max_scan=64"
	c = warmpathConf("127.0.0.1:2", "127.0.0.1:3", s)
	cfg, err := slowpath.ParseConfig([]byte(c))
	if err != nil || !strings.Contains(c, "  policy: cost\n") {
		t.Fatalf("config with knobs (%v):\n%s", err, c)
	}
	if cfg.Routing.SlotHold >= 0 || cfg.Routing.MaxScan != 64 {
		t.Fatalf("knobs not taken: slot_hold %v, max_scan %d\n%s", cfg.Routing.SlotHold, cfg.Routing.MaxScan, c)
	}
	// A knob the router does not know fails at its config, by name.
	s.policy = "cost+slot_holdd=1s"
	if _, err := slowpath.ParseConfig([]byte(warmpathConf("127.0.0.1:2", "127.0.0.1:3", s))); err == nil || !strings.Contains(err.Error(), "slot_holdd") {
		t.Fatalf("unknown knob: err = %v", err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func TestWriteMarkdownHeadline(t *testing.T) {
	rows := func(cost, lr, rr, ngx, prefix, direct float64) []RoutingRow {
		out := []RoutingRow{{Config: "warmpath cost", HitRate: 0.5}, {Config: "warmpath least-request"}, {Config: "warmpath round-robin"},
			{Config: "nginx round-robin", HitRate: 0.1}, {Config: "warmpath prefix"}, {Config: "direct (1 engine, 1/2 of the load)"}}
		for i, m := range []float64{cost, lr, rr, ngx, prefix, direct} {
			out[i].OK, out[i].TTFT.Mean, out[i].TTFT.P99 = 1, m, 2*m
			out[i].Rounds = []RoundFigures{{OK: 1, Mean: m / 2, P99: m}, {OK: 1, Mean: 1.5 * m, P99: 3 * m}}
		}
		return out
	}
	r := &Results{Options: Options{Engines: 2, TimeScale: 0.1, EngineKVBlocks: 8},
		Fleets: []FleetResult{{Name: "enginesim", About: "two engines", Engines: 2, TimeScale: 0.1}, {Name: "llamacpp", Skipped: "needs root"}},
		Workloads: []WorkloadResult{
			// prefix and direct are faster than cost but are not baselines.
			{Fleet: "enginesim", Name: "w", RPS: 6, Requests: 2, Rows: rows(0.2, 0.4, 0.5, 0.3, 0.1, 0.01)},
			{Fleet: "enginesim", Name: "v", RPS: 6, Requests: 2, Rows: rows(0.3, 0.25, 0.5, 0.4, 0.1, 0.01)},
		},
		KeepAlive: []KeepAliveRow{{Target: "warmpath cost", Sent: 3, Failed: 2, StatusCounts: map[int]int{503: 2, 200: 1}}}}
	// On v, each round's best baseline differs: least-request's rounds are
	// 0.125s and 0.375s, nginx's 0.2s and 0.6s, cost's 0.2s and 0.4s: cost /
	// best per round 1.60x and 1.07x, against each round's own best.
	r.Workloads[1].Rows[0].Rounds = []RoundFigures{{OK: 1, Mean: 0.2, P99: 0.25}, {OK: 1, Mean: 0.4, P99: 1.5}}
	var b strings.Builder
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| enginesim | w | 6 | 0.200s / 0.400s, 50.0% | nginx round-robin: 0.300s / 0.600s, 10.0% | 0.67x | 0.67x | 0.67x, 0.67x | 0.67x, 0.67x | 1.67x / 1.67x |",
		"| enginesim | v | 6 | 0.300s / 0.600s, 50.0% | warmpath least-request: 0.250s / 0.500s, 0.0% | 1.20x | 1.20x | 1.07x, 1.60x | 1.00x, 2.00x | 1.25x / 1.25x |",
		"- enginesim / v at 6 req/s: mean 1.20x, p99 1.20x against warmpath least-request (cost ahead on mean in 0 of 2 rounds; the round-robins 1.25x / 1.25x apart)",
		// v's 1.20x is within its round-robins' 1.25x.
		"cost at or below the best baseline at 1 of 2 points; at 1 more, above it by no more than the two round-robins differ there.",
		"- fleet llamacpp left out: needs root",
		"### Fleet enginesim\n\ntwo engines. Latencies in model seconds.",
		"| warmpath cost | 2 / 3 | 200 × 1, 503 × 2 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "enginesim / w at") {
		t.Fatalf("cost wins on w, but is listed as losing:\n%s", b.String())
	}
}

// TestSmokeLlamacpp runs the llamacpp fleet in smoke sizes: real
// llama-server processes behind every router configuration (root: CI runs
// it; the chroot is set up when missing, never skipped as root).
func TestSmokeLlamacpp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the llama.cpp chroot (CI runs as root)")
	}
	pids, _ := trackChildren(t)
	opts := Options{Smoke: true, Fleets: []string{FleetLlamacpp}, Progress: testWriter{t}, RoutingOnly: true}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Fleets) != 1 || res.Fleets[0].Skipped != "" || res.Fleets[0].TimeScale != 1 {
		t.Fatalf("fleets %+v", res.Fleets)
	}
	if len(res.Workloads) != 2 {
		t.Fatalf("%d workload points, want shared-prefix and one-company", len(res.Workloads))
	}
	o := opts.withDefaults()
	for _, wl := range res.Workloads {
		for _, row := range wl.Rows {
			want := wl.Requests
			if strings.HasPrefix(row.Config, "direct") {
				want = (wl.Requests + o.LlamaServers - 1) / o.LlamaServers
			}
			if row.OK != want || row.Failed != 0 || row.HitRate <= 0 || row.TTFT.P50 <= 0 {
				t.Fatalf("%s %s: ok %d of %d, failed %d, hit %.3f, TTFT %+v; errors %v", wl.Name, row.Config, row.OK, want, row.Failed, row.HitRate, row.TTFT, row.Errors)
			}
		}
	}
	if len(pids()) == 0 {
		t.Fatal("no child processes tracked")
	}
}

// TestPerfSmoke runs the proxy-cost bench at smoke sizes: every shape
// through direct, warmpath and (when installed) nginx, every request
// answered, CPU and write counts read for the routers only, perf.md and
// perf.json written.
func TestPerfSmoke(t *testing.T) {
	trackChildren(t)
	out := filepath.Join(t.TempDir(), "out")
	opts := Options{Smoke: true, PerfOnly: true, Out: out, Progress: testWriter{t}, Command: "go test ./bench/live -run TestPerfSmoke"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	_, nginxErr := findNginx("")
	targets := []string{"direct", "warmpath"}
	if nginxErr == nil {
		targets = append(targets, "nginx")
	}
	shapes := perfShapes(true)
	if len(res.Perf) != len(shapes)*len(targets) {
		t.Fatalf("%d perf rows, want %d shapes x %v", len(res.Perf), len(shapes), targets)
	}
	for _, r := range res.Perf {
		if r.Failed != 0 || r.Requests == 0 || r.P50 <= 0 {
			t.Errorf("%s %s: %d failed of %d, p50 %v: %v", r.Shape, r.Target, r.Failed, r.Requests, r.P50, r.Errors)
		}
		router := r.Target != "direct"
		if router != (r.CPUPerReq > 0) || router != (r.WritesPerReq >= 1) {
			t.Errorf("%s %s: cpu %v/req, %v writes/req (routers only, at least the request upstream)", r.Shape, r.Target, r.CPUPerReq, r.WritesPerReq)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "perf.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| sse-paced | warmpath |") || (nginxErr == nil && !strings.Contains(string(md), "ratio to nginx")) {
		t.Errorf("perf.md lacks the rows:\n%s", md)
	}
	if _, err := os.Stat(filepath.Join(out, "perf.json")); err != nil {
		t.Error(err)
	}
}
