package slowpath

import (
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files under testdata/")

// TestDebugReplicasGolden pins /debug/replicas' field names: snake_case
// throughout, units in the names (kv_usage_ratio, *_tokens, *_per_sec),
// times as RFC 3339 (the affinity signals' scrape time too: not raw
// nanoseconds on the router's clock, not Go field names like KVUsage).
func TestDebugReplicasGolden(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st := ReplicaStatus{Name: "10.0.0.11:8000", ID: 0, Models: []string{"m"}, Host: "10.0.0.11", Healthy: true,
		InFlight: 2, MaxInFlight: 64, ConsecutiveFailures: 1, Ejections: 1, LastProbeError: "status 503"}
	st.Engine.Waiting, st.Engine.Running, st.Engine.KVUsage, st.Engine.KVCapacityTokens, st.Engine.ScrapedAt = 3, 4, 0.5, 262144, at
	st.Affinity = &AffinityStatus{Healthy: true, Weight: 1, InFlight: 2, PendingPrefillTokens: 100, PrefillTokensPerSec: 10000,
		CachedBlocks: 7, CapacityBlocks: 4096, Mispredictions: 1,
		Signals:      SignalsStatus{Waiting: 3, Running: 4, KVUsage: 0.5, KVCapacityTokens: 262144, ScrapedAt: at},
		PrefillShape: &PrefillShapeStatus{PerToken: 2e-5, PerPair: 8e-8, PerContextToken: 2e-6, ContextTokensMax: 4096}}
	got, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "debug_replicas.golden")
	if *updateGolden {
		if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(got)+"\n" {
		t.Fatalf("/debug/replicas format changed (run with -update if intended):\n%s\nwant:\n%s", got, want)
	}
}

// TestDebugReplicasNaN: an engine reporting NaN (and Inf) gauges still gets
// a complete, valid /debug/replicas (the non-finite samples are ignored),
// never an empty 200 with the JSON encoder's error dropped.
func TestDebugReplicasNaN(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/metrics" {
			ctx.SetBodyString("vllm:num_requests_waiting 2\nvllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc NaN\n")
		}
	}}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown(); _ = ln.Close() })
	addr := ln.Addr().String()
	cfg := testConfig(addr)
	cfg.Scrape.Interval, cfg.Scrape.Timeout, cfg.Scrape.StaleAfter = 20*time.Millisecond, 20*time.Millisecond, 100*time.Millisecond
	s, _ := newTestServer(t, cfg)
	waitFor(t, "a scrape", func() bool { return replicaStatus(t, s, addr).Engine.Waiting == 2 })
	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/replicas", nil))
	body, _ := io.ReadAll(rec.Body)
	var page struct {
		Replicas []ReplicaStatus `json:"replicas"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(body, &page) != nil || len(page.Replicas) != 1 {
		t.Fatalf("got %d %q", rec.Code, body)
	}
	if e := page.Replicas[0].Engine; e.Waiting != 2 || e.Running != 0 || e.KVUsage != 0 {
		t.Fatalf("engine %+v: want waiting 2, the non-finite samples ignored", e)
	}
}
