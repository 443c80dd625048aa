package slowpath

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// liveFields is every field a reload applies. A field added to the config
// must be tagged reload:"live" or reload:"restart" (directly or through its
// parent); TestEveryConfigFieldClassified fails otherwise, and a new live
// field needs a line here and in liveChanges below.
var liveFields = []string{
	"replicas",
	"limits.max_response_bytes", "limits.max_in_flight", "limits.max_in_flight_per_replica", "limits.on_limit", "limits.queue_timeout",
	"upstream.response_timeout", "upstream.max_attempts", "upstream.retry_statuses",
	"health.path", "health.interval", "health.timeout", "health.healthy_threshold", "health.unhealthy_threshold",
	"passive.consecutive_failures", "passive.eject_time", "passive.max_eject_time",
	"scrape.path", "scrape.interval", "scrape.timeout", "scrape.stale_after",
	"routing.signal_max_age", "routing.session_ttl", "routing.max_ranked", "routing.load_factor",
	"routing.load_penalty_seconds", "routing.kv_high_water", "routing.kv_penalty_seconds", "routing.max_scan", "routing.slot_hold",
	"routing.copy_computed", "routing.no_step_phase",
}

func TestEveryConfigFieldClassified(t *testing.T) {
	var c Config
	var live []string
	n := 0
	walkConfig(reflect.ValueOf(&c).Elem(), reflect.Value{}, "", "", func(l configLeaf, _, _ reflect.Value) {
		n++
		switch l.class {
		case reloadLive:
			live = append(live, l.path)
		case reloadRestart:
		default:
			t.Errorf("config field %s has no reload class: tag it (or its parent) reload:\"live\" or reload:\"restart\"", l.path)
		}
	})
	if n < 60 {
		t.Fatalf("walked only %d fields", n)
	}
	if !slices.Equal(live, liveFields) {
		t.Fatalf("live fields:\n%q\nwant\n%q", live, liveFields)
	}
}

// liveChanges sets each live field (but replicas, covered by the replica
// reload tests) to a valid value unlike the test file's.
var liveChanges = map[string]string{
	"limits.max_response_bytes":        "limits: {max_response_bytes: 4096}",
	"limits.max_in_flight":             "limits: {max_in_flight: 7}",
	"limits.max_in_flight_per_replica": "limits: {max_in_flight_per_replica: 3}",
	"limits.on_limit":                  "limits: {on_limit: queue}",
	"limits.queue_timeout":             "limits: {queue_timeout: 9s}",
	"upstream.response_timeout":        "upstream: {response_timeout: 3m}",
	"upstream.max_attempts":            "upstream: {max_attempts: 1}",
	"upstream.retry_statuses":          "upstream: {retry_statuses: [503]}",
	"health.path":                      "health: {path: /ready, interval: 20ms, timeout: 20ms}",
	"health.interval":                  "health: {interval: 30ms, timeout: 20ms}",
	"health.timeout":                   "health: {interval: 20ms, timeout: 10ms}",
	"health.healthy_threshold":         "health: {interval: 20ms, timeout: 20ms, healthy_threshold: 5}",
	"health.unhealthy_threshold":       "health: {interval: 20ms, timeout: 20ms, unhealthy_threshold: 5}",
	"passive.consecutive_failures":     "passive: {consecutive_failures: 9}",
	"passive.eject_time":               "passive: {eject_time: 2s}",
	"passive.max_eject_time":           "passive: {max_eject_time: 2m}",
	"scrape.path":                      "scrape: {path: /m, interval: 20ms, timeout: 20ms, stale_after: 100ms}",
	"scrape.interval":                  "scrape: {interval: 40ms, timeout: 20ms, stale_after: 100ms}",
	"scrape.timeout":                   "scrape: {interval: 20ms, timeout: 10ms, stale_after: 100ms}",
	"scrape.stale_after":               "scrape: {interval: 20ms, timeout: 20ms, stale_after: 300ms}",
	"routing.signal_max_age":           "routing: {signal_max_age: 3s}",
	"routing.session_ttl":              "routing: {session_ttl: 1m}",
	"routing.max_ranked":               "routing: {max_ranked: 1}",
	"routing.load_factor":              "routing: {load_factor: 2}",
	"routing.load_penalty_seconds":     "routing: {load_penalty_seconds: 0.02}",
	"routing.kv_high_water":            "routing: {kv_high_water: 0.5}",
	"routing.kv_penalty_seconds":       "routing: {kv_penalty_seconds: 2}",
	"routing.max_scan":                 "routing: {max_scan: 7}",
	"routing.slot_hold":                "routing: {slot_hold: -1s}",
	"routing.copy_computed":            "routing: {copy_computed: true}",
	"routing.no_step_phase":            "routing: {no_step_phase: true}",
}

