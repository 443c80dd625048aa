package slowpath

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// apiBackend answers /v1/responses with a Responses object whose id is new
// each time (as vLLM's are), anything else with fastBackend's chat answer.
func apiBackend(n *atomic.Int64) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/responses" {
			fastBackend(ctx)
			return
		}
		b := append(ctx.Response.Body()[:0], `{"id":"resp_`...)
		b = strconv.AppendInt(b, n.Add(1), 10)
		b = append(b, `","object":"response","status":"completed","model":"m","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":30,"output_tokens":1,"total_tokens":31,"input_tokens_details":{"cached_tokens":16}}}`...)
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
	}
}

// newAPIRig is newHandlerRig with apiBackend.
func newAPIRig(tb testing.TB) *handlerRig {
	tb.Helper()
	ln := fasthttputil.NewInmemoryListener()
	var n atomic.Int64
	srv := &fasthttp.Server{Handler: apiBackend(&n)}
	go srv.Serve(ln) //nolint:errcheck
	tb.Cleanup(func() { _ = srv.Shutdown() })
	cfg := testConfig("127.0.0.1:1")
	cfg.Health.Interval, cfg.Health.Timeout = time.Hour, time.Second
	cfg.Scrape.Interval = 0
	s := newIdleServer(tb, cfg)
	dialInMemory(s, ln)
	h := &handlerRig{s: s}
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	h.ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}, nil)
	return h
}

var (
	benchResponsesBody = []byte(`{"model":"m","instructions":"You are a helpful assistant. Answer briefly and precisely, citing sources where you can.","input":"What is the capital of France?"}`)
	benchPinnedBody    = []byte(`{"model":"m","previous_response_id":"resp_1","input":"And of Italy?"}`)
	benchTokenizeBody  = []byte(`{"model":"m","prompt":"What is the capital of France?"}`)
)

type apiCase struct {
	name, path string
	body       []byte
}

var apiCases = []apiCase{
	{"chat", "/v1/chat/completions", benchBody}, // the baseline twin
	{"responses", "/v1/responses", benchResponsesBody},
	{"responses-pinned", "/v1/responses", benchPinnedBody},
	{"tokenize", "/tokenize", benchTokenizeBody},
}

func (h *handlerRig) set(c apiCase) {
	h.ctx.Request.SetRequestURI(c.path)
	h.ctx.Request.SetBody(c.body)
}

// BenchmarkHandlerAPI: one proxied request per endpoint kind through the
// handler (no client socket, upstream in memory), chat as the baseline.
func BenchmarkHandlerAPI(b *testing.B) {
	h := newAPIRig(b)
	h.s.api.responses.put([]byte("resp_1"), h.s.replicaByName("127.0.0.1:1").name, h.s.now())
	for _, c := range apiCases {
		b.Run(c.name, func(b *testing.B) {
			h.set(c)
			for range 100 {
				h.once(b)
			}
			b.ReportAllocs()
			for b.Loop() {
				h.once(b)
			}
		})
	}
}

// TestHandlerAPIAllocs: pass-through and pinned Responses requests
// allocate nothing in the router but the one thing they must keep: each
// new response id is stored (its string, and an entry until the store is
// full).
func TestHandlerAPIAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; run without -race (make test-short) for this guarantee")
	}
	h := newAPIRig(t)
	h.s.api.responses.put([]byte("resp_1"), "127.0.0.1:1", h.s.now())
	for _, tc := range []struct {
		c   apiCase
		max float64
	}{{apiCases[0], 0}, {apiCases[1], 2}, {apiCases[2], 2}, {apiCases[3], 0}} {
		h.set(tc.c)
		for range 100 {
			h.once(t)
		}
		allocs := testing.AllocsPerRun(200, func() { h.once(t) })
		t.Logf("%s: %v allocations per request", tc.c.name, allocs)
		if allocs > tc.max {
			t.Errorf("%s: %v allocations per request, want <= %v", tc.c.name, allocs, tc.max)
		}
	}
	if n := h.s.api.responses.len(); n < 300 {
		t.Fatalf("%d response ids stored, want every answer's", n)
	}
}

// TestNoWorkRequestsDoNotTeach: tokenize calls (and the other requests an
// engine generates nothing for) leave the replica's learned batch-slot time
// and prefill rate alone, while a chat request moves them.
func TestNoWorkRequestsDoNotTeach(t *testing.T) {
	h := newAPIRig(t)
	state := func() (float64, float64) {
		st := h.s.Router().Replicas()[0]
		return st.SlotSeconds, st.PrefillTokensPerSec
	}
	slot0, rate0 := state()
	h.set(apiCases[3]) // tokenize
	for range 50 {
		h.once(t)
	}
	h.ctx.Request.Header.SetMethod(fasthttp.MethodGet)
	h.ctx.Request.SetRequestURI("/version")
	for range 50 {
		h.once(t)
	}
	h.ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	if slot, rate := state(); slot != slot0 || rate != rate0 {
		t.Fatalf("no-work requests moved the model: slot %v -> %v, rate %v -> %v", slot0, slot, rate0, rate)
	}
	h.set(apiCases[0]) // chat
	for range 50 {
		h.once(t)
	}
	if slot, _ := state(); slot == slot0 {
		t.Fatalf("chat requests left the slot time at %v: the check above proves nothing", slot)
	}
}
