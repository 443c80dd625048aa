package slowpath

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warmpath/warmpath/affinity"
)

// TestConfigPermsRefused: start-up (CheckConfigPerms) and Reload refuse a world-writable
// config file, naming it and the fix; the running replica set stays.
func TestConfigPermsRefused(t *testing.T) {
	a := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("replicas:\n  - {address: "+a.addr+", models: [m]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := StartFromFile(f, testLogger(t))
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
	if err := CheckConfigPerms(f); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckConfigPerms (serve's start-up check): err %v, want %q", err, want)
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

// tenantPost sends a chat body with the given headers and returns the
// status and the engine-reported cached_tokens.
func tenantPost(t *testing.T, base, body string, hdr map[string]string) (int, int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
	}
	return resp.StatusCode, out.Usage.Details.Cached
}

// TestTenancySaltInjected: with tenancy on, each tenant's requests carry a
// per-tenant cache_salt (same tenant, same salt; never the key itself) that
// seeds different block hashes; a request without a tenant or with its own
// cache_salt is forwarded byte for byte.
func TestTenancySaltInjected(t *testing.T) {
	for _, from := range []string{SaltFromAPIKey, SaltFromHeader} {
		t.Run(from, func(t *testing.T) {
			e := startFakeEngine(t)
			cfg := testConfig(e.addr)
			cfg.Tenancy.SaltFrom = from
			_, base := newTestServer(t, cfg)
			hdr := func(tenant string) map[string]string {
				if from == SaltFromAPIKey {
					return map[string]string{"Authorization": "Bearer " + tenant}
				}
				return map[string]string{"X-Tenant": tenant}
			}
			body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("the same long shared prompt ", 40) + `"}]}`
			forwarded := func(h map[string]string) []byte {
				t.Helper()
				if st, _ := tenantPost(t, base, body, h); st != 200 {
					t.Fatalf("status %d", st)
				}
				return e.lastBody()
			}
			a1, a2, b1 := forwarded(hdr("sk-tenant-a")), forwarded(hdr("sk-tenant-a")), forwarded(hdr("sk-tenant-b"))
			if !bytes.Equal(a1, a2) {
				t.Fatalf("same tenant, different bodies:\n%s\n%s", a1, a2)
			}
			if bytes.Equal(a1, b1) || !bytes.Contains(a1, []byte(`"cache_salt":"`)) {
				t.Fatalf("tenants not salted apart:\n%s\n%s", a1, b1)
			}
			if bytes.Contains(a1, []byte("sk-tenant-a")) {
				t.Fatalf("tenant key in the body: %s", a1)
			}
			p := affinity.NewParser(affinity.HashConfig{})
			var pa, pb, plain affinity.Prompt
			for _, c := range []struct {
				b []byte
				p *affinity.Prompt
			}{{a1, &pa}, {b1, &pb}, {[]byte(body), &plain}} {
				if err := p.ParseChat(c.b, c.p); err != nil {
					t.Fatal(err)
				}
				c.p.Hashes = append([]uint64(nil), c.p.Hashes...)
			}
			if len(pa.Hashes) < 2 || len(pa.Hashes) != len(pb.Hashes) {
				t.Fatalf("hashes %d vs %d blocks", len(pa.Hashes), len(pb.Hashes))
			}
			for i := range pa.Hashes {
				if pa.Hashes[i] == pb.Hashes[i] || pa.Hashes[i] == plain.Hashes[i] {
					t.Fatalf("block %d hash shared across tenants", i)
				}
			}
			if got := forwarded(nil); !bytes.Equal(got, []byte(body)) {
				t.Fatalf("no tenant: body changed:\n%s", got)
			}
			own := `{"model":"m","cache_salt":"mine","messages":[{"role":"user","content":"x"}]}`
			if st, _ := tenantPost(t, base, own, hdr("sk-tenant-a")); st != 200 || string(e.lastBody()) != own {
				t.Fatalf("own cache_salt: status %d, body %s", st, e.lastBody())
			}
		})
	}
}

// TestTenancyEngineCache: against simulated engines (which honour
// cache_salt) the same long prompt is a cache hit within a tenant and never
// across tenants; without tenancy the second tenant hits the first's cache.
func TestTenancyEngineCache(t *testing.T) {
	prompt := strings.Repeat("a long shared system prompt that fills many blocks ", 60)
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	for _, tc := range []struct {
		name, from string
		wantCross  bool // tenant B sees A's cached tokens
	}{
		{name: "none", from: SaltFromNone, wantCross: true},
		{name: "api_key", from: SaltFromAPIKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := simEngines(t, 2)
			cfg := testConfig(addrs...)
			cfg.Tenancy.SaltFrom = tc.from
			s, base := newTestServer(t, cfg)
			a := map[string]string{"Authorization": "Bearer sk-a"}
			b := map[string]string{"Authorization": "Bearer sk-b"}
			if st, _ := tenantPost(t, base, body, a); st != 200 {
				t.Fatalf("status %d", st)
			}
			if st, cached := tenantPost(t, base, body, a); st != 200 || cached == 0 {
				t.Fatalf("tenant a again: status %d cached %d, want a hit", st, cached)
			}
			// The router's own prediction: tenant B's prompt (as the router
			// hashes it) matches nothing of A's on any replica.
			predicted := func(authz string) int {
				t.Helper()
				bb := []byte(body)
				if tc.from != SaltFromNone {
					sum := sha256.Sum256([]byte(authz))
					bb = []byte(strings.TrimSuffix(body, "}") + `,"cache_salt":"` + hex.EncodeToString(sum[:16]) + `"}`)
				}
				var p affinity.Prompt
				if err := affinity.NewParser(s.Router().HashConfig()).ParseChat(bb, &p); err != nil {
					t.Fatal(err)
				}
				var d affinity.Decision
				if err := s.Router().Decide(&affinity.Request{Model: p.Model, Hashes: p.Hashes, PromptTokens: p.Tokens, Now: s.Now()}, &d); err != nil {
					t.Fatal(err)
				}
				best := 0
				for _, c := range d.CachedTokens {
					best = max(best, c)
				}
				return best
			}
			if got := predicted("Bearer sk-a"); got == 0 {
				t.Fatal("router predicts no cached prefix for tenant a's own prompt")
			}
			if got := predicted("Bearer sk-b"); (got > 0) != tc.wantCross {
				t.Fatalf("router predicts %d cached tokens for tenant b, want cross-tenant %v", got, tc.wantCross)
			}
			st, cached := tenantPost(t, base, body, b)
			if st != 200 || (cached > 0) != tc.wantCross {
				t.Fatalf("tenant b: status %d cached %d, want cross-tenant hit %v", st, cached, tc.wantCross)
			}
			if st, cached := tenantPost(t, base, body, b); st != 200 || cached == 0 {
				t.Fatalf("tenant b again: status %d cached %d, want a hit", st, cached)
			}
		})
	}
}

func TestTenancyConfig(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{name: "default none", yaml: "", want: ""},
		{name: "api_key", yaml: "tenancy: {salt_from: api_key}\n", want: ""},
		{name: "header", yaml: "tenancy: {salt_from: header, header: X-Org}\n", want: ""},
		{name: "bad mode", yaml: "tenancy: {salt_from: ip}\n", want: "tenancy.salt_from: must be none, api_key or header"},
		{name: "empty header", yaml: "tenancy: {salt_from: header, header: \"\"}\n", want: "tenancy.header: must be set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tc.yaml + "replicas:\n  - {address: 127.0.0.1:1, models: [m]}\n"))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.yaml == "" && (cfg.Tenancy.SaltFrom != SaltFromNone || cfg.Tenancy.Header != "X-Tenant") {
					t.Fatalf("defaults %+v", cfg.Tenancy)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
