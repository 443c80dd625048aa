package slowpath

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"github.com/warmpath/warmpath/affinity"
)

// rawEngine is an engine on a loopback socket that answers every request
// on a keep-alive connection with fixed response bytes, written in the
// given pieces (one write each) with gap between them: the framing and the
// write pattern are exactly what the test says.
type rawEngine struct {
	addr   string
	mu     sync.Mutex
	pieces [][]byte
	gap    time.Duration
	close  bool // close the connection after the answer
	// half: after the answer, close only the write side (llama.cpp's
	// server after a stream) and count what still arrives (late) until
	// the client closes (ended).
	half        bool
	late, ended atomic.Int32
	// next, when set, paces the pieces instead of gap: each piece after the
	// first waits for a value (the client received the one before).
	next chan struct{}
}

func startRawEngine(tb testing.TB) *rawEngine {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e := &rawEngine{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	tb.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.serve(c)
			}()
		}
	}()
	return e
}

func (e *rawEngine) set(gap time.Duration, pieces ...[]byte) {
	e.mu.Lock()
	e.pieces, e.gap, e.close, e.half, e.next = pieces, gap, false, false, nil
	e.mu.Unlock()
}

// setClosing is set, closing the connection after each answer.
func (e *rawEngine) setClosing(gap time.Duration, pieces ...[]byte) {
	e.set(gap, pieces...)
	e.mu.Lock()
	e.close = true
	e.mu.Unlock()
}

// setHalfClosing is set, half-closing the connection after each answer.
func (e *rawEngine) setHalfClosing(pieces ...[]byte) {
	e.set(0, pieces...)
	e.mu.Lock()
	e.half = true
	e.mu.Unlock()
}

// serve reads requests (headers and a Content-Length body) and answers
// each; /metrics and /health get an empty 200.
func (e *rawEngine) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
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
		e.mu.Lock()
		pieces, gap, closing, half, next := e.pieces, e.gap, e.close, e.half, e.next
		e.mu.Unlock()
		if half {
			corkForFIN(c) // the answer's last bytes leave with the FIN
		}
		for i, p := range pieces {
			switch {
			case i > 0 && next != nil:
				select {
				case <-next:
				case <-time.After(10 * time.Second):
					return
				}
			case i > 0 && gap > 0:
				time.Sleep(gap)
			}
			if _, err := c.Write(p); err != nil {
				return
			}
		}
		if closing {
			return
		}
		if half {
			_ = c.(*net.TCPConn).CloseWrite()
			buf := make([]byte, 4096)
			for {
				n, err := br.Read(buf)
				e.late.Add(int32(n))
				if err != nil {
					e.ended.Add(1)
					return
				}
			}
		}
	}
}

