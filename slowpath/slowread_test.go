package slowpath

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// firehose is an engine whose streams never end on their own: 16 KiB SSE
// events until a write fails or maxBytes are out. written counts the bytes
// the router has taken from it; done counts streams that ended.
type firehose struct {
	addr          string
	written, done atomic.Int64
}

const firehoseMax = 256 << 20

func startFirehose(t *testing.T) *firehose {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &firehose{addr: ln.Addr().String()}
	ev := []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("x", 16<<10) + "\"}}]}\n\n")
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health", "/metrics":
			return
		}
		if !strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"x","choices":[]}`)
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer f.done.Add(1)
			for f.written.Load() < firehoseMax {
				if _, err := w.Write(ev); err != nil {
					return
				}
				if err := w.Flush(); err != nil {
					return
				}
				f.written.Add(int64(len(ev)))
			}
		})
	}}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown(); _ = ln.Close() })
	return f
}

// TestSlowReader: a client asks for a stream and never reads it. The router
// must not buffer the stream (it pulls from the engine only as fast as the
// client drains: TCP back-pressure all the way), other clients keep being
// served, and the slow reader's slots are freed when its connection goes:
// by the client closing it, or by the router at limits.write_timeout, or,
// with neither, at limits.stall_timeout (the default protection).
func TestSlowReader(t *testing.T) {
	for _, tc := range []struct {
		name         string
		writeTimeout time.Duration
		stallTimeout time.Duration
	}{
		{"client closes", 0, time.Minute},
		{"write_timeout closes", 500 * time.Millisecond, time.Minute},
		{"stall_timeout closes, client never does", 0, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFirehose(t)
			cfg := testConfig(f.addr)
			cfg.Limits.WriteTimeout = tc.writeTimeout
			cfg.Limits.StallTimeout = tc.stallTimeout
			s, url := newTestServer(t, cfg)
			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // hang guard
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			// Now the client reads nothing. The engine's writes stall once
			// the socket buffers between it and the client are full.
			var last int64 = -1
			waitFor(t, "the engine's writes to stall", func() bool {
				time.Sleep(50 * time.Millisecond)
				n := f.written.Load()
				stalled := n == last
				last = n
				return stalled || f.done.Load() > 0
			})
			// Socket buffers are a few MiB on loopback; the stream is 256 MiB.
			if n := f.written.Load(); n > 32<<20 {
				t.Fatalf("the router pulled %d bytes of a stream nobody reads: it buffers", n)
			} else {
				t.Logf("the engine's writes stalled after %d bytes", n)
			}
			// Other clients are unaffected.
			for i := range 20 {
				if st, b := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
					t.Fatalf("request %d beside the slow reader: %d %s", i, st, b)
				}
			}
			cut := tc.writeTimeout > 0 || tc.stallTimeout < time.Minute
			if !cut {
				c.Close()
			}
			// The slow reader's stream ends: the engine's write fails and the
			// router's slots are free again.
			waitFor(t, "the engine's stream to end", func() bool { return f.done.Load() == 1 })
			waitFor(t, "the router's slots to be freed", func() bool { return s.inflight.Load() == 0 })
			if f.written.Load() >= firehoseMax {
				t.Fatalf("the engine wrote the whole stream: nothing stopped it")
			}
			if cut {
				// The router closed the connection: reading drains what the
				// buffers held and ends without the final chunk.
				_, err := io.Copy(io.Discard, resp.Body)
				if err == nil {
					t.Fatal("the stream ended cleanly; want it cut")
				}
			}
		})
	}
}
