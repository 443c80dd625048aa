package suite

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The smoke suite runs every bench mode of the simulator at tiny sizes and
// writes a complete report. The scale-out section runs every router count
// synced and not, the delay sweep and the strongest anchor, and reuses the
// ladder's single router. (One run: tens of seconds under -race.)
func TestSmokeSuite(t *testing.T) {
	dir := t.TempDir()
	so := ScaleOut{Routers: []int{1, 2, 4}, SyncDelay: 3 * time.Millisecond, Delays: []time.Duration{0, time.Second},
		SweepRouters: 3, Workloads: []string{"shared-prefix", "multi-turn"}}
	res, err := Run(Options{Out: dir, Smoke: true, Replicas: 3, Parallel: 2, Command: "go test ./bench/suite", ScaleOut: &so})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Points {
		r := p.Result
		if r == nil || r.Completed+r.Failed != r.Requests || r.Completed == 0 {
			t.Fatalf("point %+v: requests not conserved", p)
		}
	}
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Headline", "shared-prefix", "b2b-saas", "multi-turn", "no-sharing", "mixed",
		"Replica sweep", "KV cache size sweep", "sglang-cache-aware", "llm-d", "dynamo-kv", "Where warmpath stands",
		"## Scale-out", "cost, synced (3ms)", "cost, unsynced", "### Propagation delay (3 routers", "Peer traffic at 4 synced routers",
		"one-company", "gateway", "## Fleets", "### llamacpp", "### batch-4", "### hetero", "### no-cache", "## Every point", "| pre |"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	svgs, _ := filepath.Glob(filepath.Join(dir, "*.svg"))
	if len(svgs) < 3*5+2+2*2+1 {
		t.Errorf("only %d plots", len(svgs))
	}
	for _, s := range svgs {
		b, _ := os.ReadFile(s)
		if !strings.HasPrefix(string(b), "<svg") || !strings.Contains(string(b), "polyline") {
			t.Errorf("%s is not a line plot", s)
		}
	}
	type key struct {
		wl, policy string
		routers    int
		sync       bool
		delay      float64
	}
	got := map[key]*Point{}
	for i := range res.Points {
		pt := &res.Points[i]
		if pt.Routers == 0 {
			continue
		}
		if pt.Load != scaleLoad {
			t.Fatalf("scale-out point at load %v", pt.Load)
		}
		got[key{pt.Workload, pt.Result.Policy, pt.Routers, pt.Sync, pt.SyncDelay}] = pt
	}
	for _, wl := range so.Workloads {
		anchor := best(ladder(res, wl), scaleLoad).Result.Policy
		want := []key{{wl, ours, 2, true, 0.003}, {wl, ours, 4, true, 0.003}, {wl, ours, 2, false, 0}, {wl, ours, 4, false, 0},
			{wl, ours, 3, false, 0}, {wl, ours, 3, true, 0}, {wl, ours, 3, true, 1}, {wl, anchor, 2, false, 0}, {wl, anchor, 4, false, 0}}
		for _, k := range want {
			if got[k] == nil {
				t.Errorf("no point %+v", k)
			}
		}
		if one := scalePoint(res, wl, ours, 1, false, 0, sweepScaleOut); one != at(ladder(res, wl)[ours], scaleLoad).Result {
			t.Errorf("%s: one router is not the ladder's 80%% point", wl)
		}
		synced, alone := got[key{wl, ours, 4, true, 0.003}], got[key{wl, ours, 4, false, 0}]
		if synced != nil && alone != nil && synced.Result.HitRate <= alone.Result.HitRate {
			t.Errorf("%s: 4 synced routers hit %.3f, unsynced %.3f", wl, synced.Result.HitRate, alone.Result.HitRate)
		}
	}
	if n := len(got); n != 2*9 {
		t.Errorf("%d scale-out points, want 18", n)
	}
	for _, other := range []string{"no-sharing", "mixed", "b2b-saas"} {
		for k := range got {
			if k.wl == other {
				t.Fatalf("%s is not in the section but has point %+v", other, k)
			}
		}
	}
	var back Results
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &back); err != nil || len(back.Points) != len(res.Points) {
		t.Fatalf("results.json: %v (%d points)", err, len(back.Points))
	}
}

// A router list without a count above 1 writes no section.
func TestScaleOutOff(t *testing.T) {
	for _, routers := range [][]int{nil, {1}, {1, 1}} {
		var b strings.Builder
		w := bufio.NewWriter(&b)
		if err := writeScaleOut(w, Options{Out: t.TempDir(), ScaleOut: &ScaleOut{Routers: routers}}, &Results{}); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		if b.Len() != 0 {
			t.Errorf("routers %v: wrote %q", routers, b.String())
		}
	}
}
