package slowpath

import (
	"bytes"
	"strings"
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
	e := startRawEngine(t)
	e.setHalfClosing(bytes.Join(chunkedPieces(sseEvents(3, 0)), nil))
	cfg := testConfig(e.addr)
	cfg.Health.Interval = time.Hour // no probes sharing the pool
	_, url := newTestServer(t, cfg)
	const body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 3 {
		st, got := post(t, url+"/v1/chat/completions", "application/json", body)
		if st != 200 || !strings.Contains(got, "[DONE]") {
			t.Fatalf("request %d: %d %q", i, st, got)
		}
	}
	// The router closes the first two connections once it finds them
	// closed; each one's reader has then counted every byte sent to it.
	waitFor(t, "the router to close the engine's first two connections", func() bool { return e.ended.Load() >= 2 })
	if n := e.late.Load(); n != 0 {
		t.Fatalf("%d bytes written to connections the engine had closed", n)
	}
}