// sseEvents is n chat-completion events, the last with usage reporting
// cached tokens, then [DONE].
func sseEvents(n, cached int) [][]byte {
	var ev [][]byte
	for i := range n - 1 {
		ev = append(ev, fmt.Appendf(nil, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", i))
	}
	ev = append(ev, fmt.Appendf(nil, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", n-1, cached))
	return append(ev, []byte("data: [DONE]\n\n"))
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"

// chunk frames b as one HTTP chunk.
func chunk(b []byte) []byte {
	return append(append(strconv.AppendInt(nil, int64(len(b)), 16), "\r\n"...), append(b, "\r\n"...)...)
}

// chunkedPieces is a chunked SSE response: the head and each event as its
// own chunk, in one write per event (the head with the first), and the
// last chunk with the [DONE] event.
func chunkedPieces(events [][]byte) [][]byte {
	var out [][]byte
	for i, ev := range events {
		p := chunk(ev)
		if i == 0 {
			p = append([]byte(sseHead+"Transfer-Encoding: chunked\r\n\r\n"), p...)
		}
		out = append(out, p)
	}
	out[len(out)-1] = append(out[len(out)-1], "0\r\n\r\n"...)
	return out
}

// writeLog records every write a client connection would see, and
// signals each on notify when set.
type writeLog struct {
	writes [][]byte
	notify chan struct{}
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), p...))
	if w.notify != nil {
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// streamRig drives the handler for a streamed request against a real
// upstream socket and writes the response as the server does (a
// serverWriteBuffer-sized bufio.Writer, flushed at the end), recording the
// writes.
type streamRig struct {
	s      *Server
	ctx    fasthttp.RequestCtx
	ev     RoutedEvent
	notify chan struct{} // passed to the writeLog
}

func (r *streamRig) ObserveRouted(ev *RoutedEvent) { r.ev = *ev }

func newStreamRig(tb testing.TB, engine string) *streamRig {
	tb.Helper()
	cfg := testConfig(engine)
	cfg.Health.Interval, cfg.Health.Timeout = time.Hour, time.Second
	cfg.Scrape.Interval = 0
	cfg.Passive.ConsecutiveFailures = 0 // broken streams are under test: never eject
	s := newIdleServer(tb, cfg)
	r := &streamRig{s: s}
	s.Observer = r
	var req fasthttp.Request
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(benchStreamBody)
	r.ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}, nil)
	return r
}

// once proxies one stream; it returns the client writes and the body the
// client decodes from them.
func (r *streamRig) once(tb testing.TB) (writes [][]byte, body []byte) {
	tb.Helper()
	r.ctx.Response.Reset()
	r.s.handle(&r.ctx)
	if r.ctx.Response.StatusCode() != 200 || !r.ctx.Response.IsBodyStream() {
		tb.Fatalf("status %d stream %v: %s", r.ctx.Response.StatusCode(), r.ctx.Response.IsBodyStream(), r.ctx.Response.Body())
	}
	log := writeLog{notify: r.notify}
	bw := bufio.NewWriterSize(&log, serverWriteBuffer)
	if err := r.ctx.Response.Write(bw); err != nil {
		tb.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(bytes.Join(log.writes, nil))), nil)
	if err != nil {
		tb.Fatal(err)
	}
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("client decoding the relayed stream: %v", err)
	}
	return log.writes, body
}

// TestRelayCoalesces: events that reach the router together leave in one
// client write (plus the final write of the chunked terminator); events
// sent one at a time (each after the client got the one before) each leave
// at once in their own write, none held for the next; the usage chunk is
// read either way.
func TestRelayCoalesces(t *testing.T) {
	e := startRawEngine(t)
	r := newStreamRig(t, e.addr)
	events := sseEvents(64, 48)
	want := bytes.Join(events, nil)

	e.set(0, bytes.Join(chunkedPieces(events), nil))
	writes, body := r.once(t)
	if !bytes.Equal(body, want) {
		t.Fatalf("one upstream write: relayed %d bytes, engine sent %d", len(body), len(want))
	}
	if len(writes) != 2 {
		t.Errorf("64 events in one upstream write left in %d client writes, want 2 (events, terminator)", len(writes))
	}
	if r.ev.CachedTokens != 48 || !r.ev.OK {
		t.Errorf("one upstream write: cached %d ok %v, want 48 true", r.ev.CachedTokens, r.ev.OK)
	}

	// Each event is sent once the client has the one before: none can
	// arrive together, whatever the scheduling.
	few := sseEvents(4, 12)
	e.set(0, chunkedPieces(few)...)
	r.notify = make(chan struct{}, len(few))
	e.mu.Lock()
	e.next = r.notify
	e.mu.Unlock()
	writes, body = r.once(t)
	if !bytes.Equal(body, bytes.Join(few, nil)) {
		t.Fatalf("paced: relayed %q", body)
	}
	if len(writes) != len(few)+1 {
		t.Errorf("%d events sent one at a time left in %d client writes, want %d (one each, then the terminator)", len(few), len(writes), len(few)+1)
	}
	for i, w := range writes[:len(few)] {
		if !bytes.HasSuffix(w, []byte("\n\n\r\n")) {
			t.Errorf("write %d does not end with a whole event: %q", i, w)
		}
	}
	if r.ev.CachedTokens != 12 {
		t.Errorf("paced: cached %d, want 12", r.ev.CachedTokens)
	}
}

