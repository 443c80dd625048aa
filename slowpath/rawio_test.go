//go:build linux

package slowpath

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// rawPair is a loopback TCP connection: the raw side's rawIO, and its peer.
func rawPair(t *testing.T) (*net.TCPConn, *rawIO, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); peer.Close() })
	raw := newRawIO(c)
	if raw == nil {
		t.Fatal("newRawIO: nil for a TCP connection")
	}
	return c.(*net.TCPConn), raw, peer
}

func TestRawIOReadWriteEOF(t *testing.T) {
	_, raw, peer := rawPair(t)
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 16)
	n, err := raw.read(p) // waits on the poller until the bytes arrive
	if err != nil || string(p[:n]) != "hello" {
		t.Fatalf("read = %q, %v", p[:n], err)
	}
	// A write larger than the socket buffers: the raw writer meets EAGAIN,
	// waits for room and completes while the peer drains.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
		got <- b
	}()
	if n, err := raw.write(big); err != nil || n != len(big) {
		t.Fatalf("write = %d, %v; want %d, nil", n, err, len(big))
	}
	if b := <-got; !bytes.Equal(b, big) {
		t.Fatalf("peer read %d bytes, not the %d written", len(b), len(big))
	}
	peer.Close()
	if n, err := raw.read(p); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer's close = %d, %v; want 0, io.EOF", n, err)
	}
}

func TestRawIODeadlinesAndClose(t *testing.T) {
	c, raw, _ := rawPair(t)
	p := make([]byte, 16)
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := raw.read(p)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past its deadline: %v; want a timeout (os.ErrDeadlineExceeded)", err)
	}
	// A write deadline bounds a write the peer never reads. (The buffer is
	// made first: on a loaded machine making 64 MiB can outlast the
	// deadline, and a write that starts past it writes nothing.)
	big := make([]byte, 64<<20)
	if err := c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := raw.write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= 64<<20 {
		t.Fatalf("write to a peer that does not read = %d, %v; want part of it and a timeout", n, err)
	}
	// Close from another goroutine ends a read waiting on the poller.
	_ = c.SetReadDeadline(time.Time{})
	done := make(chan error)
	go func() { _, err := raw.read(p); done <- err }()
	time.Sleep(10 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read on a closed connection: %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting raw read")
	}
}

func TestRawIOResetIsECONNRESET(t *testing.T) {
	_, raw, peer := rawPair(t)
	// Unread data at close makes the peer send a RST.
	if _, err := raw.write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	peer.(*net.TCPConn).SetLinger(0)
	peer.Close()
	time.Sleep(10 * time.Millisecond)
	_, err := raw.read(make([]byte, 16))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset: %v; want ECONNRESET", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "read" {
		t.Fatalf("read error %T %v; want a *net.OpError for read, as net's", err, err)
	}
	// Writing to the reset connection fails with an error (EPIPE), no signal.
	if _, err := raw.write([]byte("more")); !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write after a reset: %v; want EPIPE or ECONNRESET", err)
	}
}

// TestRawIOPeerClosed: peerClosed says closed for a FIN or a reset waiting
// (and a closed socket), open for a quiet or a talking peer, and consumes
// nothing: the bytes a peer sent are still there to read.
func TestRawIOPeerClosed(t *testing.T) {
	c, raw, peer := rawPair(t)
	if raw.peerClosed() {
		t.Fatal("quiet open connection reads as closed")
	}
	if _, err := peer.Write([]byte("ticket")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bytes to arrive", func() bool {
		n, err := unix.IoctlGetInt(sysfd(t, c), unix.SIOCINQ)
		return err == nil && n == len("ticket")
	})
	if raw.peerClosed() {
		t.Fatal("a peer's unread bytes read as a close")
	}
	if p := make([]byte, 16); func() bool { n, err := raw.read(p); return err != nil || string(p[:n]) != "ticket" }() {
		t.Fatal("peerClosed consumed the peer's bytes")
	}
	// Half-closed (FIN), the socket left open, as llama.cpp's server leaves it.
	if err := peer.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the FIN", raw.peerClosed)

	// A reset waiting.
	_, raw2, peer2 := rawPair(t)
	if _, err := raw2.write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bytes at the peer", func() bool {
		n, err := unix.IoctlGetInt(sysfd(t, peer2.(*net.TCPConn)), unix.SIOCINQ)
		return err == nil && n == len("unread")
	})
	peer2.(*net.TCPConn).SetLinger(0)
	peer2.Close()
	waitFor(t, "the reset", raw2.peerClosed)

	if n := testing.AllocsPerRun(100, func() { raw2.peerClosed() }); n != 0 {
		t.Errorf("peerClosed allocates %v times per call, want 0 (it runs per reused connection)", n)
	}

	// Our own side closed.
	c3, raw3, _ := rawPair(t)
	c3.Close()
	if !raw3.peerClosed() {
		t.Fatal("a closed connection reads as open")
	}
}

// sysfd is c's socket descriptor (for ioctls; c stays usable).
func sysfd(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

func TestRawIOOnlyForTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if newRawIO(a) != nil {
		t.Fatal("newRawIO gave a raw writer for a net.Pipe")
	}
}

