package slowpath

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
)

// getStatus GETs url and returns status and body.
func getStatus(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// adminGet serves one admin request in memory.
func adminGet(s *Server, path string) (int, string) {
	w := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w.Code, w.Body.String()
}

// blackhole accepts connections and never answers: a health check against
// it lasts its whole timeout.
func blackhole(t *testing.T) (addr string, closeAll func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	closeAll = func() {
		ln.Close()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	}
	t.Cleanup(closeAll)
	return ln.Addr().String(), closeAll
}

// TestReadinessStates: /readyz (API and admin port) is 503 before the first
// health round, 200 once a replica is healthy, 503 when none is, 200 again
// after it recovers, and 503 for good once draining, while /livez and
// /health stay 200 and requests are still served (closing their
// connections).
func TestReadinessStates(t *testing.T) {
	t.Run("starting", func(t *testing.T) {
		bh, closeBH := blackhole(t)
		cfg := testConfig(bh)
		cfg.Health.Interval, cfg.Health.Timeout = time.Minute, time.Minute
		s, url := newTestServer(t, cfg)
		t.Cleanup(closeBH) // before the Shutdown, which waits for the pending probe
		for _, code := range []func() (int, string){
			func() (int, string) { return getStatus(t, testClient, url+"/readyz") },
			func() (int, string) { return adminGet(s, "/readyz") },
		} {
			st, body := code()
			if st != http.StatusServiceUnavailable || body != `{"status":"not_ready","reason":"starting"}` {
				t.Fatalf("readyz before the first health round: %d %s", st, body)
			}
		}
		if st, _ := getStatus(t, testClient, url+"/livez"); st != 200 {
			t.Fatalf("livez %d", st)
		}
		select {
		case <-s.Probed():
			t.Fatal("Probed closed while the only replica's first health check is pending")
		default:
		}
	})

	e := startFakeEngine(t)
	s, url := newTestServer(t, testConfig(e.addr))
	ready := func() (int, string) { return getStatus(t, testClient, url+"/readyz") }
	waitFor(t, "ready", func() bool { st, _ := ready(); return st == 200 })
	if st, body := ready(); body != `{"status":"ready"}` {
		t.Fatalf("ready: %d %s", st, body)
	}
	if st, body := adminGet(s, "/readyz"); st != 200 || body != `{"status":"ready"}` {
		t.Fatalf("admin ready: %d %s", st, body)
	}
	select {
	case <-s.Probed():
	default:
		t.Fatal("ready but Probed not closed")
	}
	if !strings.Contains(scrapeMetrics(t, s), "warmpath_slowpath_ready 1") {
		t.Fatal("warmpath_slowpath_ready is not 1 while ready")
	}

	e.Unhealthy.Store(true)
	waitFor(t, "not ready", func() bool { st, _ := ready(); return st == 503 })
	if st, body := ready(); body != `{"status":"not_ready","reason":"no_healthy_replica"}` {
		t.Fatalf("no healthy replica: %d %s", st, body)
	}
	if st, _ := adminGet(s, "/readyz"); st != 503 {
		t.Fatalf("admin readyz %d with no healthy replica", st)
	}
	e.Unhealthy.Store(false)
	waitFor(t, "ready again", func() bool { st, _ := ready(); return st == 200 })

	s.SetDraining()
	if st, body := ready(); st != 503 || body != `{"status":"not_ready","reason":"draining"}` {
		t.Fatalf("draining: %d %s", st, body)
	}
	if st, body := adminGet(s, "/readyz"); st != 503 || !strings.Contains(body, "draining") {
		t.Fatalf("admin draining: %d %s", st, body)
	}
	for _, p := range []string{"/livez", "/health"} {
		if st, _ := getStatus(t, testClient, url+p); st != 200 {
			t.Fatalf("%s while draining: %d", p, st)
		}
		if st, _ := adminGet(s, p); st != 200 {
			t.Fatalf("admin %s while draining: %d", p, st)
		}
	}
	resp, err := testClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("request while draining: status %d, connection close %v (want 200, true)", resp.StatusCode, resp.Close)
	}
	if !strings.Contains(scrapeMetrics(t, s), "warmpath_slowpath_draining 1") {
		t.Fatal("warmpath_slowpath_draining is not 1")
	}
	if st, _ := post(t, url+"/readyz", "", ""); st != http.StatusMethodNotAllowed {
		t.Fatalf("POST /readyz: %d", st)
	}
}

func scrapeMetrics(t *testing.T, s *Server) string {
	t.Helper()
	_, body := adminGet(s, "/metrics")
	return body
}

// TestDrainDelayKeepsAccepting: during shutdown.drain_delay readiness
// fails but new connections are accepted and served; when the delay ends
// (here: cut by the context) the listener is closed.
func TestDrainDelayKeepsAccepting(t *testing.T) {
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.Shutdown.DrainDelay = time.Hour // ended by cancel below
	s, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	<-s.Probed()
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(ctx) }()
	waitFor(t, "draining", func() bool { ok, why := s.Ready(); return !ok && why == NotReadyDraining })
	fresh := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 5 {
		resp, err := fresh.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatalf("new connection %d during the drain delay: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d during the drain delay: %d", i, resp.StatusCode)
		}
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned during its delay: %v", err)
	default:
	}
	cancel()
	<-drained
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("tcp", addr); err == nil || !errorsIsRefused(err) {
		t.Fatalf("dial after the drain: %v, want connection refused", err)
	}
}

func errorsIsRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// TestDrainFinishesInFlightStream: with no delay Drain stops accepting at
// once, and a stream in flight still ends whole ([DONE]) before Drain
// returns without error.
func TestDrainFinishesInFlightStream(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	cfg := testConfig(e.addr)
	cfg.Shutdown.DrainDelay = 0
	s, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go s.Serve(ln) //nolint:errcheck
	<-s.Probed()
	resp, err := testClient.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil { // the stream has begun
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(context.Background()) }()
	waitFor(t, "listener closed", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return errorsIsRefused(err)
	})
	select {
	case err := <-drained:
		t.Fatalf("Drain returned with a stream in flight: %v", err)
	default:
	}
	e.open()
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream cut by the drain: %q", rest)
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
}
