package slowpath

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// fastBackendBody is a small chat completion with usage, answered at once.
var fastBackendBody = []byte(`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":1,"total_tokens":31,"prompt_tokens_details":{"cached_tokens":16}}}`)

var fastBackendSSE = []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"o\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"k\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":2,\"total_tokens\":32,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n" +
	"data: [DONE]\n\n")

var strStreamTrue = []byte(`"stream":true`)

func fastBackend(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/metrics":
		ctx.SetBodyString("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")
	default:
		// The bench bodies carry "stream" before the messages: looking at
		// the head keeps a 400 KB prompt's scan out of the router's figure.
		if b := ctx.PostBody(); bytes.Contains(b[:min(len(b), 256)], strStreamTrue) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBody(fastBackendSSE)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(fastBackendBody)
	}
}

// startFastBackend serves fastBackend on a loopback socket.
func startFastBackend(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: fastBackend}
	go srv.Serve(ln) //nolint:errcheck
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

var benchBody = []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly and precisely, citing sources where you can."},{"role":"user","content":"What is the capital of France?"}]}`)

// BenchmarkProxyOverhead measures the router against going straight to the
// engine, side by side in one run, against a backend that answers at once:
// the difference is the router's overhead. serial reports p50/p99 latency,
// parallel reports throughput.
func BenchmarkProxyOverhead(b *testing.B) {
	backend := startFastBackend(b)
	cfg := testConfig(backend)
	cfg.Health.Interval, cfg.Health.Timeout = time.Second, time.Second
	cfg.Scrape.Interval, cfg.Scrape.Timeout, cfg.Scrape.StaleAfter = time.Second, time.Second, 5*time.Second
	s, err := New(cfg, testLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	url := startRouter(b, s)
	router := url[len("http://"):]
	for _, target := range []struct{ name, addr string }{{"direct", backend}, {"router", router}} {
		// A plain dialer: fasthttp's default one leaves a process-wide
		// cleaner goroutine that goleak would report.
		hc := &fasthttp.HostClient{Addr: target.addr, MaxConns: 512, Dial: func(a string) (net.Conn, error) { return net.Dial("tcp", a) }}
		do := func(tb testing.TB, req *fasthttp.Request, resp *fasthttp.Response) {
			if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				tb.Fatalf("%s: %v %d %s", target.name, err, resp.StatusCode(), resp.Body())
			}
		}
		newReqBody := func(body []byte) *fasthttp.Request {
			req := fasthttp.AcquireRequest()
			req.SetRequestURI("http://" + target.addr + "/v1/chat/completions")
			req.Header.SetMethod(fasthttp.MethodPost)
			req.Header.SetContentType("application/json")
			req.SetBody(body)
			return req
		}
		newReq := func() *fasthttp.Request { return newReqBody(benchBody) }
		for _, mode := range []struct {
			name string
			body []byte
		}{{"serial", benchBody}, {"serial-stream", benchStreamBody}} {
			b.Run(target.name+"/"+mode.name, func(b *testing.B) {
				serial(b, newReqBody(mode.body), do)
			})
		}
		b.Run(target.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				req := newReq()
				defer fasthttp.ReleaseRequest(req)
				resp := fasthttp.AcquireResponse()
				defer fasthttp.ReleaseResponse(resp)
				for pb.Next() {
					if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Errorf("%s: %v %d", target.name, err, resp.StatusCode())
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
		hc.CloseIdleConnections()
	}
}

// serial sends req back to back and reports p50/p99 latency and req/s.
func serial(b *testing.B, req *fasthttp.Request, do func(testing.TB, *fasthttp.Request, *fasthttp.Response)) {
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		t0 := time.Now()
		do(b, req, resp)
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t0))
		}
	}
	el := time.Since(start)
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "req/s")
}

// handlerRig drives the router's handler directly (no client socket) with
// the upstream on an in-memory listener, so allocations counted are the
// router's own (plus the in-process backend's, which allocates nothing once
// warm).
type handlerRig struct {
	s   *Server
	ctx fasthttp.RequestCtx
}

