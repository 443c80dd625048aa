package slowpath

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// decoy is a loopback listener that is not a replica: every connection it
// accepts is the router connecting somewhere it must not (an open proxy).
type decoy struct {
	ln       net.Listener
	accepted atomic.Int64
}

func startDecoy(t *testing.T) *decoy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &decoy{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return d
}

// rawRequest writes raw bytes to a fresh connection to addr and reads one
// HTTP response (the client library would refuse to send most of these).
// The connection is closed afterwards.

// TestHTTPAbuse sends hostile and broken requests over a real loopback
// socket, raw where a client library would refuse. Each row gets a defined
// status and body; meanwhile another client's stream completes intact, and
// the router never connects anywhere but its replica (a decoy listener whose
// address the tricks use counts connections).
func TestHTTPAbuse(t *testing.T) {
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.Limits.MaxBodyBytes = 1 << 20
	cfg.Limits.ReadTimeout = 500 * time.Millisecond
	e.Gate = make(chan struct{})
	_, url := newTestServer(t, cfg)
	addr := strings.TrimPrefix(url, "http://")
	d := startDecoy(t)
	evil := d.ln.Addr().String()

	stream, err := testClient.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	sbr := bufio.NewReader(stream.Body)
	readEvent(t, sbr)

	const (
		proxied   = "" // the engine's answer: forwarded
		malformed = `{"error":{"message":"Malformed HTTP request.","type":"invalid_request_error","param":null,"code":null}}`
		tooDeep   = `{"error":{"message":"We could not parse the JSON body of your request: the body nests deeper than 300 levels at line 1, column %d (byte offset %d).","type":"invalid_request_error","param":null,"code":null}}`
	)
	post := func(target string, hdrs []string, body string) string {
		return rawReq("POST "+target+" HTTP/1.1", append([]string{"Host: x", "Content-Type: application/json", "Content-Length: " + fmt.Sprint(len(body))}, hdrs...), body)
	}
	cl := fmt.Sprint(len(chatBody))
	smuggled := "0\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + cl + "\r\n\r\n" + chatBody
	many := `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"hello there"},`, 9999) + `{"role":"user","content":"x"}]}`
	tests := []struct {
		name, raw string
		status    int
		want      string // exact body; proxied = the engine's answer
		closes    bool   // the router must close the connection after answering
	}{
		// Smuggling: Transfer-Encoding wins over Content-Length (RFC 9112
		// 6.3); the smuggled request inside the CL-framed body is never run
		// and the connection is closed after the answer.
		{"CL and TE, smuggled request", rawReq("POST /v1/chat/completions HTTP/1.1",
			[]string{"Host: x", "Content-Type: application/json", "Content-Length: " + fmt.Sprint(len(smuggled)), "Transfer-Encoding: chunked"}, smuggled),
			400, `{"error":{"message":"We could not parse the JSON body of your request: the body is empty.","type":"invalid_request_error","param":null,"code":null}}`, true},
		{"TE and short CL", rawReq("POST /v1/chat/completions HTTP/1.1",
			[]string{"Host: x", "Transfer-Encoding: chunked", "Content-Length: 3"}, fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(chatBody), chatBody)),
			200, proxied, true},
		{"two Content-Lengths", rawReq("POST /v1/chat/completions HTTP/1.1",
			[]string{"Host: x", "Content-Length: " + cl, "Content-Length: 5"}, chatBody), 400, malformed, true},
		{"unknown Transfer-Encoding", rawReq("POST /v1/chat/completions HTTP/1.1",
			[]string{"Host: x", "Transfer-Encoding: xchunked", "Content-Length: " + cl}, chatBody), 400, malformed, true},
		{"headers too large", post("/v1/chat/completions", []string{"X-Big: " + strings.Repeat("b", 20000)}, chatBody), 431,
			`{"error":{"message":"Request line and headers exceed 16384 bytes.","type":"invalid_request_error","param":null,"code":"headers_too_large"}}`, true},
		{"body too large (declared)", rawReq("POST /v1/chat/completions HTTP/1.1",
			[]string{"Host: x", "Content-Length: " + fmt.Sprint(1<<20+1)}, ""), 413,
			`{"error":{"message":"Request body exceeds the limit of 1048576 bytes.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`, true},
		{"body too large (chunked)", rawReq("POST /v1/chat/completions HTTP/1.1",
			[]string{"Host: x", "Transfer-Encoding: chunked"}, fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", 1<<20+1, strings.Repeat("x", 1<<20+1))), 413,
			`{"error":{"message":"Request body exceeds the limit of 1048576 bytes.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`, true},
		// Open-proxy tricks: the authority is ignored, the request goes to
		// the configured replica (the decoy must see no connection).
		{"absolute URI to another host", rawReq("POST http://"+evil+"/v1/chat/completions HTTP/1.1", []string{"Host: " + evil, "Content-Type: application/json", "Content-Length: " + cl}, chatBody), 200, proxied, false},
		{"Host header of another host", rawReq("POST /v1/chat/completions HTTP/1.1", []string{"Host: " + evil, "Content-Type: application/json", "Content-Length: " + cl}, chatBody), 200, proxied, false},
		{"absolute URI, unknown path", rawReq("GET http://"+evil+"/ HTTP/1.1", []string{"Host: " + evil}, ""), 404,
			`{"error":{"message":"Invalid URL (GET /)","type":"invalid_request_error","param":null,"code":"unknown_url"}}`, false},
		{"CONNECT", rawReq("CONNECT "+evil+" HTTP/1.1", []string{"Host: " + evil}, ""), 404,
			`{"error":{"message":"Invalid URL (CONNECT /` + evil + `)","type":"invalid_request_error","param":null,"code":"unknown_url"}}`, false},
		// Bodies: the parser never recurses or trusts lengths.
		{"invalid UTF-8 in content", post("/v1/chat/completions", nil, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc3\"}]}"), 200, proxied, false},
		{"100k nested arrays", post("/v1/chat/completions", nil, strings.Repeat("[", 100000)), 400, fmt.Sprintf(tooDeep, 301, 300), false},
		{"100k nested arrays as messages", post("/v1/chat/completions", nil, `{"model":"m","messages":`+strings.Repeat("[", 100000)+`]}`), 400, fmt.Sprintf(tooDeep, 324, 323), false},
		{"100k nested objects in content", post("/v1/chat/completions", nil, `{"model":"m","messages":[{"role":"user","content":`+strings.Repeat(`{"a":`, 100000)+`1`+strings.Repeat("}", 100000)+`}]}`), 400, fmt.Sprintf(tooDeep, 1536, 1535), false},
		{"10,000 messages", post("/v1/chat/completions", nil, many), 200, proxied, false},
		{"max_tokens 1e12", post("/v1/chat/completions", nil, `{"model":"m","max_tokens":1e12,"messages":[{"role":"user","content":"x"}]}`), 200, proxied, false},
		{"unknown model", post("/v1/chat/completions", nil, `{"model":"`+evil+`","messages":[{"role":"user","content":"x"}]}`), 404,
			"{\"error\":{\"message\":\"The model `" + evil + "` does not exist or you do not have access to it.\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.requests.Load()
			st, body, closed := rawExchange(t, addr, tc.raw)
			if st != tc.status {
				t.Fatalf("status %d, want %d: %s", st, tc.status, body)
			}
			if tc.want == proxied {
				if !strings.HasPrefix(body, `{"id":"x"`) || e.requests.Load() != before+1 {
					t.Fatalf("not proxied exactly once: %s", body)
				}
				// The replica always sees its own address as Host, also for
				// an absolute-form request line naming another authority.
				if h := e.lastHeader().Get("Host"); h != e.addr {
					t.Errorf("engine saw Host %q, want the replica's %q", h, e.addr)
				}
			} else {
				if body != tc.want {
					t.Fatalf("body\n%s\nwant\n%s", body, tc.want)
				}
				if e.requests.Load() != before {
					t.Fatalf("the engine saw this request")
				}
			}
			if closed != tc.closes {
				t.Fatalf("connection closed after the answer: %v, want %v", closed, tc.closes)
			}
		})
	}

	// Slowloris: a request trickled one byte every 20 ms, never finished.
	// read_timeout (500 ms here) answers 408 and closes; bounded at 500 bytes.
	for _, sl := range []struct{ name, head, drip string }{
		{"slowloris headers", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", "X-Slow: aaaaaaaa"},
		{"slowloris body", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", `{"model":"m",   `},
	} {
		t.Run(sl.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // hang guard
			if _, err := io.WriteString(c, sl.head); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			trickled := make(chan int)
			go func() {
				n := 0
				defer func() { trickled <- n }()
				for ; n < 500; n++ {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					if _, err := c.Write([]byte{sl.drip[n%len(sl.drip)]}); err != nil {
						return
					}
				}
			}()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			close(stop)
			n := <-trickled
			if err != nil {
				t.Fatalf("no answer to a trickled request (after %d bytes): %v", n, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 408 || string(b) != `{"error":{"message":"Timed out reading the request.","type":"invalid_request_error","param":null,"code":null}}` {
				t.Fatalf("got %d %s", resp.StatusCode, b)
			}
			if n >= 500 {
				t.Fatalf("the router kept reading the trickle for all %d bytes", n)
			}
		})
	}

	if n := d.accepted.Load(); n != 0 {
		t.Fatalf("the decoy accepted %d connections: the router connected somewhere that is not a replica", n)
	}
	e.open()
	n := 1
	for readEvent(t, sbr) != "[DONE]" {
		n++
	}
	if n != 4 {
		t.Fatalf("the concurrent stream had %d events, want 4", n)
	}
}

// rawReq builds a request from its line, headers and body.
func rawReq(line string, headers []string, body string) string {
	var b strings.Builder
	b.WriteString(line + "\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.String()
}

// rawExchange writes raw to a fresh connection, reads one response and
// reports whether the router then closed the connection (a second read hits
// EOF) rather than keeping it alive for a next request.
func rawExchange(t *testing.T, addr, raw string) (status int, body string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // hang guard
	go io.WriteString(c, raw)                           //nolint:errcheck // the router may answer (and close) before reading it all
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	// An open keep-alive connection stays silent; a closed one gives EOF.
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = br.ReadByte()
	var ne net.Error
	closed = !(errors.As(err, &ne) && ne.Timeout())
	return resp.StatusCode, string(b), closed
}
