package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// syncBuf is a goroutine-safe buffer for stdout/stderr.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestVersionAndUsage(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		stdout  string // regexp
	}{
		{"version", []string{"version"}, "", `^warmpath \S+ \(commit \S+, built \S+, go1\.\S+ \S+/\S+, prefix hash \S+\)\n$`},
		{"--version", []string{"--version"}, "", `^warmpath \S+ \(commit \S+, built \S+, go1\.\S+ \S+/\S+, prefix hash \S+\)\n$`},
		{"version --json", []string{"version", "--json"}, "", `(?s)^\{\n  "version": "[^"]+",\n  "commit": "[^"]+",\n  "go_version": "go1\.[^"]+",\n  "build_date": "[^"]+",.*\}\n$`},
		{"version extra arg", []string{"version", "x"}, "unexpected arguments", `^$`},
		{"help", []string{"help"}, "", `(?s)usage: warmpath <command>.*serve.*version`},
		{"no args", nil, "usage", `^$`},
		{"unknown", []string{"frobnicate"}, `unknown command "frobnicate"`, `^$`},
		{"serve without replicas", []string{"serve", "--listen", "127.0.0.1:0", "--admin", ""}, "no replicas: pass --config FILE with a replicas list, or --demo", `^$`},
		{"serve bad flag", []string{"serve", "--nope"}, "flag provided but not defined: -nope", `^$`},
		{"serve bad log level", []string{"serve", "--log-level", "loud"}, "--log-level", `^$`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb syncBuf
			err := run(context.Background(), tc.args, env{stdout: &out, stderr: &errb})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if !regexp.MustCompile(tc.stdout).MatchString(out.String()) {
				t.Fatalf("stdout %q does not match %q", out.String(), tc.stdout)
			}
		})
	}
}

