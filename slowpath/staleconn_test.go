package slowpath

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHalfClosedPooledConnSkipped: an engine that ends each streamed answer
// by closing its side of the connection and leaving it half-open (as
// llama.cpp's server does for about 100 ms) must not get the next request
// on that connection. The router finds the FIN waiting on the pooled
// connection before it writes, and sends the request on a fresh one.
// Without the check the request went out on the dead connection, whose
// wait for an answer found the FIN's readiness already consumed and slept
// until the client poll before the stale connection was seen.
func TestHalfClosedPooledConnSkipped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		conns     atomic.Int32 // connections that carried a chat request
		lateBytes atomic.Int32 // bytes that arrived on a connection after its answer
		ended     atomic.Int32 // half-closed connections the router closed
		wg        sync.WaitGroup
		mu        sync.Mutex
		open      []net.Conn
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	answer := bytes.Join(chunkedPieces(sseEvents(3, 0)), nil)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if req.URL.Path != "/v1/chat/completions" {
						if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")); err != nil {
							return
						}
						continue
					}
					conns.Add(1)
					if _, err := c.Write(answer); err != nil {
						return
					}
					// Half-close and stay open: whatever arrives now was
					// written to a connection the engine closed.
					_ = c.(*net.TCPConn).CloseWrite()
					buf := make([]byte, 4096)
					for {
						n, err := br.Read(buf)
						lateBytes.Add(int32(n))
						if err != nil {
							ended.Add(1)
							return
						}
					}
				}
			}()
		}
	}()

	cfg := testConfig(ln.Addr().String())
	cfg.Health.Interval = time.Hour // no probes sharing the pool
	_, url := newTestServer(t, cfg)
	const body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 3 {
		st, got := post(t, url+"/v1/chat/completions", "application/json", body)
		if st != 200 || !strings.Contains(got, "[DONE]") {
			t.Fatalf("request %d: %d %q", i, st, got)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections carried the 3 requests, want 3 (each answer closed its own)", n)
	}
	// The router closes the first two connections once it finds them
	// closed; each one's reader has then counted every byte sent to it.
	waitFor(t, "the router to close the engine's first two connections", func() bool { return ended.Load() >= 2 })
	if n := lateBytes.Load(); n != 0 {
		t.Fatalf("%d bytes written to connections the engine had closed", n)
	}
}