// TestRawIOWrappersUseIt checks that the API listener's and the upstream
// dialer's connections read and write through rawIO.
func TestRawIOWrappersUseIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{}
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}
	}()
	c, err := s.upstreamDialer(time.Second, time.Minute)(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ic := c.(*idleConn)
	if ic.raw == nil {
		t.Fatal("upstream connection without rawIO")
	}
	if _, err := ic.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 4)
	if _, err := io.ReadFull(ic, p); err != nil || string(p) != "ping" {
		t.Fatalf("echo = %q, %v", p, err)
	}
	l := &connListener{stall: time.Minute, clients: map[netip.Addr]int{}, m: newConnMetrics(prometheus.NewRegistry())}
	sc := l.admit(ic.Conn).(*stallConn)
	if sc.raw == nil {
		t.Fatal("accepted connection without rawIO")
	}
	l.open.Add(-1) // sc is not closed here: ic owns the socket
}

// TestRawIOSession: inside a read session a read that would block returns
// errWouldBlock, the session waits on the poller and calls f again when
// bytes arrive (or the peer's FIN: io.EOF), and a deadline ends the wait
// with a timeout.
func TestRawIOSession(t *testing.T) {
	c, raw, peer := rawPair(t)
	if _, err := peer.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	calls := 0
	p := make([]byte, 16)
	err := raw.session(func() bool {
		calls++
		for {
			n, err := raw.read(p)
			got = append(got, p[:n]...)
			switch {
			case err == errWouldBlock:
				if calls == 1 {
					go peer.Write([]byte("b")) // after the wait begins, or before: either wakes it
				}
				return false
			case err != nil:
				t.Errorf("read in a session: %v", err)
				return true
			case len(got) == 2:
				return true
			}
		}
	})
	if err != nil || string(got) != "ab" || calls < 2 {
		t.Fatalf("session = %v, read %q in %d calls; want nil, \"ab\", at least 2 calls", err, got, calls)
	}
	if raw.inSession {
		t.Fatal("still in the session after it ended")
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	err = raw.session(func() bool {
		_, err := raw.read(p)
		return err != errWouldBlock
	})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("session past its deadline: %v; want a timeout", err)
	}
	// Outside a session, read waits as net.Conn's does.
	_ = c.SetReadDeadline(time.Time{})
	go peer.Write([]byte("c"))
	if n, err := raw.read(p); err != nil || string(p[:n]) != "c" {
		t.Fatalf("read after sessions = %q, %v", p[:n], err)
	}
	// Bytes and the FIN arriving together: the read after the bytes sees
	// the end (a session that waited on a short read would hang here).
	if _, err := peer.Write([]byte("z")); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	time.Sleep(10 * time.Millisecond) // both arrived before the session reads
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got = got[:0]
	var end error
	err = raw.session(func() bool {
		for {
			n, err := raw.read(p)
			got = append(got, p[:n]...)
			switch {
			case err == errWouldBlock:
				return false
			case err != nil:
				end = err
				return true
			}
		}
	})
	if err != nil || end != io.EOF || string(got) != "z" {
		t.Fatalf("session over bytes and a FIN = %v, end %v, read %q; want nil, io.EOF, \"z\"", err, end, got)
	}
}

// TestRawIOAllocs: a read session, a read and a write allocate nothing
// (each runs per request, the reads and writes per streamed event too).
func TestRawIOAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates by itself")
	}
	_, raw, peer := rawPair(t)
	p, q := make([]byte, 1), make([]byte, 1)
	msg := []byte("x")
	step := func() bool {
		_, err := raw.read(p)
		return err != errWouldBlock
	}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if err := raw.session(step); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, q); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.read(p); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per session, read and write; want 0", allocs)
	}
}

// TestFirstByteAfterEmptyFlush: when the whole request went out before the
// first-byte session (a body larger than the writer's buffer is written
// directly, leaving the writer empty) and the answer arrived before the
// session began, the session reads it at once. Waiting on the poller after
// an empty flush would miss it: the session clears the readiness the
// answer raised, and no new one comes, so the wait would end only at its
// deadline (here the test's 5 s bound; in the proxy the 100 ms client
// poll, once per such request).
func TestFirstByteAfterEmptyFlush(t *testing.T) {
	c, raw, peer := rawPair(t)
	ic := &idleConn{Conn: c, raw: raw}
	ic.laddr = idleAddr{Addr: c.LocalAddr(), c: ic}
	ic.fb.fn = ic.firstByteStep
	br := bufio.NewReader(ic)
	flush := bufio.NewWriter(ic) // the request is out: nothing buffered
	if _, err := peer.Write([]byte("HTTP/1.1 200 OK\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the answer is in, its readiness seen by the poller
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	left, werr, err := firstByteSession(ic, br, flush)
	if werr != nil || err != nil || left != nil {
		t.Fatalf("firstByteSession = %v, %v (left %v); want the answer's first byte", werr, err, left != nil)
	}
	if b, _ := br.Peek(1); len(b) != 1 || b[0] != 'H' {
		t.Fatalf("buffered %q, want the answer", b)
	}
}