func TestServeBadConfigNamesField(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("replicas:\n  - address: 127.0.0.1:1\n    models: [m]\n    weight: -2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuf
	err := run(context.Background(), []string{"serve", "--config", f}, env{stdout: &out, stderr: &errb})
	if err == nil || !strings.Contains(err.Error(), "replicas[0].weight: must be in [0, 1000]") {
		t.Fatalf("err %v", err)
	}
}

type started struct {
	api, admin string
	done       chan error
	cancel     context.CancelFunc
	stderr     *syncBuf
	stdout     *syncBuf
}

// startServe runs `warmpath serve args...` in-process until the test ends.
func startServe(t *testing.T, args ...string) *started {
	t.Helper()
	return startServeProbe(t, nil, args...)
}

// startServeProbe is startServe with an injected fast-path probe.
func startServeProbe(t *testing.T, probe func() error, args ...string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := &started{done: make(chan error, 1), cancel: cancel, stderr: &syncBuf{}, stdout: &syncBuf{}}
	ready := make(chan struct{})
	e := env{stdout: st.stdout, stderr: st.stderr, probe: probe, ready: func(api, admin net.Addr) {
		st.api = hostPort(api)
		if admin != nil {
			st.admin = admin.String()
		}
		close(ready)
	}}
	go func() { st.done <- run(ctx, append([]string{"serve"}, args...), e) }()
	select {
	case <-ready:
	case err := <-st.done:
		t.Fatalf("serve exited early: %v\n%s", err, st.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve not ready")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-st.done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	return st
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := testClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

type debugReplicas struct {
	Replicas []struct {
		Name    string `json:"name"`
		Healthy bool   `json:"healthy"`
	} `json:"replicas"`
}

// The README's command: `warmpath serve --demo`, then the printed curl.
func TestServeDemo(t *testing.T) {
	st := startServe(t, "--demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "warn")
	if !strings.Contains(st.stdout.String(), "curl -sN http://"+st.api+"/v1/chat/completions") {
		t.Fatalf("demo did not print the curl to try:\n%s", st.stdout.String())
	}
	// Run the printed command's request (curl-level: plain HTTP).
	cmd := demoCurl(st.api)
	body := cmd[strings.Index(cmd, "-d '")+4 : len(cmd)-1]
	resp, err := testClient.Post("http://"+st.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) < 3 || lines[len(lines)-1] != "data: [DONE]" || !strings.Contains(lines[len(lines)-2], `"usage"`) {
		t.Fatalf("stream lines: %q", lines)
	}
	// And the printed command itself, verbatim, when curl is installed.
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command("sh", "-c", cmd).Output()
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if !strings.HasSuffix(string(out), "data: [DONE]\n\n") || !strings.Contains(string(out), `"cached_tokens":`) {
			t.Fatalf("curl output:\n%s", out)
		}
	} else {
		t.Log("curl not installed: the printed command was checked over net/http only")
	}
	var dr debugReplicas
	getJSON(t, "http://"+st.admin+"/debug/replicas", &dr)
	if len(dr.Replicas) != demoEngines {
		t.Fatalf("debug replicas: %+v", dr)
	}
	mresp, err := testClient.Get("http://" + st.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{
		`warmpath_slowpath_requests_total{code="200",model="` + demoModel + `",replica="`,
		"warmpath_slowpath_decision_seconds_bucket{le=\"1e-06\"}",
		"warmpath_slowpath_ttft_seconds_count{model=\"" + demoModel + "\"}",
		"warmpath_slowpath_in_flight 0",
		`warmpath_build_info{commit="` + currentBuild().Commit + `",goversion="` + runtime.Version() + `",version="` + currentBuild().Version + `"} 1`,
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// SIGHUP re-reads the config file and adds/removes replicas under load
// without failing a request; SIGTERM then drains and exits cleanly.
func TestServeSIGHUPReloadAndSIGTERM(t *testing.T) {
	engines := startEngines(t, 3, func(i int, c *enginesim.Config) {
		c.TimeScale = 0.01
		c.Seed = uint64(i + 1)
		c.OutputLen = enginesim.OutputLen{Median: 4, Sigma: 0.1, Min: 2, Max: 8}
	})
	f := filepath.Join(t.TempDir(), "warmpath.yaml")
	write := func(eng ...*enginesim.Server) {
		t.Helper()
		var b strings.Builder
		// Round-robin: the test is about reloads, so a replica added by one
		// must get traffic whatever the cost policy makes of a cold replica
		// among warm ones (under -race on busy cores it could go unused for
		// the whole wait).
		b.WriteString("reload_interval: 0s\nrouting: {policy: round-robin}\nhealth: {interval: 20ms, timeout: 20ms}\nscrape: {interval: 20ms, timeout: 20ms, stale_after: 200ms}\nreplicas:\n")
		for _, en := range eng {
			fmt.Fprintf(&b, "  - {address: %q, models: [m]}\n", en.Addr())
		}
		if err := os.WriteFile(f+".tmp", []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".tmp", f); err != nil {
			t.Fatal(err)
		}
	}
	write(engines[0], engines[1])
	st := startServe(t, "--config", f, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "warn")
	count := func() int {
		var dr debugReplicas
		getJSON(t, "http://"+st.admin+"/debug/replicas", &dr)
		return len(dr.Replicas)
	}
	var stop atomic.Bool
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 2 {
		wg.Go(func() {
			for i := 0; i < 2000 && !stop.Load(); i++ {
				body := fmt.Sprintf(`{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"w%d q%d"}]}`, w, i)
				resp, err := client.Post("http://"+st.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					t.Logf("status %d: %s", resp.StatusCode, b)
					continue
				}
				ok.Add(1)
			}
		})
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for range 2000 {
			if cond() {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		t.Fatalf("timed out waiting for %s", what)
	}
	wait("load", func() bool { return ok.Load() > 10 })
	write(engines[0], engines[1], engines[2])
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait("3 replicas", func() bool { return count() == 3 })
	wait("new replica serving", func() bool { return engines[2].Served("m") > 2 })
	write(engines[1], engines[2])
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait("2 replicas", func() bool { return count() == 2 })
	n := ok.Load()
	wait("load after removal", func() bool { return ok.Load() > n+10 })
	stop.Store(true)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed across SIGHUP reloads", failed.Load(), ok.Load()+failed.Load())
	}
	// SIGTERM: drain and exit cleanly.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-st.done:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v", err)
		}
		st.done <- nil // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit on SIGTERM")
	}
}

// testClient bounds every request: a stalled response fails the test
// instead of hanging it (a hang guard, not a latency assertion).
var testClient = &http.Client{Timeout: 20 * time.Second}