func newHandlerRig(tb testing.TB) *handlerRig {
	tb.Helper()
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: fastBackend}
	go srv.Serve(ln) //nolint:errcheck
	tb.Cleanup(func() { _ = srv.Shutdown() })
	cfg := testConfig("127.0.0.1:1") // never dialled: Dial is the in-memory listener
	cfg.Health.Interval, cfg.Health.Timeout = time.Hour, time.Second
	cfg.Scrape.Interval = 0
	s := newIdleServer(tb, cfg)
	dialInMemory(s, ln)
	h := &handlerRig{s: s}
	var req fasthttp.Request
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("Authorization", "Bearer sk-x")
	req.SetBody(benchBody)
	h.ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}, nil)
	return h
}

func (h *handlerRig) once(tb testing.TB) {
	h.ctx.Response.KeepBodyBuffer = true // as fasthttp's server keeps a connection's response buffer
	h.ctx.Response.Reset()
	h.s.handleTop(&h.ctx) // the handler the server installs
	if h.ctx.Response.StatusCode() != 200 {
		tb.Fatalf("status %d: %s", h.ctx.Response.StatusCode(), h.ctx.Response.Body())
	}
}

var benchStreamBody = []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hi?"}]}`)

// onceStream proxies one streamed request and writes the response (as the
// server would, chunk by chunk) to a discarding writer.
func (h *handlerRig) onceStream(tb testing.TB, bw *bufio.Writer) {
	h.ctx.Request.SetBody(benchStreamBody)
	h.ctx.Response.Reset()
	h.s.handle(&h.ctx)
	if h.ctx.Response.StatusCode() != 200 || !h.ctx.Response.IsBodyStream() {
		tb.Fatalf("status %d stream %v: %s", h.ctx.Response.StatusCode(), h.ctx.Response.IsBodyStream(), h.ctx.Response.Body())
	}
	if err := h.ctx.Response.Write(bw); err != nil {
		tb.Fatal(err)
	}
	h.ctx.Request.SetBody(benchBody)
}

// BenchmarkHandlerStream is one proxied streamed request: the exchange is
// the body stream, usage is read from the last event.
func BenchmarkHandlerStream(b *testing.B) {
	h := newHandlerRig(b)
	bw := bufio.NewWriter(io.Discard)
	for range 100 {
		h.onceStream(b, bw)
	}
	b.ReportAllocs()
	for b.Loop() {
		h.onceStream(b, bw)
	}
}

func TestHandlerStreamAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; run without -race (make test-short) for this guarantee")
	}
	h := newHandlerRig(t)
	bw := bufio.NewWriter(io.Discard)
	for range 100 {
		h.onceStream(t, bw)
	}
	if got := value(t, h.s.m.actual); got != 16*100 {
		t.Fatalf("cached tokens from the usage chunk: %v, want %d", got, 16*100)
	}
	allocs := testing.AllocsPerRun(200, func() { h.onceStream(t, bw) })
	t.Logf("allocations per proxied stream (handler + response write): %v", allocs)
	// fasthttp v1.78's streamed client body costs 4 allocations per
	// response (clientStreamBody and three closures in transport.RoundTrip,
	// 184 B; see the memory profile of BenchmarkHandlerStream). The router's
	// own stream path adds none: this bound catches any it would add.
	const fasthttpStreamAllocs = 4
	if allocs > fasthttpStreamAllocs {
		t.Fatalf("%v allocations per proxied stream, want <= %d (fasthttp's own)", allocs, fasthttpStreamAllocs)
	}
}

// BenchmarkHandler is one proxied non-streaming request through the
// handler: parse, hash, decide, proxy, read usage, metrics.
func BenchmarkHandler(b *testing.B) {
	h := newHandlerRig(b)
	for range 100 {
		h.once(b)
	}
	b.ReportAllocs()
	for b.Loop() {
		h.once(b)
	}
}

func TestHandlerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; run without -race (make test-short) for this guarantee")
	}
	h := newHandlerRig(t)
	for range 100 {
		h.once(t)
	}
	allocs := testing.AllocsPerRun(200, func() { h.once(t) })
	t.Logf("allocations per proxied request (handler): %v", allocs)
	if allocs != 0 {
		t.Fatalf("%v allocations per proxied request, want 0", allocs)
	}
	// The fast-path seam costs nothing either.
	var seen int
	h.s.Observer = ObserverFunc(func(ev *RoutedEvent) { seen += ev.PromptTokens })
	allocs = testing.AllocsPerRun(200, func() { h.once(t) })
	if allocs != 0 || seen == 0 {
		t.Fatalf("with an Observer: %v allocations per request (want 0), observer saw %d tokens", allocs, seen)
	}
}

