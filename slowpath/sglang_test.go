package slowpath

import (
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// sglangServerInfo is the shape of SGLang's GET /get_server_info: the
// server arguments at the top level (max_running_requests null unless
// given), each scheduler's effective values in internal_states.
func sglangServerInfo(maxRunning int, disableRadix bool) string {
	return fmt.Sprintf(`{"model_path":"qwen/qwen2.5-0.5b-instruct","max_running_requests":null,`+
		`"max_total_tokens":null,"chunked_prefill_size":8192,"page_size":1,"disable_radix_cache":%t,`+
		`"enable_metrics":true,"status":"ready","max_total_num_tokens":20480,"max_req_input_len":20474,`+
		`"internal_states":[{"model_path":"qwen/qwen2.5-0.5b-instruct","max_running_requests":%d,`+
		`"max_total_tokens":20480,"disable_radix_cache":%t,"last_gen_throughput":0.0}],"version":"0.5.6"}`,
		disableRadix, maxRunning, disableRadix)
}

func TestParseServerInfoSGLang(t *testing.T) {
	p, err := parseServerInfo([]byte(sglangServerInfo(48, false)))
	if err != nil {
		t.Fatal(err)
	}
	if p != (engineProps{TotalSlots: 48}) {
		t.Fatalf("server info %+v, want 48 batch slots, radix cache on", p)
	}
	if p, err = parseServerInfo([]byte(sglangServerInfo(8, true))); err != nil || p != (engineProps{TotalSlots: 8, NoPrefixCache: true}) {
		t.Fatalf("server info %+v, %v; want 8 slots, no prefix cache", p, err)
	}
	// the argument, where no scheduler state says more
	if p, err = parseServerInfo([]byte(`{"max_running_requests":16}`)); err != nil || p.TotalSlots != 16 {
		t.Fatalf("server info %+v, %v; want 16 slots", p, err)
	}
	for _, bad := range []string{`{}`, `{"max_running_requests":null,"internal_states":[]}`, `{"internal_states":[{"max_running_requests":0}]}`,
		`{"max_running_requests":"4"}`, `not json`, `{"max_running_requests":1e9}`} {
		if _, err := parseServerInfo([]byte(bad)); err == nil {
			t.Errorf("parseServerInfo(%s): no error", bad)
		}
	}
}

// fakeSGLang serves SGLang's /metrics and /get_server_info (6 batch
// slots, radix cache off); refuse makes the latter answer 401, as a
// server with an admin key does. It counts both.
type fakeSGLang struct {
	addr                  string
	refuse                atomic.Bool
	metricsHits, infoHits atomic.Int64
}

func startFakeSGLang(t *testing.T) *fakeSGLang {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeSGLang{addr: ln.Addr().String()}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health":
			ctx.SetBodyString("ok")
		case "/metrics":
			e.metricsHits.Add(1)
			ctx.SetBodyString("# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 2\n" +
				"sglang:num_running_reqs{model_name=\"m\"} 6\nsglang:token_usage{model_name=\"m\"} 0.3\n" +
				"sglang:cache_config_info{model_name=\"m\",page_size=\"1\",max_total_num_tokens=\"20480\"} 1\n")
		case "/get_server_info":
			e.infoHits.Add(1)
			if e.refuse.Load() {
				ctx.SetStatusCode(401)
				return
			}
			ctx.SetContentType("application/json")
			ctx.SetBodyString(sglangServerInfo(6, true))
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown() })
	return e
}

// TestScrapeReadsSGLangServerInfo: an engine whose /metrics are SGLang's
// has its batch limit and radix-cache switch read from /get_server_info,
// and the router prices its batch slots and predicts no hit there.
func TestScrapeReadsSGLangServerInfo(t *testing.T) {
	e := startFakeSGLang(t)
	s, _ := newTestServer(t, testConfig(e.addr))
	waitFor(t, "server info read", func() bool { return replicaStatus(t, s, e.addr).Engine.BatchSlots == 6 })
	waitFor(t, "signals", func() bool {
		a := replicaStatus(t, s, e.addr).Affinity
		return a != nil && a.Signals.BatchSlots == 6 && a.BatchSlots == 6 && a.CacheModel == "none"
	})
	if st := replicaStatus(t, s, e.addr); st.Engine.KVCapacityTokens != 20480 || st.Engine.Running != 6 {
		t.Fatalf("engine %+v", st.Engine)
	}
	// read once per engine start, not every scrape
	n := e.infoHits.Load()
	for m := e.metricsHits.Load(); e.metricsHits.Load() < m+10; {
		time.Sleep(5 * time.Millisecond)
	}
	if got := e.infoHits.Load(); got != n {
		t.Fatalf("/get_server_info read %d more times after it answered", got-n)
	}
}

// TestScrapeBacksOffRefusedServerInfo: an engine that refuses its
// description is asked again after a growing pause, not every scrape,
// and read once it answers.
func TestScrapeBacksOffRefusedServerInfo(t *testing.T) {
	e := startFakeSGLang(t)
	e.refuse.Store(true)
	s, _ := newTestServer(t, testConfig(e.addr)) // a scrape every 20 ms
	waitFor(t, "40 scrapes", func() bool { return e.metricsHits.Load() >= 40 })
	scrapes, asked := e.metricsHits.Load(), e.infoHits.Load()
	if asked < 2 || asked > scrapes/4 {
		t.Fatalf("/get_server_info asked %d times in %d scrapes, want a few retries (back-off from the scrape interval)", asked, scrapes)
	}
	e.refuse.Store(false)
	waitFor(t, "server info read once answered", func() bool { return replicaStatus(t, s, e.addr).Engine.BatchSlots == 6 })
}
