package slowpath

import (
	"bufio"
	"errors"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

// errUpstreamIdle is the read error of an upstream connection that sent no
// byte for upstream.idle_timeout after its response had begun.
var errUpstreamIdle = idleError{}

type idleError struct{}

func (idleError) Error() string   { return "upstream sent nothing for upstream.idle_timeout" }
func (idleError) Timeout() bool   { return true }
func (idleError) Temporary() bool { return false }
func (idleError) Unwrap() error   { return os.ErrDeadlineExceeded }

var _ net.Error = idleError{}

// idleConn bounds the wait for each next byte of an upstream response once
// it is producing output: every Read moves the read deadline to now+idle,
// never past the deadline fasthttp set for the whole response
// (upstream.response_timeout). Before that only the outer deadline applies
// (the engine may queue and prefill a long time), so the
// retry-before-first-byte logic is unchanged.
//
// "Producing output" is the first byte for a buffered (JSON) response,
// which engines send whole. A stream's headers (and, from some servers, a
// role chunk) come at once, before queueing and prefill: the proxy holds the
// idle timer (hold) as soon as it has the stream's headers and starts it
// (release) at the stream's first token. The proxy finds the connection
// through the response's LocalAddr, which is the connection's idleAddr.
//
// fasthttp sets the read deadline once per request, after writing it, from
// the goroutine that then reads the response; the body stream is read by
// one goroutine at a time (handed over through fasthttp's pool), the one
// that holds and releases. No locks.
//
// The idle deadline is moved only when it would move by more than idle/16,
// so most reads of a steady stream cost a clock read; the timeout then
// fires after between 15/16 and all of idle without a byte.
//
// A deadline that moves later is not applied at once (lazyDeadline): the
// one in force stays, earlier than the one wanted, and a read it times
// out moves it and reads again. Each move is a runtime timer
// update (~0.2 µs here), and every request moves the read deadline three
// times (the client poll, the response timeout, idle), nearly always
// later; kept lazily, a busy connection's timer moves about once per
// clientPoll instead. A timeout still fires exactly at want: the deadline
// in force is never later.
type idleConn struct {
	net.Conn
	idle     time.Duration
	deadline time.Time    // the caller's read deadline (zero: none)
	rd       lazyDeadline // want: the caller's deadline, or the idle one when earlier
	armed    bool         // a byte of the current response arrived
	fresh    bool         // a byte arrived since the idle deadline was last moved
	held     bool         // a stream before its first token: idle not applied
	byIdle   bool         // want is the idle deadline
	laddr    idleAddr     // LocalAddr: leads the proxy back to this connection
	wset     time.Time    // the write deadline in force (zero: none)
	raw      *rawIO       // the socket's raw reads and writes; nil: Conn's own
	fb       firstByteState
}

// firstByteState is firstByteSession's state, kept with the connection
// with its session function bound once, so a wait allocates nothing.
type firstByteState struct {
	br        *bufio.Reader
	flush     *bufio.Writer
	werr, err error
	fn        func() bool // idleConn.firstByteStep
}

// firstByteStep is one step of firstByteSession's read session: the
// request's flush, then a peek for the answer's first byte. Only a flush
// that wrote the request's last bytes lets the session wait without a
// peek: the answer's readiness then comes after the session cleared the
// old one. A writer with nothing buffered (a body larger than its buffer
// went out whole before the session) is no such sign: the answer may have
// arrived, its readiness cleared, and a wait would last until the poll
// deadline (TestFirstByteAfterEmptyFlush).
func (c *idleConn) firstByteStep() bool {
	fb := &c.fb
	if w := fb.flush; w != nil {
		fb.flush = nil
		if w.Buffered() > 0 {
			fb.werr = w.Flush()
			return fb.werr != nil
		}
	}
	_, fb.err = fb.br.Peek(1)
	return fb.err != errWouldBlock
}

// idleAddr is an idleConn's local address, carrying the connection.
type idleAddr struct {
	net.Addr
	c *idleConn
}

// LocalAddr returns the connection's local address as an *idleAddr.
func (c *idleConn) LocalAddr() net.Addr { return &c.laddr }

// idleOf returns the idleConn behind a response's LocalAddr, or nil.
func idleOf(a net.Addr) *idleConn {
	if ia, ok := a.(*idleAddr); ok {
		return ia.c
	}
	return nil
}

// earlierDeadline reports whether deadline a comes before b (zero: never).
func earlierDeadline(a, b time.Time) bool {
	return !a.IsZero() && (b.IsZero() || a.Before(b))
}

// lazyDeadline keeps a connection's read deadline lazily: a deadline that
// moves later is only recorded (want), the one in force (set) stays, and a
// read it times out moves it (retry) before reading again. A timeout still
// comes exactly at want: the deadline in force is never later. Used by one
// goroutine at a time, as the connection's reads are.
type lazyDeadline struct {
	want time.Time // the read deadline wanted (zero: none)
	set  time.Time // the read deadline in force, never later than want (zero: none)
}

// move makes t the wanted read deadline of c; c's moves only when t is
// earlier than the one in force.
func (d *lazyDeadline) move(c net.Conn, t time.Time) error {
	d.want = t
	if !earlierDeadline(t, d.set) {
		return nil
	}
	d.set = t
	return c.SetReadDeadline(t)
}

// force sets t as both the wanted deadline and the one in force (c's
// deadline was set to t by other means).
func (d *lazyDeadline) force(t time.Time) { d.want, d.set = t, t }

// retry reports whether a read of c that failed with err (and no byte)
// timed out at a deadline earlier than the wanted one, which has not
// passed: then the wanted one is applied and the read is to be repeated.
func (d *lazyDeadline) retry(c net.Conn, n int, err error) (bool, error) {
	if n != 0 || err == nil || d.set.Equal(d.want) || !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, nil
	}
	if !d.want.IsZero() && !time.Now().Before(d.want) {
		return false, nil
	}
	d.set = d.want
	return true, c.SetReadDeadline(d.want)
}

