package slowpath

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// bigEngine answers every completion with a JSON body of size bytes
// (Content-Length, or chunked when chunked is set) whose usage reports 5
// cached tokens.
type bigEngine struct {
	addr     string
	size     atomic.Int64
	chunked  bool
	requests atomic.Int64
}

func startBigEngine(t *testing.T, size int, chunked bool) *bigEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &bigEngine{addr: ln.Addr().String(), chunked: chunked}
	e.size.Store(int64(size))
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/chat/completions" {
			ctx.SetStatusCode(http.StatusOK)
			return
		}
		e.requests.Add(1)
		tail := `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":5}}}`
		head := `{"id":"x","choices":[{"message":{"role":"assistant","content":"`
		body := head + strings.Repeat("a", max(0, int(e.size.Load())-len(head)-len(tail))) + tail
		ctx.SetContentType("application/json")
		if e.chunked {
			ctx.SetBodyStream(strings.NewReader(body), -1)
			return
		}
		ctx.SetBodyString(body)
	}}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown(); _ = ln.Close() })
	return e
}

// TestMaxResponseBytes: a non-streamed engine answer over
// limits.max_response_bytes is a 502 response_too_large, not retried on
// the other replicas and not held against the replica; one under it passes
// intact (its usage read from the tail when large).
func TestMaxResponseBytes(t *testing.T) {
	const limit = 2 << 20
	for _, chunked := range []bool{false, true} {
		t.Run("chunked="+strconv.FormatBool(chunked), func(t *testing.T) {
			big := startBigEngine(t, 3<<20, chunked)
			big2 := startBigEngine(t, 3<<20, chunked)
			cfg := testConfig(big.addr, big2.addr)
			cfg.Limits.MaxResponseBytes = limit
			cfg.Passive.ConsecutiveFailures = 1
			// Passive health is under test: no active probe (its 20 ms
			// timeout can miss under -race on busy cores) may eject a replica.
			cfg.Health.Interval, cfg.Health.Timeout = time.Minute, time.Second
			s, url := newTestServer(t, cfg)
			code, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
			var e struct{ Error struct{ Code, Type string } }
			_ = json.Unmarshal([]byte(body), &e)
			if code != http.StatusBadGateway || e.Error.Code != "response_too_large" {
				t.Fatalf("got %d %.200s, want 502 response_too_large", code, body)
			}
			if n := big.requests.Load() + big2.requests.Load(); n != 1 {
				t.Errorf("engines saw %d requests, want 1 (no retry)", n)
			}
			for _, r := range s.Replicas() {
				if !r.Healthy || r.ConsecutiveFailures != 0 || r.InFlight != 0 {
					t.Errorf("replica %s: healthy %v, failures %d, in flight %d", r.Name, r.Healthy, r.ConsecutiveFailures, r.InFlight)
				}
			}
			big.size.Store(limit - 1024)
			big2.size.Store(limit - 1024)
			code, body = post(t, url+"/v1/chat/completions", "application/json", chatBody)
			if code != http.StatusOK || len(body) != limit-1024 || !strings.HasSuffix(body, `"cached_tokens":5}}}`) {
				t.Fatalf("under the limit: %d, %d bytes", code, len(body))
			}
			if got := metricValue(t, s, "warmpath_slowpath_cached_tokens_actual_total", "", ""); got != 5 {
				t.Errorf("cached tokens read from the large answer: %v, want 5", got)
			}
		})
	}
}
