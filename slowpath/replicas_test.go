package slowpath

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func replicaStatus(t testing.TB, s *Server, name string) ReplicaStatus {
	t.Helper()
	for _, st := range s.Replicas() {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("replica %s not found", name)
	return ReplicaStatus{}
}

// openStream starts a streamed chat request and returns its body once the
// first event arrived (the stream is in flight); closed at cleanup.
func openStream(t testing.TB, url string) *bufio.Reader {
	t.Helper()
	resp, err := testClient.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	readEvent(t, br)
	return br
}

// postOKAvoiding sends n chat requests, each must succeed, none may reach e.
func postOKAvoiding(t testing.TB, url string, e *fakeEngine, n int, why string) {
	t.Helper()
	before := e.requests.Load()
	for range n {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
	}
	if e.requests.Load() != before {
		t.Fatal(why)
	}
}

func TestActiveHealthOutAndReadmitted(t *testing.T) {
	a, b := startFakeEngine(t), startFakeEngine(t)
	cfg := testConfig(a.addr, b.addr)
	cfg.Health.HealthyThreshold = 3
	s, url := newTestServer(t, cfg)
	a.Unhealthy.Store(true)
	waitFor(t, "a out of rotation", func() bool { return !replicaStatus(t, s, a.addr).Healthy })
	postOKAvoiding(t, url, a, 10, "an unhealthy replica received requests")
	a.Unhealthy.Store(false)
	waitFor(t, "a re-admitted", func() bool { return replicaStatus(t, s, a.addr).Healthy })
	// Both unhealthy: 503 in OpenAI form.
	a.Unhealthy.Store(true)
	b.Unhealthy.Store(true)
	waitFor(t, "all out", func() bool {
		return !replicaStatus(t, s, a.addr).Healthy && !replicaStatus(t, s, b.addr).Healthy
	})
	st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
	want := "{\"error\":{\"message\":\"No healthy replica serves model `m` right now.\",\"type\":\"service_unavailable\",\"param\":\"model\",\"code\":\"no_replica_available\"}}"
	if st != 503 || body != want {
		t.Fatalf("got %d %s\nwant 503 %s", st, body, want)
	}
}

func TestEjectedStaysOutForEjectTime(t *testing.T) {
	bad, good := startFakeEngine(t), startFakeEngine(t)
	bad.Status.Store(502)
	cfg := testConfig(bad.addr, good.addr)
	cfg.Routing.Policy = "round-robin"
	cfg.Passive.ConsecutiveFailures = 2
	cfg.Passive.EjectTime = 300 * time.Millisecond
	cfg.Passive.MaxEjectTime = time.Second
	s, url := newTestServer(t, cfg)
	for range 6 {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
	}
	st := replicaStatus(t, s, bad.addr)
	if st.Healthy || st.Ejections != 1 || st.EjectedUntil.IsZero() {
		t.Fatalf("after 2 failures: %+v", st)
	}
	// Its /health is fine, but it stays out until the eject time passed,
	// then comes back after healthy_threshold good probes.
	bad.Status.Store(0)
	waitFor(t, "re-admission after eject time", func() bool { return replicaStatus(t, s, bad.addr).Healthy })
	if time.Now().Before(st.EjectedUntil) {
		t.Fatalf("re-admitted before the eject time ended (%s)", st.EjectedUntil)
	}
}

func TestScrapeFeedsSignalsAndGoesStale(t *testing.T) {
	e := startFakeEngine(t)
	e.waiting.Store(5)
	s, _ := newTestServer(t, testConfig(e.addr))
	waitFor(t, "scrape", func() bool { return replicaStatus(t, s, e.addr).Engine.Waiting == 5 })
	st := replicaStatus(t, s, e.addr)
	if st.Engine.Running != 1 || st.Engine.KVUsage != 0.25 || st.Engine.KVCapacityTokens != 1600 || st.Engine.Stale {
		t.Fatalf("engine signals %+v", st.Engine)
	}
	if st.Affinity == nil || st.Affinity.Signals.Waiting != 5 || st.Affinity.Signals.KVCapacityTokens != 1600 {
		t.Fatalf("signals did not reach affinity: %+v", st.Affinity)
	}
	if st.Affinity.CacheModel != "shared" {
		t.Fatalf("cache model %q with prefix caching on, want shared", st.Affinity.CacheModel)
	}
	// An engine restarted with --no-enable-prefix-caching: no hit is
	// predicted there from the next scrape on.
	e.NoPrefixCache.Store(true)
	waitFor(t, "cache model none", func() bool { return replicaStatus(t, s, e.addr).Affinity.CacheModel == "none" })
	e.MetricsDown.Store(true)
	waitFor(t, "stale", func() bool { return replicaStatus(t, s, e.addr).Engine.Stale })
	st = replicaStatus(t, s, e.addr)
	if !st.Affinity.Signals.ScrapedAt.IsZero() || !strings.Contains(st.Engine.Error, "status 500") {
		t.Fatalf("stale signals must be withdrawn from affinity: %+v / %+v", st.Affinity.Signals, st.Engine)
	}
}

func TestReloadFileAddRemoveAndRejectInvalid(t *testing.T) {
	a, b := startFakeEngine(t), startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(f+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".tmp", f); err != nil {
			t.Fatal(err)
		}
	}
	head := "reload_interval: 10ms\nhealth: {interval: 20ms, timeout: 20ms}\nscrape: {interval: 20ms, timeout: 20ms, stale_after: 100ms}\nreplicas:\n"
	write(head + "  - {address: " + a.addr + ", models: [m]}\n")
	s, err := StartFromFile(f, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	startRouter(t, s)
	write(head + "  - {address: " + a.addr + ", models: [m]}\n  - {address: " + b.addr + ", models: [m, other]}\n")
	waitFor(t, "b added", func() bool { return len(s.Replicas()) == 2 })
	write(head + "  - {address: " + b.addr + ", models: [m, other]}\n")
	waitFor(t, "a removed", func() bool { return len(s.Replicas()) == 1 })
	// An invalid file is rejected as a whole: the running set stays.
	write(head + "  - {address: " + a.addr + ", models: []}\n")
	waitFor(t, "rejected reload counted", func() bool { return value(t, s.m.reloads.WithLabelValues("error")) >= 1 })
	if r := s.Replicas(); len(r) != 1 || r[0].Name != b.addr {
		t.Fatalf("invalid reload changed the replica set: %+v", r)
	}
	// Explicit Reload (what SIGHUP calls) reports the error too.
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "replicas[0].models: at least one model name required") {
		t.Fatalf("Reload: %v", err)
	}
}

