package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

// One smoke run (the suite is seconds, but tens of seconds under -race)
// with the scale-out flags set; bad flags fail before anything runs.
func TestBenchSimSmoke(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"sim", "--smoke", "--replicas", "2", "--out", dir,
		"--routers", "1,3", "--sync-delay", "2ms", "--sync-delays", "0,50ms", "--delay-routers", "2", "--sim-fleets", "llamacpp, batch-4"}, env{stdout: &out, stderr: &errb})
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	// stderr is a buffer, not a terminal: no progress bar redrawn with
	// carriage returns.
	if strings.Contains(errb.String(), "\r") {
		t.Errorf("progress bar written to a non-terminal stderr (%d bytes)", errb.Len())
	}
	if _, err := os.Stat(filepath.Join(dir, "report.md")); err != nil || !strings.Contains(out.String(), "report.md") {
		t.Fatalf("no report: %v, stdout %q", err, out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"## Scale-out", "cost, synced (2ms)", "\n| 3 |", "### Propagation delay (2 routers", " 50ms |", "scaleout-delay.svg",
		"## Fleets", "### llamacpp", "### batch-4"} {
		if !strings.Contains(string(b), w) {
			t.Errorf("report lacks %q", w)
		}
	}
	if strings.Contains(string(b), "\n| 4 |") {
		t.Error("report has 4 routers; --routers asked for 1,3")
	}
	if strings.Contains(string(b), "### hetero") {
		t.Error("report has the hetero fleet; --sim-fleets asked for llamacpp, batch-4")
	}
	for _, bad := range [][]string{{"--routers", "two"}, {"--routers", "0"}, {"--routers", "300"}, {"--sync-delay", "-1s"},
		{"--sync-delays", "soon"}, {"--sync-delays", "-5ms"}, {"--delay-routers", "1"}, {"--sim-fleets", "vllm"}, {"--sim-fleets", "batch-4,nope"}} {
		args := append([]string{"sim", "--smoke", "--out", t.TempDir()}, bad...)
		if err := run(context.Background(), args, env{stdout: &out, stderr: &errb}); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestParseFleets(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
		err      string
	}{
		{name: "empty is the default", in: ""},
		{name: "two", in: "enginesim, llamacpp", want: []string{"enginesim", "llamacpp"}},
		{name: "unknown", in: "enginesim,vllm", err: `unknown fleet "vllm" (have enginesim, enginesim-seqs4`},
		{name: "repeat", in: "llamacpp,llamacpp", err: `fleet "llamacpp" twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseFleets(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("parseFleets(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
	// A bad --fleets fails before anything starts.
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"live", "--fleets", "nope", "--out", t.TempDir()}, env{stdout: &out, stderr: &errb})
	if err == nil || !strings.Contains(err.Error(), `--fleets: unknown fleet "nope"`) {
		t.Fatalf("err = %v", err)
	}
	// So do a bad --policies and --routing-rounds, and --rerender of what
	// is not a live bench's results file (a simulator one here).
	other := filepath.Join(t.TempDir(), "results.json")
	if err := os.WriteFile(other, []byte(`{"points": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ args, want string }{
		{"--policies cost,nope", `--policies: unknown policy "nope" (have cost,`},
		{"--policies cost,cost", `--policies: policy "cost" twice`},
		{"--policies nope+slot_hold=-1s", `--policies: unknown policy "nope" (have cost,`},
		{"--policies cost+slot_hold", `--policies: policy "cost+slot_hold": knob "slot_hold" is not key=value`},
		{"--policies cost+slot_hold=1s:x", `knob "slot_hold=1s:x" is not key=value`},
		{"--policies cost+seed=2", `policy "cost+seed=2": knob "seed" is the bench's own`},
		{"--policies cost+max_scan=1+max_scan=2", `knob "max_scan" set twice`},
		{"--routing-rounds -1", `--routing-rounds: must be >= 0, got -1`},
		{"--warmup -1", `--warmup: must be >= 0, got -1`},
		{"--workloads one-company,nope", `--workloads: unknown workload "nope" (have shared-prefix,`},
		{"--time-scale -1", `--time-scale: must be a number >= 0, got -1`},
		{"--time-scale NaN", `--time-scale: must be a number >= 0, got NaN`},
		{"--rerender live.md", `--rerender: rerender live.md: want a results file ending in .json`},
		{"--rerender /nonexistent/live.json", `--rerender: rerender: open /nonexistent/live.json: no such file`},
		{"--rerender " + other, `--rerender: rerender ` + other + `: not the results of a live bench run`},
	} {
		err := run(context.Background(), append(append([]string{"live"}, strings.Fields(tc.args)...), "--out", t.TempDir()), env{stdout: &out, stderr: &errb})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.args, err, tc.want)
		}
	}
	if got, err := parsePolicies(" least-request, cost ,cost+slot_hold=-1s+max_scan=64"); err != nil || strings.Join(got, ",") != "least-request,cost,cost+slot_hold=-1s+max_scan=64" {
		t.Errorf("parsePolicies = %v, %v", got, err)
	}
}

func TestAnalyze(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	var b strings.Builder
	for i := 0; i < 40; i++ {
		// every request shares the first two blocks
		b.WriteString(`{"timestamp": ` + itoa(i*100) + `, "input_length": 1500, "output_length": 20, "hash_ids": [1, 2, ` + itoa(100+i) + `]}` + "\n")
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"analyze", "--trace", trace, "--replicas", "2"}, env{stdout: &out, stderr: &errb}); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"reusable prompt tokens", "recommendation:"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	// request-body input
	reqs := filepath.Join(dir, "r.jsonl")
	w, _ := workload.SharedPrefix(workload.SharedPrefixConfig{Groups: 2, PromptsPerGroup: 3, SystemTokens: 300, QuestionTokens: 10, OutputTokens: 5, RPS: 1})
	var rb []byte
	for i := range w.Requests {
		rb = append(workload.AppendChatBody(rb, &w.Requests[i], false), '\n')
	}
	os.WriteFile(reqs, rb, 0o644)
	out.Reset()
	if err := run(context.Background(), []string{"analyze", "--requests", reqs, "--fast"}, env{stdout: &out, stderr: &errb}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{"analyze"}, {"analyze", "--trace", trace, "--requests", reqs}, {"analyze", "--trace", filepath.Join(dir, "missing")}, {"nope"}} {
		if err := run(context.Background(), bad, env{stdout: &out, stderr: &errb}); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestLiveBinaries: --warmpath and --enginesim take a binary, and a wrong
// path fails before anything starts.
func TestLiveBinaries(t *testing.T) {
	dir := t.TempDir()
	wp, es := filepath.Join(dir, "wp"), filepath.Join(dir, "es")
	for _, p := range []string{wp, es} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	gotWP, gotES, err := siblingBinaries(wp, es)
	if err != nil || gotWP != wp || gotES != es {
		t.Fatalf("siblingBinaries(%s, %s) = %q, %q, %v", wp, es, gotWP, gotES, err)
	}
	for _, bad := range [][]string{{"--warmpath", filepath.Join(dir, "missing")}, {"--enginesim", dir}} {
		var out, errb bytes.Buffer
		err := run(context.Background(), append([]string{"live", "--out", t.TempDir()}, bad...), env{stdout: &out, stderr: &errb})
		if err == nil || !strings.Contains(err.Error(), bad[0]+" "+bad[1]+": not a binary") {
			t.Errorf("%v: err = %v", bad, err)
		}
	}
}