// TestRelayCutsAtEventBoundary: a burst larger than the relay buffer
// leaves in several writes, each ending with a whole event.
func TestRelayCutsAtEventBoundary(t *testing.T) {
	e := startRawEngine(t)
	r := newStreamRig(t, e.addr)
	events := sseEvents(400, 7) // about 40 KiB
	want := bytes.Join(events, nil)
	if len(want) <= 2*relayBufSize {
		t.Fatalf("test stream of %d bytes does not overflow the relay buffer twice", len(want))
	}
	e.set(0, bytes.Join(chunkedPieces(events), nil))
	writes, body := r.once(t)
	if !bytes.Equal(body, want) {
		t.Fatalf("relayed %d bytes, engine sent %d", len(body), len(want))
	}
	if len(writes) < 3 {
		t.Fatalf("%d bytes left in %d writes", len(want), len(writes))
	}
	for i, w := range writes[:len(writes)-1] {
		if !bytes.HasSuffix(w, []byte("\n\n\r\n")) {
			t.Errorf("write %d of %d splits an event: ends %q", i, len(writes), w[max(len(w)-20, 0):])
		}
		if len(w) > serverWriteBuffer {
			t.Errorf("write %d is %d bytes, past the write buffer", i, len(w))
		}
	}
	if r.ev.CachedTokens != 7 {
		t.Errorf("cached %d, want 7", r.ev.CachedTokens)
	}
}