// reloadFile writes a config file for the reload tests: fast loops, one
// replica, plus extra.
func reloadFile(t *testing.T, f, addr, extra string) {
	t.Helper()
	base := map[string]string{
		"health": "health: {interval: 20ms, timeout: 20ms}",
		"scrape": "scrape: {interval: 20ms, timeout: 20ms, stale_after: 100ms}",
	}
	body := "reload_interval: 0s\nreplicas:\n  - {address: " + addr + ", models: [m]}\n"
	for k, v := range base {
		if !strings.HasPrefix(extra, k+":") {
			body += v + "\n"
		}
	}
	body += extra + "\n"
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReloadAppliesEveryLiveField: for every live field, a reload makes the
// running config (and for routing, the router itself) take the new value,
// and changes no other field.
func TestReloadAppliesEveryLiveField(t *testing.T) {
	e := startFakeEngine(t)
	for _, field := range liveFields[1:] {
		t.Run(field, func(t *testing.T) {
			change, ok := liveChanges[field]
			if !ok {
				t.Fatalf("no liveChanges entry for live field %s", field)
			}
			s, f := startFromTestFile(t, e.addr, "")
			before := s.Config()
			routerBefore := s.Router().Config()
			reloadTo(t, s, f, e.addr, change)
			after := s.Config()
			live, restart := configChanges(&before, &after)
			if len(restart) > 0 || !slices.Equal(live, []string{field}) {
				t.Fatalf("reload changed %q (restart-only %q), want only %s", live, restart, field)
			}
			if strings.HasPrefix(field, "routing.") {
				ra := s.Router().Config()
				if reflect.DeepEqual(ra, routerBefore) {
					t.Fatalf("router config unchanged after reloading %s", field)
				}
			}
		})
	}
}

// TestReloadRestartFieldsWarned: a changed restart-only field is named in
// the warning and keeps its running value; live ones in the same reload
// apply.
func TestReloadRestartFieldsWarned(t *testing.T) {
	e := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	reloadFile(t, f, e.addr, "")
	var logs syncBuffer
	s, err := StartFromFile(f, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(t.Context()) })
	reloadTo(t, s, f, e.addr, "limits: {read_timeout: 7s, max_in_flight: 5}\nrouting: {policy: round-robin, max_ranked: 2}\nsession_header: X-Conv")
	c := s.Config()
	if c.Limits.ReadTimeout != Default().Limits.ReadTimeout || c.Routing.Policy != "" || c.SessionHeader != "X-Session-ID" {
		t.Fatalf("restart-only fields applied: %+v", c)
	}
	if c.Limits.MaxInFlight != 5 || s.Router().Config().MaxRanked != 2 || s.Router().PolicyName() != "cost" {
		t.Fatalf("live fields not applied: max_in_flight %d, max_ranked %d, policy %s", c.Limits.MaxInFlight, s.Router().Config().MaxRanked, s.Router().PolicyName())
	}
	out := logs.String()
	if !strings.Contains(out, "need a restart") || !strings.Contains(out, "fields=limits.read_timeout,routing.policy,session_header") {
		t.Fatalf("warning does not name the restart-only fields:\n%s", out)
	}
	if !strings.Contains(out, "fields=limits.max_in_flight,routing.max_ranked") {
		t.Fatalf("applied fields not logged:\n%s", out)
	}
}

// TestReloadHealthPathAndInterval: the replica loops pick up a reloaded
// health path and interval (from one probe an hour to 20ms).
func TestReloadHealthPathAndInterval(t *testing.T) {
	e := startFakeEngine(t)
	s, f := startFromTestFile(t, e.addr, "health: {interval: 1h, timeout: 1s, unhealthy_threshold: 1}")
	if st := s.Replicas(); len(st) != 1 || !st[0].Healthy {
		t.Fatalf("replica not healthy at start: %+v", st)
	}
	// At one probe an hour a failing engine would stay in rotation; at the
	// reloaded 20ms it is out within a few probes.
	e.Unhealthy.Store(true)
	reloadTo(t, s, f, e.addr, "health: {interval: 20ms, timeout: 20ms, unhealthy_threshold: 1}")
	waitFor(t, "a probe at the reloaded interval", func() bool {
		st := s.Replicas()
		return len(st) == 1 && !st[0].Healthy
	})
	// The fake engine counts any path but /health and /metrics as a
	// request: probes of the reloaded path show up there.
	n := e.requests.Load()
	reloadTo(t, s, f, e.addr, "health: {path: /ready, interval: 20ms, timeout: 20ms}")
	waitFor(t, "probes of the reloaded path", func() bool { return e.requests.Load() >= n+2 })
}

// TestReloadPerReplicaLimit: limits.max_in_flight_per_replica reaches the
// replicas already running.
func TestReloadPerReplicaLimit(t *testing.T) {
	e := startFakeEngine(t)
	s, f := startFromTestFile(t, e.addr, "")
	reloadTo(t, s, f, e.addr, "limits: {max_in_flight_per_replica: 3}")
	if st := s.Replicas(); st[0].MaxInFlight != 3 {
		t.Fatalf("replica max_in_flight %d after reload, want 3", st[0].MaxInFlight)
	}
}

