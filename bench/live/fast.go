package live

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// fastBackend is the trivially fast backend of the router-overhead bench: an
// in-process fasthttp server that answers every chat completion at once
// with a fixed four-token answer, streamed (SSE) when the body asks for it,
// and serves /health, /v1/models and a minimal vLLM /metrics so warmpath
// treats it as an engine. Its cost is the same under every target, so the
// differences between targets are the routers'.
type fastBackend struct {
	srv  *fasthttp.Server
	ln   net.Listener
	done chan struct{}
}

var (
	fastStreamKey = []byte(`"stream":true`)
	fastStream    = []byte(sse(
		`{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":0,"model":"M","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":0,"model":"M","choices":[{"index":0,"delta":{"content":"one "},"finish_reason":null}]}`,
		`{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":0,"model":"M","choices":[{"index":0,"delta":{"content":"two "},"finish_reason":null}]}`,
		`{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":0,"model":"M","choices":[{"index":0,"delta":{"content":"six "},"finish_reason":null}]}`,
		`{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":0,"model":"M","choices":[{"index":0,"delta":{"content":"ten "},"finish_reason":"length"}]}`,
		`{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":0,"model":"M","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":4,"total_tokens":68,"prompt_tokens_details":{"cached_tokens":0}}}`,
		`[DONE]`))
	fastBody = []byte(`{"id":"chatcmpl-fast","object":"chat.completion","created":0,"model":"M","choices":[{"index":0,"message":{"role":"assistant","content":"one two six ten "},"finish_reason":"length"}],"usage":{"prompt_tokens":64,"completion_tokens":4,"total_tokens":68,"prompt_tokens_details":{"cached_tokens":0}}}`)
)

func sse(events ...string) string {
	var b bytes.Buffer
	for _, e := range events {
		b.WriteString("data: ")
		b.WriteString(e)
		b.WriteString("\n\n")
	}
	return b.String()
}

// startFast serves the fast backend on a loopback ephemeral port; it closes
// keep-alive connections idle for idle (0 = 5 minutes).
func startFast(model string, idle time.Duration) (*fastBackend, error) {
	if idle <= 0 {
		// Longer than any router's pooled-connection idle time (warmpath 60s,
		// nginx 60s), so no router meets a connection the backend closed.
		idle = 5 * time.Minute
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	q := strconv.Quote(model)
	metrics := []byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=" + q + "} 0\n" +
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=" + q + "} 0\n" +
		"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=" + q + "} 0\n" +
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"25000\"} 1\n")
	models := []byte(`{"object":"list","data":[{"id":` + q + `,"object":"model","owned_by":"bench"}]}`)
	f := &fastBackend{ln: ln, done: make(chan struct{})}
	f.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case "/v1/chat/completions":
				if bytes.Contains(ctx.PostBody(), fastStreamKey) {
					ctx.SetContentType("text/event-stream")
					ctx.SetBody(fastStream)
					return
				}
				ctx.SetContentType("application/json")
				ctx.SetBody(fastBody)
			case "/health":
			case "/metrics":
				ctx.SetContentType("text/plain; version=0.0.4")
				ctx.SetBody(metrics)
			case "/v1/models":
				ctx.SetContentType("application/json")
				ctx.SetBody(models)
			default:
				ctx.SetStatusCode(fasthttp.StatusNotFound)
			}
		},
		ReadTimeout:           10 * time.Second,
		IdleTimeout:           idle,
		MaxRequestBodySize:    64 << 20,
		NoDefaultServerHeader: true,
	}
	go func() { _ = f.srv.Serve(ln); close(f.done) }()
	return f, nil
}

func (f *fastBackend) addr() string { return f.ln.Addr().String() }

func (f *fastBackend) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = f.srv.ShutdownWithContext(ctx) // the routers are gone by now: no idle keep-alives remain
	<-f.done
}