// TestHandlerAllocsPoolCalibrated: past the request count at which
// fasthttp's body-buffer pool (bytebufferpool) sizes what it keeps by the
// lengths of the buffers put back (42,000 puts of one size), a buffered
// answer still allocates nothing: the buffer the upstream response gives
// back is returned at its full length, so the pool keeps buffers of an
// answer's size instead of learning to drop them (one allocation of the
// body per request, and the garbage collector's work, when it did).
func TestHandlerAllocsPoolCalibrated(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; run without -race (make test-short) for this guarantee")
	}
	h := newHandlerRig(t)
	for range 43_000 {
		h.once(t)
	}
	allocs := testing.AllocsPerRun(200, func() { h.once(t) })
	if allocs != 0 {
		t.Fatalf("%v allocations per proxied request once the pool has calibrated, want 0", allocs)
	}
}

// BenchmarkRelay proxies streamed answers over loopback sockets, in the
// shapes of the live bench's proxy-cost table: 64 events in one upstream
// write, one write per event, and a 32 KiB buffered answer; the direct
// twin of each goes straight to the engine. Client and engine run in this
// process, so the numbers are for comparing runs and targets side by side.
func BenchmarkRelay(b *testing.B) {
	e := startRawEngine(b)
	cfg := testConfig(e.addr)
	cfg.Health.Interval, cfg.Health.Timeout = time.Minute, time.Second
	cfg.Scrape.Interval = 0
	s, err := New(cfg, testLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	router := startRouter(b, s)[len("http://"):]
	events := sseEvents(64, 16)
	big := bytes.Repeat([]byte("x"), 32<<10)
	shapes := []struct {
		name   string
		body   []byte
		pieces [][]byte
	}{
		{"sse-one-write", benchStreamBody, [][]byte{bytes.Join(chunkedPieces(events), nil)}},
		{"sse-flushed", benchStreamBody, chunkedPieces(events)},
		{"buffered-32KiB", benchBody, [][]byte{append([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(big))+"\r\n\r\n"), big...)}},
	}
	for _, sh := range shapes {
		for _, target := range []struct{ name, addr string }{{"direct", e.addr}, {"router", router}} {
			b.Run(sh.name+"/"+target.name, func(b *testing.B) {
				e.set(0, sh.pieces...)
				hc := &fasthttp.HostClient{Addr: target.addr, MaxConns: 4, Dial: func(a string) (net.Conn, error) { return net.Dial("tcp", a) }}
				defer hc.CloseIdleConnections()
				req := fasthttp.AcquireRequest() // serial releases it
				req.SetRequestURI("http://" + target.addr + "/v1/chat/completions")
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				req.SetBody(sh.body)
				serial(b, req, func(tb testing.TB, req *fasthttp.Request, resp *fasthttp.Response) {
					if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						tb.Fatalf("%v %d", err, resp.StatusCode())
					}
				})
			})
		}
	}
}

// BenchmarkHandlerLongPrompt is one proxied non-streaming request with a
// 400 KB (about 100k-token) prompt through the handler, 100 replicas (the
// cost policy), the upstream in memory: the router's own work for a long
// prompt (parse, hash, decide, forward the body, read the answer).
func BenchmarkHandlerLongPrompt(b *testing.B) {
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: fastBackend, MaxRequestBodySize: 8 << 20}
	go srv.Serve(ln) //nolint:errcheck
	b.Cleanup(func() { _ = srv.Shutdown() })
	var addrs []string
	for i := range 100 {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(i+1)) // never dialled
	}
	cfg := testConfig(addrs...)
	cfg.Health.Interval, cfg.Health.Timeout = time.Hour, time.Second
	cfg.Scrape.Interval = 0
	s := newIdleServer(b, cfg)
	dialInMemory(s, ln)
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog, ", 400_000/45)
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` + prompt + `"}]}`)
	var req fasthttp.Request
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}, nil)
	once := func() {
		ctx.Response.Reset()
		s.handle(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
	for range 20 {
		once()
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		once()
	}
}