func TestEmbeddingsAndCompletionsRouted(t *testing.T) {
	e := startFakeEngine(t)
	_, url := newTestServer(t, testConfig(e.addr))
	for _, tc := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"m","input":["a","b"]}`},
		{"/v1/completions", `{"model":"m","prompt":"once upon a time"}`},
	} {
		if st, body := post(t, url+tc.path, "application/json", tc.body); st != 200 {
			t.Fatalf("%s: %d %s", tc.path, st, body)
		}
		if string(e.lastBody()) != tc.body {
			t.Fatalf("%s: engine got %q", tc.path, e.lastBody())
		}
	}
}

func TestMetricNames(t *testing.T) {
	e := startFakeEngine(t)
	s, url := newTestServer(t, testConfig(e.addr))
	post(t, url+"/v1/chat/completions", "application/json", chatBody)
	post(t, url+"/v1/nope", "application/json", chatBody)
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, n := range []string{
		"requests_total", "decision_seconds", "cached_tokens_predicted_total", "cached_tokens_actual_total",
		"cached_tokens_prediction_error_tokens", "ttft_seconds", "request_duration_seconds", "retries_total",
		"ejections_total", "broken_streams_total", "in_flight", "replica_in_flight", "replica_healthy",
		"rejected_total",
	} {
		if !have["warmpath_slowpath_"+n] {
			t.Errorf("metric warmpath_slowpath_%s missing", n)
		}
	}
}

func TestRemovedReplicaFinishesItsStream(t *testing.T) {
	a, b := startFakeEngine(t), startFakeEngine(t)
	a.Gate = make(chan struct{})
	cfg := testConfig(a.addr)
	s, url := newTestServer(t, cfg)
	br := openStream(t, url)
	// Replace a by b while a's stream is mid-flight.
	if err := s.ApplyReplicas([]ReplicaConfig{{Address: b.addr, Models: []string{"m"}}}); err != nil {
		t.Fatal(err)
	}
	if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 || !strings.Contains(body, b.addr) {
		t.Fatalf("new request after removal: %d %s", st, body)
	}
	a.open()
	n := 1
	for readEvent(t, br) != "[DONE]" {
		n++
	}
	if n != 4 {
		t.Fatalf("removed replica's stream had %d events, want 4", n)
	}
	waitFor(t, "slots released", func() bool { return s.inflight.Load() == 0 })
}

func TestApplyReplicasUpdatesInPlace(t *testing.T) {
	a := startFakeEngine(t)
	s, url := newTestServer(t, testConfig(a.addr))
	before := replicaStatus(t, s, a.addr)
	if err := s.ApplyReplicas([]ReplicaConfig{{Address: a.addr, Models: []string{"m"}, MaxInFlight: 7, Weight: 2}}); err != nil {
		t.Fatal(err)
	}
	after := replicaStatus(t, s, a.addr)
	if after.ID != before.ID || after.MaxInFlight != 7 || after.Affinity.Weight != 2 {
		t.Fatalf("in-place update: before %+v after %+v", before, after)
	}
	// A new model list re-adds the replica; the new model routes.
	if err := s.ApplyReplicas([]ReplicaConfig{{Address: a.addr, Models: []string{"m", "m2"}}}); err != nil {
		t.Fatal(err)
	}
	if st, body := post(t, url+"/v1/chat/completions", "application/json", strings.Replace(chatBody, `"m"`, `"m2"`, 1)); st != 200 {
		t.Fatalf("%d %s", st, body)
	}
	// Invalid lists are refused whole.
	if err := s.ApplyReplicas([]ReplicaConfig{{Address: "nope", Models: []string{"m"}}}); err == nil ||
		!strings.Contains(err.Error(), `replicas[0].address: must be host:port, got "nope"`) {
		t.Fatalf("ApplyReplicas invalid: %v", err)
	}
}

// TestReloadRefusesNoReplicas: a reload (file watch or Reload, what SIGHUP
// calls) of an empty, comment-only, whitespace or replica-less file is
// refused like any invalid file, as startup refuses it: the running set
// stays: `: > warmpath.yaml` must not remove every replica.
func TestReloadRefusesNoReplicas(t *testing.T) {
	a := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(f+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".tmp", f); err != nil {
			t.Fatal(err)
		}
	}
	good := "reload_interval: 10ms\nreplicas:\n  - {address: " + a.addr + ", models: [m]}\n"
	write(good)
	s, err := StartFromFile(f, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	startRouter(t, s)
	for i, body := range []string{"", "# all commented out\n# replicas:\n", "\n  \n", "reload_interval: 10ms\nreplicas: []\n", "reload_interval: 10ms\nreplicas:\n"} {
		write(body)
		waitFor(t, "rejected reload counted", func() bool { return value(t, s.m.reloads.WithLabelValues("error")) >= float64(i+1) })
		if r := s.Replicas(); len(r) != 1 || r[0].Name != a.addr {
			t.Fatalf("file %q: replica set changed: %+v", body, r)
		}
		if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "replicas: at least one replica required") {
			t.Fatalf("file %q: Reload: %v", body, err)
		}
	}
	write(good)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
}

// TestReloadWaitsForStableFile: a file read while it is being written is
// read again until two reads settle apart agree; a file that never settles
// is not applied.
func TestReloadWaitsForStableFile(t *testing.T) {
	seq := []string{"replicas:\n  - {addr", "replicas:\n  - {address: a:1, models: [m]}\n", "replicas:\n  - {address: a:1, models: [m]}\n"}
	n := 0
	read := func(string) ([]byte, error) {
		b := seq[min(n, len(seq)-1)]
		n++
		return []byte(b), nil
	}
	b, err := readStable("f", read, 0)
	if err != nil || string(b) != seq[2] || n != 3 {
		t.Fatalf("got %q, %v after %d reads; want the settled content after 3", b, err, n)
	}
	n = 0
	changing := func(string) ([]byte, error) { n++; return []byte(strconv.Itoa(n)), nil }
	if _, err := readStable("f", changing, 0); err == nil || !strings.Contains(err.Error(), "kept changing") {
		t.Fatalf("never settling: %v", err)
	}
}

// TestReloadFileDeletedLogged: a deleted config file keeps the running set
// and is logged once; it applies again when it comes back.
func TestReloadFileDeletedLogged(t *testing.T) {
	a := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	good := "reload_interval: 10ms\nreplicas:\n  - {address: " + a.addr + ", models: [m]}\n"
	if err := os.WriteFile(f, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s, err := StartFromFile(f, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	startRouter(t, s)
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion logged", func() bool { return strings.Contains(logs.String(), "config file unreadable") })
	if r := s.Replicas(); len(r) != 1 {
		t.Fatalf("replica set changed: %+v", r)
	}
	if err := os.WriteFile(f, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the return logged", func() bool { return strings.Contains(logs.String(), "config file readable again") })
	if c := strings.Count(logs.String(), "config file unreadable"); c != 1 {
		t.Fatalf("deletion logged %d times, want once", c)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestReplicaStateIsTheRouters: a replica's health, in-flight count and
// limit have one owner, the affinity Router: what it says is what
// /debug/replicas shows and what routing and the 429/503 answers follow.
func TestReplicaStateIsTheRouters(t *testing.T) {
	a, b := startFakeEngine(t), startFakeEngine(t)
	cfg := testConfig(a.addr, b.addr)
	cfg.Health.Interval = time.Hour // only the first probe: the test sets health
	cfg.Health.Timeout = time.Second
	cfg.Replicas[0].MaxInFlight = 1
	s, url := newTestServer(t, cfg)
	waitFor(t, "the first health round", func() bool { ok, _ := s.Ready(); return ok })
	rt := s.Router()
	ida, _ := rt.Lookup(a.addr)
	idb, _ := rt.Lookup(b.addr)
	if st := replicaStatus(t, s, a.addr); !st.Healthy || st.MaxInFlight != 1 || st.InFlight != 0 {
		t.Fatalf("a at start: %+v", st)
	}

	rt.SetHealthy(ida, false)
	if replicaStatus(t, s, a.addr).Healthy {
		t.Fatal("a marked unhealthy in the Router, healthy in /debug/replicas")
	}
	postOKAvoiding(t, url, a, 5, "a replica the Router marked unhealthy received requests")
	rt.SetHealthy(ida, true)
	rt.SetHealthy(idb, false)
	if st := replicaStatus(t, s, a.addr); !st.Healthy {
		t.Fatal("a back in the Router, not in /debug/replicas")
	}

	// a is the only healthy replica: a stream held open there takes its one
	// slot, the Router counts it, and the next request finds a at its limit.
	a.Gate = make(chan struct{})
	br := openStream(t, url)
	if st := replicaStatus(t, s, a.addr); st.InFlight != 1 || !rt.AtLimit(ida) || rt.InFlight(ida) != 1 {
		t.Fatalf("stream in flight on a: status %+v, Router in flight %d, at limit %v", st, rt.InFlight(ida), rt.AtLimit(ida))
	}
	st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
	want := "{\"error\":{\"message\":\"Every replica serving model `m` is at its concurrency limit; retry later.\",\"type\":\"rate_limit_exceeded\",\"param\":null,\"code\":\"rate_limit_exceeded\"}}"
	if st != 429 || body != want {
		t.Fatalf("request past a's limit: %d %s\nwant 429 %s", st, body, want)
	}
	a.open()
	for readEvent(t, br) != "[DONE]" {
	}
	waitFor(t, "a's slot freed", func() bool { return replicaStatus(t, s, a.addr).InFlight == 0 && !rt.AtLimit(ida) })
	if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
		t.Fatalf("after the stream ended: %d %s", st, body)
	}
}