// TestRelayFraming: the relay's own decoding of the engine's body framing,
// with the bytes split at every framing position: chunk extensions,
// trailers, upper-case hex, Content-Length and close-delimited bodies all
// relay the exact body and find the usage; broken framing ends the stream
// with the SSE error event and counts a broken stream.
func TestRelayFraming(t *testing.T) {
	events := sseEvents(3, 5)
	body := bytes.Join(events, nil)
	var ext bytes.Buffer
	ext.WriteString(sseHead + "Transfer-Encoding: chunked\r\n\r\n")
	for _, ev := range events {
		fmt.Fprintf(&ext, "%X;name=value \r\n%s\r\n", len(ev), ev)
	}
	ext.WriteString("0\r\nX-Trailer: 1\r\n\r\n")
	cl := []byte(sseHead + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
	chunked := bytes.Join(chunkedPieces(events), nil)
	cases := []struct {
		name    string
		resp    []byte
		closing bool // the engine closes the connection after it
		broken  bool
	}{
		{"chunked-ext-trailer", ext.Bytes(), false, false},
		{"content-length", cl, false, false},
		{"close-delimited", []byte(sseHead + "\r\n" + string(body)), true, false},
		{"chunked-truncated", chunked[:len(chunked)/2], true, true},
		{"chunked-bad-size", []byte(sseHead + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"), false, true},
		{"chunked-missing-crlf", []byte(sseHead + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n"), false, true},
		{"content-length-short", cl[:len(cl)-10], true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			head := bytes.Index(c.resp, []byte("\r\n\r\n")) + 4
			e := startRawEngine(t)
			r := newStreamRig(t, e.addr)
			for _, split := range []int{0, 1, 2, 3, 5, 7, 13} {
				// The head in one write, the body in pieces of split bytes
				// (0: whole) with a pause between, so the relay meets every
				// framing boundary at the end of what it has.
				pieces := [][]byte{c.resp[:head]}
				for i := head; i < len(c.resp); {
					j := len(c.resp)
					if split > 0 {
						j = min(i+split, j)
					}
					pieces = append(pieces, c.resp[i:j])
					i = j
				}
				gap := time.Duration(0)
				if split > 0 {
					gap = 200 * time.Microsecond
				}
				if c.closing {
					e.setClosing(gap, pieces...)
				} else {
					e.set(gap, pieces...)
				}
				_, got := r.once(t)
				if c.broken {
					if !bytes.HasSuffix(got, sseBroken) || r.ev.OK {
						t.Fatalf("split %d: ok %v, stream ends %q", split, r.ev.OK, got[max(len(got)-60, 0):])
					}
					continue
				}
				if !bytes.Equal(got, body) || r.ev.CachedTokens != 5 || !r.ev.OK {
					t.Fatalf("split %d: relayed %q (cached %d ok %v), want %q", split, got, r.ev.CachedTokens, r.ev.OK, body)
				}
			}
		})
	}
}

// FuzzUsageKey: usageKeysIn, the scan's gate, never passes over an event
// usageJSON would read cached tokens or engine timings from.
func FuzzUsageKey(f *testing.F) {
	for _, s := range sseSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"choices":[],"timings":{"cache_n":12,"prompt_n":4,"prompt_ms":2.5,"predicted_ms":9}}`))
	f.Add([]byte(`{"timings":{"predicted_ms":9}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var o affinity.Outcome
		c := usageJSON(new(fastjson.Parser), b, &o)
		if (c >= 0 || o != (affinity.Outcome{})) && usageKeysIn(b)&(keyCached|keyTimings) == 0 {
			t.Fatalf("usageJSON reads cached %d, timings %+v from %q, which usageKeysIn passes over", c, o, b)
		}
	})
}

// TestUsageTail: an answer over usageScanFrom is read from its last usage
// and timings objects alone, with what a whole parse finds.
func TestUsageTail(t *testing.T) {
	text := strings.Repeat(`lorem \"ipsum\" {dolor} [sit] amet `, (32<<10)/36)
	cases := []struct {
		name, tail string
		cached     int
		o          affinity.Outcome
	}{
		{"usage", `"usage":{"prompt_tokens":90,"prompt_tokens_details":{"cached_tokens":77}}}`, 77, affinity.Outcome{}},
		{"usage-and-timings", `"usage":{"prompt_tokens":90,"prompt_tokens_details":{"cached_tokens":77}},"timings":{"cache_n":60,"prompt_n":30,"prompt_ms":15,"predicted_ms":200}}`,
			77, affinity.Outcome{PrefillTokens: 30, PrefillSeconds: 0.015, DecodeSeconds: 0.2}},
		{"timings-only", `"usage":{"prompt_tokens":90},"timings":{"cache_n":60,"prompt_n":30,"prompt_ms":15}}`, 60, affinity.Outcome{PrefillTokens: 30, PrefillSeconds: 0.015}},
		{"none", `"usage":{"prompt_tokens":90}}`, -1, affinity.Outcome{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			small := []byte(`{"choices":[{"message":{"content":"x"}}],` + c.tail)
			big := []byte(`{"choices":[{"message":{"content":"` + text + `"}}],` + c.tail)
			if len(small) > usageScanFrom || len(big) <= usageScanFrom {
				t.Fatalf("sizes %d, %d do not straddle %d", len(small), len(big), usageScanFrom)
			}
			for _, body := range [][]byte{small, big} {
				var o affinity.Outcome
				if got := usageJSON(new(fastjson.Parser), body, &o); got != c.cached || o != c.o {
					t.Errorf("%d-byte body: cached %d timings %+v, want %d %+v", len(body), got, o, c.cached, c.o)
				}
				// usageBody: the same, and usageTokens' counts, in one parse.
				o = affinity.Outcome{}
				got, pr, co := usageBody(new(fastjson.Parser), body, &o)
				if wp, wc := usageTokens(new(fastjson.Parser), body); got != c.cached || o != c.o || pr != wp || co != wc || pr != 90 {
					t.Errorf("%d-byte body, usageBody: cached %d timings %+v tokens %d/%d, want %d %+v %d/%d (prompt 90)",
						len(body), got, o, pr, co, c.cached, c.o, wp, wc)
				}
			}
		})
	}
}

// TestStreamStepClock: a stream's events, each an engine step's output,
// teach the replica's step clock the step's length (step_seconds in
// /debug/replicas: the gaps between reads, here at least the engine's 20
// ms between events); a buffered answer teaches it nothing.
func TestStreamStepClock(t *testing.T) {
	e := startRawEngine(t)
	r := newStreamRig(t, e.addr)
	step := func() float64 {
		reps := r.s.Replicas()
		if len(reps) != 1 || reps[0].Affinity == nil {
			t.Fatalf("replicas: %+v", reps)
		}
		return reps[0].Affinity.StepSeconds
	}
	e.set(0, []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"))
	r.once(t)
	if s := step(); s != 0 {
		t.Fatalf("step %v after a buffered answer, want 0", s)
	}
	e.set(20*time.Millisecond, chunkedPieces(sseEvents(6, 0))...)
	r.once(t)
	if s := step(); s < 0.019 || s > 1 {
		t.Fatalf("step %v after events 20 ms apart, want at least 0.019 s", s)
	}
}
