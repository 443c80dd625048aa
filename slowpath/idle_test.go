package slowpath

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestIdleTimeoutConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       time.Duration
		err        string
	}{
		{name: "default", yaml: "listen: :8080", want: 60 * time.Second},
		{name: "set", yaml: "upstream:\n  idle_timeout: 5s", want: 5 * time.Second},
		{name: "zero", yaml: "upstream:\n  idle_timeout: 0s", err: "upstream.idle_timeout: must be > 0, got 0s"},
		{name: "negative", yaml: "upstream:\n  idle_timeout: -1s", err: "upstream.idle_timeout: must be > 0, got -1s"},
		{name: "misspelt", yaml: "upstream:\n  idle_timout: 5s", err: "line 2: upstream.idle_timout: unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Upstream.IdleTimeout != tc.want {
				t.Fatalf("idle_timeout %s, want %s", c.Upstream.IdleTimeout, tc.want)
			}
		})
	}
}

// BenchmarkIdleConnRead: the cost idle_timeout adds to each upstream read
// (a clock read and a deadline reset) against the bare connection, over
// loopback TCP with the writer always ahead.
func BenchmarkIdleConnRead(b *testing.B) {
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"bare", func(c net.Conn) net.Conn { return c }},
		{"idle_timeout", func(c net.Conn) net.Conn {
			ic := &idleConn{Conn: c, idle: time.Minute}
			_ = ic.SetReadDeadline(time.Now().Add(time.Hour))
			return ic
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			c := tc.wrap(raw)
			p := make([]byte, 4096)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := io.ReadFull(c, p); err != nil {
					b.Fatal(err)
				}
			}
			raw.Close()
			<-done
		})
	}
}

// TestIdleConn: before a response's first byte only the caller's deadline
// applies (an engine may queue and prefill long); after it, each read waits
// at most idle and fails with errUpstreamIdle (a net.Error timeout); a new
// request (SetReadDeadline) disarms it again; the caller's deadline still
// wins when it is earlier.
func TestIdleConn(t *testing.T) {
	const idle = 50 * time.Millisecond
	raw, step := steppedConn(t)
	c := &idleConn{Conn: raw, idle: idle}
	var err error
	p := make([]byte, 16)

	// Request 1: the first byte comes after 4 x idle: no idle error.
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(4 * idle); step <- "a" }()
	if n, err := c.Read(p); err != nil || string(p[:n]) != "a" {
		t.Fatalf("first byte: %q %v", p[:n], err)
	}
	// Then nothing: the next read gives up with errUpstreamIdle.
	_, err = c.Read(p)
	var ne net.Error
	if !errors.Is(err, errUpstreamIdle) || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("stalled read: %v, want errUpstreamIdle (a timeout)", err)
	}

	// Request 2 on the same connection: disarmed until its first byte.
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(4 * idle); step <- "b" }()
	if n, err := c.Read(p); err != nil || string(p[:n]) != "b" {
		t.Fatalf("request 2 first byte: %q %v", p[:n], err)
	}

	// Request 3: a caller's deadline earlier than now+idle wins once
	// armed, and is not reported as idle.
	// The first byte must be read within that deadline: a machine that
	// stalls past it gets the request retried (the byte waits in the
	// socket), a bounded number of times.
	c.idle = time.Hour
	step <- "c"
	for try := 1; ; try++ {
		if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		n, err := c.Read(p)
		if err == nil && string(p[:n]) == "c" {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || try == 5 {
			t.Fatalf("request 3 first byte (try %d): %q %v", try, p[:n], err)
		}
	}
	_, err = c.Read(p)
	if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errUpstreamIdle) {
		t.Fatalf("outer deadline: %v, want a plain deadline error", err)
	}
}

// steppedConn dials a loopback server that writes each string sent on
// step; closing the client and the server goroutine's exit are the test's
// cleanup.
func steppedConn(t *testing.T) (net.Conn, chan<- string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	step := make(chan string)
	srvDone := make(chan struct{})
	go func() {
		defer close(srvDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for s := range step {
			io.WriteString(c, s)
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { close(step); raw.Close(); <-srvDone; ln.Close() })
	return raw, step
}

// TestIdleConnLazyDeadline: a read deadline that moves later is kept
// lazily (the earlier one stays in force, no timer update) yet a read
// waits until the later one: a byte arriving past the earlier deadline is
// read without error; an earlier deadline applies at once; once the
// wanted deadline passes the read fails with a plain deadline error.
func TestIdleConnLazyDeadline(t *testing.T) {
	raw, step := steppedConn(t)
	c := &idleConn{Conn: raw, idle: time.Hour}
	var err error
	p := make([]byte, 16)

	early := time.Now().Add(20 * time.Millisecond)
	if err := c.SetReadDeadline(early); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !c.rd.set.Equal(early) {
		t.Fatalf("deadline in force %v, want the earlier %v kept", c.rd.set, early)
	}
	go func() { time.Sleep(100 * time.Millisecond); step <- "a" }()
	if n, err := c.Read(p); err != nil || string(p[:n]) != "a" {
		t.Fatalf("byte past the earlier deadline: %q %v", p[:n], err)
	}
	if !c.rd.set.Equal(c.rd.want) {
		t.Fatalf("after the earlier deadline fired: in force %v, wanted %v", c.rd.set, c.rd.want)
	}

	// An earlier deadline applies at once, and a later one kept lazily
	// still ends the read when it passes.
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(60 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err = c.Read(p)
	if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errUpstreamIdle) {
		t.Fatalf("read past the wanted deadline: %v, want a plain deadline error", err)
	}
	if time.Now().Before(c.rd.want) {
		t.Fatalf("read ended at the earlier deadline, before the wanted %v", c.rd.want)
	}
}
