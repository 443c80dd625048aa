package slowpath

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestScrapeBodySizeLimit: an engine /metrics body over
// scrape.body_size_limit fails the scrape (it is not read on past the
// limit, nor parsed), is counted and logged once; the replica stays healthy
// and routed; a body back under the limit is read again.
func TestScrapeBodySizeLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var pad atomic.Int64
	pad.Store(256 << 10)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/metrics":
			ctx.SetBodyString("vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n# " + strings.Repeat("x", int(pad.Load())) + "\n")
		case "/v1/chat/completions":
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[]}`)
		}
	}}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown(); _ = ln.Close() })
	addr := ln.Addr().String()
	cfg := testConfig(addr)
	cfg.Scrape.Interval, cfg.Scrape.Timeout, cfg.Scrape.StaleAfter = 100*time.Millisecond, 100*time.Millisecond, time.Second
	cfg.Scrape.BodySizeLimit = 64 << 10
	var logs syncBuffer
	s, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	url := startRouter(t, s)
	waitFor(t, "several refused scrapes", func() bool {
		return metricValue(t, s, "warmpath_slowpath_scrape_body_too_large_total", "", "") >= 3
	})
	st := replicaStatus(t, s, addr)
	if !strings.Contains(st.Engine.Error, "scrape.body_size_limit") || st.Engine.Waiting != 0 || !st.Healthy {
		t.Fatalf("replica after oversized scrapes: %+v", st)
	}
	if c := bytes.Count([]byte(logs.String()), []byte("over scrape.body_size_limit")); c != 1 {
		t.Fatalf("logged %d times, want once", c)
	}
	if code, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); code != 200 {
		t.Fatalf("routing: %d %s", code, body)
	}
	pad.Store(10)
	waitFor(t, "a scrape under the limit", func() bool { return replicaStatus(t, s, addr).Engine.Waiting == 3 })
}