// TestDebugConfig: /debug/config is the running config as YAML that parses
// back to it, secrets redacted.
func TestDebugConfig(t *testing.T) {
	e := startFakeEngine(t)
	s, f := startFromTestFile(t, e.addr, "")
	reloadTo(t, s, f, e.addr, "upstream: {max_attempts: 2}")
	srv := httptest.NewServer(s.AdminHandler())
	defer srv.Close()
	resp, err := testClient.Get(srv.URL + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/yaml") {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	back, err := ParseConfig(b)
	if err != nil {
		t.Fatalf("/debug/config does not parse back: %v\n%s", err, b)
	}
	// %+v prints nil and empty slices alike, as YAML does.
	if fmt.Sprintf("%+v", back) != fmt.Sprintf("%+v", s.Config()) || back.Upstream.MaxAttempts != 2 {
		t.Fatalf("/debug/config:\n%s\nparses to %+v\nwant %+v", b, back, s.Config())
	}
}

func TestRedacted(t *testing.T) {
	c := Default()
	c.Cluster.NATSURL = []string{"nats://edge:s3cret@nats-1:4222", "nats://tok3n@nats-2:4222", "nats://nats-3:4222"}
	c.Cluster.CredsFile = "/etc/warmpath/edge.creds"
	c.HashKeyFile = "/etc/warmpath/hash.key"
	r := Redacted(c)
	want := []string{"nats://edge:xxxxx@nats-1:4222", "nats://xxxxx@nats-2:4222", "nats://nats-3:4222"}
	if !slices.Equal([]string(r.Cluster.NATSURL), want) {
		t.Fatalf("nats_url redacted to %q, want %q", r.Cluster.NATSURL, want)
	}
	if c.Cluster.NATSURL[0] != "nats://edge:s3cret@nats-1:4222" {
		t.Fatal("Redacted changed its argument")
	}
	// Paths naming where a secret is are shown: they are not the secret.
	if r.Cluster.CredsFile != c.Cluster.CredsFile || r.HashKeyFile != c.HashKeyFile {
		t.Fatalf("paths redacted: %q %q", r.Cluster.CredsFile, r.HashKeyFile)
	}
}

// TestRedactByName: a field named like a secret is redacted without a tag
// (fields other helpers add: engine tokens, tenant keys); *_file paths and
// numbers are not; the secret tag redacts any name.
func TestRedactByName(t *testing.T) {
	type engine struct {
		APIKey     string `yaml:"api_key"`
		APIKeyFile string `yaml:"api_key_file"`
	}
	type tenant struct {
		Name   string `yaml:"name"`
		APIKey string `yaml:"api_key"`
	}
	type cfg struct {
		Tenants  []tenant `yaml:"tenants"`
		Token    string   `yaml:"token"`
		Password string   `yaml:"nats_password"`
		Keys     []string `yaml:"api_keys"`
		Engine   engine   `yaml:"engine"`
		Seed     uint64   `yaml:"seed"`
		Hidden   string   `yaml:"cookie" secret:"true"`
		Plain    string   `yaml:"name"`
		Empty    string   `yaml:"bearer"`
	}
	tenants := []tenant{{"a", "ka"}, {"b", "kb"}}
	c := cfg{Tenants: tenants, Token: "t", Password: "p", Keys: []string{"k1", "k2"}, Engine: engine{"ek", "/etc/k"}, Seed: 7, Hidden: "h", Plain: "n"}
	redactStruct(reflect.ValueOf(&c).Elem())
	want := cfg{Tenants: []tenant{{"a", redacted}, {"b", redacted}}, Token: redacted, Password: redacted, Keys: []string{redacted, redacted},
		Engine: engine{redacted, "/etc/k"}, Seed: 7, Hidden: redacted, Plain: "n"}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("redacted %+v\nwant %+v", c, want)
	}
	if tenants[0].APIKey != "ka" {
		t.Fatal("redaction wrote through to the caller's slice")
	}
}

// TestReloadConcurrentTraffic: reloads of live fields while requests run
// (the race detector checks the running-config swap).
func TestReloadConcurrentTraffic(t *testing.T) {
	e := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	reloadFile(t, f, e.addr, "")
	s, err := StartFromFile(f, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	url := startRouter(t, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 40 {
			if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
				t.Errorf("status %d: %s", st, body)
				return
			}
		}
	}()
	for i := range 20 {
		reloadTo(t, s, f, e.addr, "upstream: {max_attempts: "+string(rune('1'+i%3))+"}\nrouting: {max_ranked: "+string(rune('1'+i%2))+"}")
		time.Sleep(time.Millisecond)
	}
	<-done
}

// startFromTestFile writes a config naming addr, plus extra, to a temp
// file and starts a Server from it; the Server is shut down when the test
// ends. It returns the file for later rewrites.
func startFromTestFile(t *testing.T, addr, extra string) (*Server, string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "c.yaml")
	reloadFile(t, f, addr, extra)
	s, err := StartFromFile(f, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(t.Context()) })
	return s, f
}

// reloadTo rewrites f to name addr, plus extra, and reloads s from it.
func reloadTo(t *testing.T, s *Server, f, addr, extra string) {
	t.Helper()
	reloadFile(t, f, addr, extra)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
}
