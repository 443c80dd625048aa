package slowpath

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigPermsRefused: NewFromFile and Reload refuse a world-writable
// config file, naming it and the fix; the running replica set stays.
func TestConfigPermsRefused(t *testing.T) {
	a := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("replicas:\n  - {address: "+a.addr+", models: [m]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewFromFile(f, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	if err := os.Chmod(f, 0o666); err != nil {
		t.Fatal(err)
	}
	want := "chmod o-w " + f
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("reload of a world-writable file: err %v, want %q", err, want)
	}
	if n := len(s.Replicas()); n != 1 {
		t.Fatalf("replicas after refused reload: %d, want 1", n)
	}
	if _, err := NewFromFile(f, testLogger(t)); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("NewFromFile: err %v, want %q", err, want)
	}
	if _, err := LoadConfig(f); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("LoadConfig: err %v, want %q", err, want)
	}
}

// lockedBuf is a goroutine-safe log sink.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestNoSecretsInLogsOrMetrics runs the router at debug level through
// success, streaming, engine errors, a broken stream, bad JSON and an unknown
// model, each request carrying a bearer token and a distinctive prompt, and
// checks that neither appears in the logs nor in /metrics.
func TestNoSecretsInLogsOrMetrics(t *testing.T) {
	const secret = "sk-secret-XYZ"
	const prompt = "purple-walrus-7731 tells the quartermaster"
	var logs lockedBuf
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.Passive.ConsecutiveFailures = 1000 // keep the replica in while it fails
	s, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	base := startRouter(t, s)
	send := func(body string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	chat := func(model string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":%q}]}`, model, stream, prompt)
	}
	tests := []struct {
		name  string
		setup func()
		body  string
		want  int
	}{
		{name: "ok", body: chat("m", false), want: 200},
		{name: "stream", body: chat("m", true), want: 200},
		{name: "engine 500", setup: func() { e.Status.Store(500) }, body: chat("m", false), want: 500},
		{name: "broken stream", setup: func() { e.Status.Store(0); e.DieMidStream.Store(true) }, body: chat("m", true), want: 200},
		{name: "bad json", setup: func() { e.DieMidStream.Store(false) }, body: `{"model":"m","messages":[{"content":"` + prompt + `"`, want: 400},
		{name: "unknown model", body: chat("nope", false), want: 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			if got := send(tc.body); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
		})
	}
	if e.requests.Load() < 4 {
		t.Fatalf("engine saw %d requests, want >= 4", e.requests.Load())
	}
	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	metrics := rec.Body.String()
	if !strings.Contains(metrics, "warmpath_slowpath_") {
		t.Fatalf("no slowpath metrics:\n%s", metrics)
	}
	out := logs.String()
	if !strings.Contains(out, "level=DEBUG") && !strings.Contains(out, "level=WARN") {
		t.Fatalf("no debug/warn logs captured, the test checks nothing:\n%s", out)
	}
	for _, leak := range []string{secret, "purple-walrus", "quartermaster"} {
		if strings.Contains(out, leak) {
			t.Errorf("logs contain %q:\n%s", leak, out)
		}
		if strings.Contains(metrics, leak) {
			t.Errorf("/metrics contains %q", leak)
		}
	}
}

// TestAdminLocalhostAndReadOnly: the admin listener defaults to loopback, and
// every admin endpoint is read-only: GET works, anything else is 405, so no
// admin call mutates state (hence no admin token exists).
func TestAdminLocalhostAndReadOnly(t *testing.T) {
	host, _, err := net.SplitHostPort(Default().Admin)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		t.Fatalf("default admin address %q is not loopback", Default().Admin)
	}
	e := startFakeEngine(t)
	s, _ := newTestServer(t, testConfig(e.addr))
	h := s.AdminHandler()
	for _, path := range []string{"/metrics", "/debug/replicas", "/health"} {
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			t.Run(method+" "+path, func(t *testing.T) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader("{}")))
				want := http.StatusMethodNotAllowed
				if method == http.MethodGet {
					want = http.StatusOK
				}
				if rec.Code != want {
					t.Fatalf("%s %s: %d, want %d", method, path, rec.Code, want)
				}
			})
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/anything", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("POST /debug/anything: %d, want 404", rec.Code)
	}
}
