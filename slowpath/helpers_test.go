package slowpath

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"github.com/warmpath/warmpath/bench/enginesim"
)

// fakeEngine is a tiny OpenAI-compatible engine on a real loopback socket.
// Non-streaming answers carry usage.prompt_tokens_details.cached_tokens =
// Cached; streams send Events chunks then a usage chunk and [DONE]. If Gate
// is set, the stream waits on it after the first chunk.
type fakeEngine struct {
	t      testing.TB
	ln     net.Listener
	srv    *fasthttp.Server
	addr   string
	Cached int
	Events int
	Gate   chan struct{}
	// Status, if non-zero, is answered to every completion request.
	Status atomic.Int32
	// DieMidStream closes the connection after the first event.
	DieMidStream atomic.Bool
	// Unhealthy makes /health answer 503; MetricsDown makes /metrics 500.
	Unhealthy, MetricsDown atomic.Bool
	// NoPrefixCache: /metrics says enable_prefix_caching="False", as vLLM
	// --no-enable-prefix-caching does.
	NoPrefixCache atomic.Bool

	gateOnce sync.Once
	mu       sync.Mutex
	bodies   [][]byte
	headers  []http.Header
	requests atomic.Int64
	waiting  atomic.Int64
}

func startFakeEngine(t testing.TB) *fakeEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEngine{t: t, ln: ln, addr: ln.Addr().String(), Cached: 7, Events: 3}
	e.srv = &fasthttp.Server{Handler: e.handle}
	go e.srv.Serve(ln) //nolint:errcheck
	t.Cleanup(e.Close)
	return e
}

// open releases a gated stream (idempotent).
func (e *fakeEngine) open() {
	if e.Gate != nil {
		e.gateOnce.Do(func() { close(e.Gate) })
	}
}

func (e *fakeEngine) Close() {
	e.open() // never leave a handler blocked on the gate
	_ = e.srv.Shutdown()
	_ = e.ln.Close()
}

func (e *fakeEngine) lastBody() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.bodies) == 0 {
		return nil
	}
	return e.bodies[len(e.bodies)-1]
}

func (e *fakeEngine) lastHeader() http.Header {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.headers) == 0 {
		return nil
	}
	return e.headers[len(e.headers)-1]
}

func (e *fakeEngine) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/health":
		if e.Unhealthy.Load() {
			ctx.SetStatusCode(503)
		}
		ctx.SetBodyString("ok")
		return
	case "/metrics":
		if e.MetricsDown.Load() {
			ctx.SetStatusCode(500)
			return
		}
		prefix := "True"
		if e.NoPrefixCache.Load() {
			prefix = "False"
		}
		fmt.Fprintf(ctx, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:num_requests_running{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\nvllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"%s\",num_gpu_blocks=\"100\"} 1\n", e.waiting.Load(), prefix)
		return
	}
	e.requests.Add(1)
	h := http.Header{}
	for k, v := range ctx.Request.Header.All() {
		h.Add(string(k), string(v))
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, append([]byte(nil), ctx.PostBody()...))
	e.headers = append(e.headers, h)
	e.mu.Unlock()
	if st := e.Status.Load(); st != 0 {
		ctx.SetStatusCode(int(st))
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"engine says no","type":"x","param":null,"code":null}}`)
		return
	}
	stream := strings.Contains(string(ctx.PostBody()), `"stream":true`)
	if !stream {
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi from %s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":%d}}}`, e.addr, e.Cached)
		return
	}
	if e.DieMidStream.Load() {
		// One chunk, then the connection drops without the last chunk.
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			ev := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0 \"}}]}\n\n"
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
			time.Sleep(10 * time.Millisecond)
			c.Close()
		})
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	gate, n, cached := e.Gate, e.Events, e.Cached
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"finish_reason\":null}]}\n\n", i)
			_ = w.Flush()
			if i == 0 && gate != nil {
				<-gate
			}
		}
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\ndata: [DONE]\n\n", n, n+10, cached)
		_ = w.Flush()
	})
}

// testConfig is a config with fast loops for tests.
func testConfig(addrs ...string) Config {
	cfg := Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	cfg.Health.Interval = 100 * time.Millisecond
	cfg.Health.Timeout = 100 * time.Millisecond // a slow check under -race and load must not eject a live replica
	cfg.Scrape.Interval = 20 * time.Millisecond
	cfg.Scrape.Timeout = 20 * time.Millisecond
	cfg.Scrape.StaleAfter = 100 * time.Millisecond
	cfg.Passive.EjectTime = 50 * time.Millisecond
	cfg.Passive.MaxEjectTime = 200 * time.Millisecond
	cfg.ReloadInterval = 20 * time.Millisecond
	cfg.DrainTimeout = 5 * time.Second
	for _, a := range addrs {
		cfg.Replicas = append(cfg.Replicas, ReplicaConfig{Address: a, Models: []string{"m"}})
	}
	return cfg
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startRouter runs a Server on loopback listeners; it shuts down at cleanup.
// It returns the API base URL ("http://127.0.0.1:port").
func startRouter(t testing.TB, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		// Past fasthttp's 5 s grace for a connection that has sent no
		// request yet (as net/http's): the Go client may leave one it
		// dialed while the request it was for went out on another.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func newTestServer(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	s, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return s, startRouter(t, s)
}

// post sends body to url with content type ct and returns status and body.
func post(t testing.TB, url, ct, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// waitFor polls cond every few ms up to a bounded number of times.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

const chatBody = `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`

// testClient bounds every test request, so a regression that stalls a
// response (e.g. buffering a gated stream) fails the test instead of hanging
// it. A hang guard, not a latency assertion.
var testClient = &http.Client{Timeout: 20 * time.Second}

// StartFromFile builds a Server from the config file at path as `warmpath
// serve --config` does (CheckConfigPerms, ParseConfig, New, then
// WatchConfigFile), so reloads re-read the file. Exported for slowpath's
// external tests.
func StartFromFile(path string, log *slog.Logger) (*Server, error) {
	if err := CheckConfigPerms(path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	s, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	if err := s.WatchConfigFile(path, b); err != nil {
		_ = s.Shutdown(context.Background())
		return nil, err
	}
	return s, nil
}

// simEngines starts n simulated engines serving model "m", 100x faster
// than life, closed when the test ends, and returns their addresses.
func simEngines(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for i := range n {
		c := enginesim.DefaultConfig()
		c.ServedModelNames = []string{"m"}
		c.TimeScale = 0.01
		c.Seed = uint64(i + 1)
		c.Logger = slog.New(slog.DiscardHandler)
		en, err := enginesim.Start(c, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { en.Close() })
		addrs = append(addrs, en.Addr())
	}
	return addrs
}

// newIdleServer builds a Server from cfg without serving it; it is shut down (5 s bound) when the
// test ends.
func newIdleServer(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	s, err := New(cfg, testLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s
}

// dialInMemory makes every replica of s connect through ln, whatever its
// address (benchmarks and fuzzing without sockets).
func dialInMemory(s *Server, ln *fasthttputil.InmemoryListener) {
	for _, r := range *s.table.Load() {
		if r != nil {
			r.hc.Dial = func(string) (net.Conn, error) { return ln.Dial() }
		}
	}
}

// MetricSum is metricValue for slowpath's external tests.
var MetricSum = metricValue