// read reads c (through raw when set, connRead) into p, re-arming a deadline that timed out before the one
// wanted (retry) and reading again, until a read returns what it should.
func (d *lazyDeadline) read(c net.Conn, raw *rawIO, p []byte) (int, error) {
	n, err := connRead(c, raw, p)
	for {
		again, serr := d.retry(c, n, err)
		if serr != nil {
			return 0, serr
		}
		if !again {
			return n, err
		}
		n, err = connRead(c, raw, p)
	}
}

// wantDeadline makes t the wanted read deadline (lazyDeadline.move).
func (c *idleConn) wantDeadline(t time.Time) error { return c.rd.move(c.Conn, t) }

// hold stops applying idle to the current response until release (a
// stream whose headers arrived before its first token): the deadline
// wanted goes back to the caller's.
func (c *idleConn) hold() error {
	c.held, c.armed = true, false
	if c.byIdle {
		c.byIdle = false
		return c.wantDeadline(c.deadline)
	}
	return nil
}

// release applies idle from the next Read on (the stream's first token).
func (c *idleConn) release() { c.held, c.armed, c.fresh = false, true, true }

// SetReadDeadline records the caller's deadline; fasthttp calls it for every
// request, so it also marks the start of a new response.
func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.deadline, c.armed, c.held, c.byIdle = t, false, false, false
	return c.wantDeadline(t)
}

// SetDeadline is SetReadDeadline and the write deadline at once.
func (c *idleConn) SetDeadline(t time.Time) error {
	c.deadline, c.armed, c.held, c.byIdle = t, false, false, false
	c.rd.force(t)
	c.wset = t
	return c.Conn.SetDeadline(t)
}

// SetWriteDeadline sets the write deadline and records it for
// setWriteDeadline.
func (c *idleConn) SetWriteDeadline(t time.Time) error {
	c.wset = t
	return c.Conn.SetWriteDeadline(t)
}

// setWriteDeadline bounds a request's write to an upstream connection by d
// from now. On an idleConn the deadline moves only when it would move by
// more than d/16 (each move is a runtime timer update): a write then has
// between 15/16 of d and d.
func setWriteDeadline(conn net.Conn, now time.Time, d time.Duration) error {
	t := now.Add(d)
	c, ok := conn.(*idleConn)
	if !ok {
		return conn.SetWriteDeadline(t)
	}
	if !c.wset.IsZero() && !t.Before(c.wset) && t.Sub(c.wset) <= d>>4 {
		return nil
	}
	return c.SetWriteDeadline(t)
}

func (c *idleConn) Read(p []byte) (int, error) {
	if c.armed && c.fresh {
		// Only a byte moves the idle deadline: a read that finds nothing
		// (a relay's read session woken early) leaves it running.
		c.fresh = false
		d := time.Now().Add(c.idle)
		byIdle := c.deadline.IsZero() || d.Before(c.deadline)
		if !byIdle {
			d = c.deadline
		}
		if byIdle != c.byIdle || d.Sub(c.rd.want) > c.idle>>4 {
			c.byIdle = byIdle
			if err := c.wantDeadline(d); err != nil {
				return 0, err
			}
		}
	}
	n, err := c.rd.read(c.Conn, c.raw, p)
	if n > 0 && !c.held {
		c.armed, c.fresh = true, true
	}
	if err != nil && c.byIdle && errors.Is(err, os.ErrDeadlineExceeded) {
		err = errUpstreamIdle
	}
	return n, err
}

// upstreamDialer is dialer with every connection wrapped in an idleConn.
func (s *Server) upstreamDialer(timeout, idle time.Duration) fasthttp.DialFunc {
	dial := s.dialer(timeout)
	return func(addr string) (net.Conn, error) {
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		ic := &idleConn{Conn: c, idle: idle, raw: newRawIO(c)}
		ic.laddr = idleAddr{Addr: c.LocalAddr(), c: ic}
		ic.fb.fn = ic.firstByteStep
		return ic, nil
	}
}

// Write writes through raw when set (rawio_linux.go).
func (c *idleConn) Write(p []byte) (int, error) { return connWrite(c.Conn, c.raw, p) }
