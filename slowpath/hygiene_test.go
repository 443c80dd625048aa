package slowpath

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHTTPHygiene: the weak points of issue 15's review, each on the wire.
func TestHTTPHygiene(t *testing.T) {
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.Limits.MaxBodyBytes = 4096
	s, url := newTestServer(t, cfg)
	addr := strings.TrimPrefix(url, "http://")
	chat := func(extra ...string) string {
		return rawReq("POST /v1/chat/completions HTTP/1.1", append([]string{"Host: x", "Content-Type: application/json",
			"Content-Length: " + strconv.Itoa(len(chatBody))}, extra...), chatBody)
	}

	t.Run("405 carries Allow", func(t *testing.T) {
		for path, allow := range map[string]string{"/v1/chat/completions": "POST", "/v1/models": "GET"} {
			method := "GET"
			if allow == "GET" {
				method = "DELETE"
			}
			req, _ := http.NewRequest(method, url+path, nil)
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 405 || resp.Header.Get("Allow") != allow {
				t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", method, path, resp.StatusCode, resp.Header.Get("Allow"), allow)
			}
		}
	})

	t.Run("100-continue refused with the 413", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		// Headers only: a client waiting for 100 Continue sends no body.
		io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n") //nolint:errcheck
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 413 || !strings.Contains(string(b), `"code":"request_too_large"`) {
			t.Fatalf("got %d %s, want 413 request_too_large (and no 100 Continue first)", resp.StatusCode, b)
		}
	})

	t.Run("bare LF in the headers", func(t *testing.T) {
		raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-A: 1\nX-Smuggled: yes\r\nContent-Length: " +
			strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
		before := e.requests.Load()
		st, body, closed := rawExchange(t, addr, raw)
		if st != 400 || !strings.Contains(body, "bare LF") || !closed {
			t.Fatalf("got %d %s closed=%v, want 400 and the connection closed", st, body, closed)
		}
		if e.requests.Load() != before {
			t.Fatal("the request reached the engine")
		}
	})

	t.Run("Connection-nominated headers are not forwarded", func(t *testing.T) {
		st, body, _ := rawExchange(t, addr, chat("Connection: keep-alive, X-Hop", "X-Hop: secret", "X-Kept: yes"))
		if st != 200 {
			t.Fatalf("got %d %s", st, body)
		}
		h := e.lastHeader()
		if h.Get("X-Hop") != "" || h.Get("X-Kept") != "yes" {
			t.Fatalf("engine got X-Hop %q, X-Kept %q", h.Get("X-Hop"), h.Get("X-Kept"))
		}
	})

	t.Run("admin server bounded", func(t *testing.T) {
		a := s.admin
		if a.ReadTimeout <= 0 || a.IdleTimeout <= 0 || a.WriteTimeout <= 0 || a.ReadHeaderTimeout <= 0 {
			t.Fatalf("admin timeouts: read %v, header %v, write %v, idle %v", a.ReadTimeout, a.ReadHeaderTimeout, a.WriteTimeout, a.IdleTimeout)
		}
	})
}

// TestRetryAfter: the router's own 429 and 503 tell the client when to
// come back.
func TestRetryAfter(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	cfg := testConfig(e.addr)
	cfg.Limits.MaxInFlight = 1
	s, url := newTestServer(t, cfg)
	stream, err := testClient.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	readEvent(t, bufio.NewReader(stream.Body)) // holds the one slot
	resp, err := testClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("429: got %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	e.open()
	e.Unhealthy.Store(true)
	waitFor(t, "replica out", func() bool { return !replicaStatus(t, s, e.addr).Healthy })
	resp, err = testClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("503: got %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestForwardedHeaders: without trusted_proxies, X-Forwarded-For (every
// line of it), X-Real-IP and Forwarded from the client are replaced by the
// address the router saw; from a trusted proxy the whole chain is kept and
// the proxy's address appended. It catches a second client-sent XFF line
// surviving after the router's appended one.
func TestForwardedHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted []string
		xff     string
		realIP  string
		fwd     string
	}{
		{"untrusted client", nil, "127.0.0.1", "127.0.0.1", ""},
		{"trusted proxy", []string{"127.0.0.0/8"}, "1.2.3.4, 5.6.7.8, 127.0.0.1", "9.9.9.9", "for=1.2.3.4"},
		{"trusted by address", []string{"127.0.0.1"}, "1.2.3.4, 5.6.7.8, 127.0.0.1", "9.9.9.9", "for=1.2.3.4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startFakeEngine(t)
			cfg := testConfig(e.addr)
			cfg.TrustedProxies = tc.trusted
			_, url := newTestServer(t, cfg)
			raw := rawReq("POST /v1/chat/completions HTTP/1.1", []string{"Host: x", "Content-Type: application/json",
				"X-Forwarded-For: 1.2.3.4", "X-Real-IP: 9.9.9.9", "Forwarded: for=1.2.3.4", "X-Forwarded-For: 5.6.7.8",
				"Content-Length: " + strconv.Itoa(len(chatBody))}, chatBody)
			if st, body, _ := rawExchange(t, strings.TrimPrefix(url, "http://"), raw); st != 200 {
				t.Fatalf("got %d %s", st, body)
			}
			h := e.lastHeader()
			if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != tc.xff {
				t.Errorf("X-Forwarded-For %q, want exactly %q", got, tc.xff)
			}
			if got := h.Get("X-Real-Ip"); got != tc.realIP {
				t.Errorf("X-Real-IP %q, want %q", got, tc.realIP)
			}
			if got := h.Get("Forwarded"); got != tc.fwd {
				t.Errorf("Forwarded %q, want %q", got, tc.fwd)
			}
		})
	}
	if _, err := ParseConfig([]byte("trusted_proxies: [10.0.0.0/8, proxy.local]")); err == nil ||
		!strings.Contains(err.Error(), `line 1: trusted_proxies[1]: must be an IP address or CIDR prefix, got "proxy.local"`) {
		t.Fatalf("bad trusted_proxies entry: %v", err)
	}
}

