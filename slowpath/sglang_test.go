package slowpath

import (
	"fmt"
	"net"
	"testing"

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

// TestScrapeReadsSGLangServerInfo: an engine whose /metrics are SGLang's
// has its batch limit and radix-cache switch read from /get_server_info,
// and the router prices its batch slots and predicts no hit there.
func TestScrapeReadsSGLangServerInfo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health":
			ctx.SetBodyString("ok")
		case "/metrics":
			ctx.SetBodyString("# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 2\n" +
				"sglang:num_running_reqs{model_name=\"m\"} 6\nsglang:token_usage{model_name=\"m\"} 0.3\n" +
				"sglang:cache_config_info{model_name=\"m\",page_size=\"1\",max_total_num_tokens=\"20480\"} 1\n")
		case "/get_server_info":
			ctx.SetContentType("application/json")
			ctx.SetBodyString(sglangServerInfo(6, true))
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown() })
	addr := ln.Addr().String()
	s, _ := newTestServer(t, testConfig(addr))
	waitFor(t, "server info read", func() bool { return replicaStatus(t, s, addr).Engine.BatchSlots == 6 })
	waitFor(t, "signals", func() bool {
		a := replicaStatus(t, s, addr).Affinity
		return a != nil && a.Signals.BatchSlots == 6 && a.BatchSlots == 6 && a.CacheModel == "none"
	})
	if st := replicaStatus(t, s, addr); st.Engine.KVCapacityTokens != 20480 || st.Engine.Running != 6 {
		t.Fatalf("engine %+v", st.Engine)
	}
}
