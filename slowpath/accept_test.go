package slowpath

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// flakyListener fails its first n Accepts with err, as accept4 does at the
// fd limit, then accepts normally.
type flakyListener struct {
	net.Listener
	n   atomic.Int32
	err error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptSurvivesEMFILE: accept errors that clear up by themselves
// (EMFILE/ENFILE at the fd limit, ECONNABORTED) do not end Serve; the
// listener backs off, counts them and then serves. fasthttp alone returns
// from Serve on them ("Permanent error when accepting"), which ended
// `warmpath serve`.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	for _, tc := range []struct {
		name   string
		errno  syscall.Errno
		reason string
	}{
		{"EMFILE", syscall.EMFILE, "emfile"},
		{"ENFILE", syscall.ENFILE, "enfile"},
		{"ECONNABORTED", syscall.ECONNABORTED, "econnaborted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startFakeEngine(t)
			s, err := New(testConfig(e.addr), testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &flakyListener{Listener: inner,
				err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", tc.errno)}}
			ln.n.Store(4)
			done := make(chan error, 1)
			go func() { done <- s.Serve(ln) }()
			code, body := post(t, "http://"+inner.Addr().String()+"/v1/chat/completions", "application/json", chatBody)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			if got := metricValue(t, s, "warmpath_slowpath_accept_errors_total", "reason", tc.reason); got != 4 {
				t.Errorf("accept_errors_total{reason=%q} = %v, want 4", tc.reason, got)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Error(err)
			}
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
}

// TestConnectionCaps: past limits.max_connections (or the per-client cap)
// a new connection is answered 503 with an OpenAI error and closed; the
// connections already open keep working, and a closed one frees its place.
func TestConnectionCaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*LimitsConfig)
		cap  string
	}{
		{"total", func(l *LimitsConfig) { l.MaxConnections = 2 }, "total"},
		{"per_client", func(l *LimitsConfig) { l.MaxConnectionsPerClient = 2 }, "per_client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startFakeEngine(t)
			cfg := testConfig(e.addr)
			tc.set(&cfg.Limits)
			s, base := newTestServer(t, cfg)
			addr := strings.TrimPrefix(base, "http://")
			var held []net.Conn
			for range 2 {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				held = append(held, c)
			}
			// The held connections work (and are surely accepted).
			for _, c := range held {
				if st := rawChat(t, c); st != http.StatusOK {
					t.Fatalf("held connection: status %d", st)
				}
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			b, _ := io.ReadAll(c) // the router closes it
			if !strings.HasPrefix(string(b), "HTTP/1.1 503 ") || !strings.Contains(string(b), `"code":"too_many_connections"`) ||
				!strings.Contains(string(b), "Retry-After: 1") {
				t.Fatalf("over the cap: got %q", b)
			}
			if got := metricValue(t, s, "warmpath_slowpath_connections_rejected_total", "cap", tc.cap); got != 1 {
				t.Errorf("connections_rejected_total{cap=%q} = %v, want 1", tc.cap, got)
			}
			held[0].Close()
			waitFor(t, "a freed place", func() bool {
				return metricValue(t, s, "warmpath_slowpath_connections", "", "") == 1
			})
			c2, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if st := rawChat(t, c2); st != http.StatusOK {
				t.Fatalf("after a close: status %d", st)
			}
		})
	}
}

// rawChat sends one chat request on c and returns the status.
func rawChat(t *testing.T, c net.Conn) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		itoa(len(chatBody))+"\r\n\r\n"+chatBody); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// metricValue sums the samples of metric name (those whose label has value
// when label is set) on s's registry.
func metricValue(t testing.TB, s *Server, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if label != "" {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == label && lp.GetValue() != value {
						continue next
					}
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}