// TestConnCapMeetsOnLimit: past upstream.max_conns_per_replica a request
// meets limits.on_limit (429, or a wait in the queue) instead of a 502 "no
// free connections".
func TestConnCapMeetsOnLimit(t *testing.T) {
	for _, onLimit := range []string{OnLimitReject, OnLimitQueue} {
		t.Run(onLimit, func(t *testing.T) {
			e := startFakeEngine(t)
			e.Gate = make(chan struct{})
			cfg := testConfig(e.addr)
			cfg.Upstream.MaxConnsPerReplica = 2
			cfg.Limits.OnLimit = onLimit
			cfg.Limits.QueueTimeout = 20 * time.Second
			_, url := newTestServer(t, cfg)
			var held []*http.Response
			for range 2 {
				resp, err := testClient.Post(url+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				readEvent(t, bufio.NewReader(resp.Body))
				held = append(held, resp)
			}
			if onLimit == OnLimitReject {
				st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
				e.open()
				for _, r := range held {
					_, _ = io.Copy(io.Discard, r.Body)
				}
				if st != 429 || !strings.Contains(body, "rate_limit_exceeded") {
					t.Fatalf("got %d %s, want 429", st, body)
				}
				return
			}
			type answer struct {
				status int
				body   string
			}
			got := make(chan answer, 1)
			go func() {
				resp, err := testClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
				if err != nil {
					got <- answer{-1, err.Error()}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got <- answer{resp.StatusCode, string(b)}
			}()
			e.open() // the held streams finish, their connections free up
			for _, r := range held {
				_, _ = io.Copy(io.Discard, r.Body)
			}
			if a := <-got; a.status != 200 {
				t.Fatalf("queued request: %d %s, want 200", a.status, a.body)
			}
		})
	}
}

// TestHTTP10Stream: an HTTP/1.0 client's stream is not chunked (it cannot
// read chunked encoding): the events come as they are, the close ends
// them (no Transfer-Encoding: chunked in an HTTP/1.0 answer).
func TestHTTP10Stream(t *testing.T) {
	e := startFakeEngine(t)
	s, url := newTestServer(t, testConfig(e.addr))
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body) //nolint:errcheck
	raw, err := io.ReadAll(c)                                                                                                                             // to the close
	if err != nil {
		t.Fatal(err)
	}
	head, payload, ok := strings.Cut(string(raw), "\r\n\r\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.0 200 OK\r\n") || strings.Contains(strings.ToLower(head), "transfer-encoding") ||
		!strings.Contains(head, "Connection: close") || !strings.Contains(head, "Content-Type: text/event-stream") {
		t.Fatalf("header:\n%s", head)
	}
	if !strings.HasPrefix(payload, "data: {") || !strings.HasSuffix(payload, "data: [DONE]\n\n") || strings.Count(payload, "data: ") != 5 {
		t.Fatalf("body not the plain event stream:\n%q", payload)
	}
	waitFor(t, "the exchange finished", func() bool { return s.inflight.Load() == 0 })
	if got := metricValue(t, s, "warmpath_slowpath_requests_total", "code", "200"); got != 1 {
		t.Fatalf("requests_total{code=200} = %v, want 1", got)
	}
}

// TestHTTP10StreamDrain: Shutdown drains an HTTP/1.0 stream too (its
// connection is hijacked, which fasthttp's own drain does not see): past
// the drain deadline the stream's connection is closed and Shutdown says so.
func TestHTTP10StreamDrain(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	s, err := New(testConfig(e.addr), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body) //nolint:errcheck
	br := bufio.NewReader(c)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(l, "data: ") {
			break // the stream is running, gated after its first event
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown returned nil with an HTTP/1.0 stream still in flight")
	}
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("the stream's connection was not closed: %v", err)
	}
	e.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the exchange finished", func() bool { return s.inflight.Load() == 0 })
}

// TestServeAfterShutdownReturns: a Serve whose goroutine runs only after
// Shutdown (a loaded machine schedules it late) returns at once and closes
// its listener, instead of accepting forever: fasthttp's shutdown closes
// only the listeners it already knows. It hung a test's cleanup for 12
// minutes under the race detector.
func TestServeAfterShutdownReturns(t *testing.T) {
	s, err := New(testConfig("127.0.0.1:1"), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = ln.Close()
		t.Fatal("Serve after Shutdown still accepting after 10 s")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts connections")
	}
}
