package slowpath

import (
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
// its first byte has arrived: every Read moves the read deadline to
// now+idle, never past the deadline fasthttp set for the whole response
// (upstream.response_timeout). Before the first byte only that outer
// deadline applies (the engine may queue and prefill a long time), so the
// retry-before-first-byte logic is unchanged.
//
// fasthttp sets the read deadline once per request, after writing it, from
// the goroutine that then reads the response; the body stream is read by
// one goroutine at a time (handed over through fasthttp's pool). No locks.
//
// The deadline is moved only when it would move by more than idle/16, so
// most reads of a steady stream cost a clock read and no timer update; the
// timeout then fires after between 15/16 and all of idle without a byte.
type idleConn struct {
	net.Conn
	idle     time.Duration
	deadline time.Time // the caller's read deadline (zero: none)
	set      time.Time // the read deadline in force
	armed    bool      // a byte of the current response arrived
	byIdle   bool      // the deadline in force is the idle one
}

// SetReadDeadline records the caller's deadline; fasthttp calls it for every
// request, so it also marks the start of a new response.
func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.deadline, c.set, c.armed, c.byIdle = t, t, false, false
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline and the write deadline at once.
func (c *idleConn) SetDeadline(t time.Time) error {
	c.deadline, c.set, c.armed, c.byIdle = t, t, false, false
	return c.Conn.SetDeadline(t)
}

func (c *idleConn) Read(p []byte) (int, error) {
	if c.armed {
		d := time.Now().Add(c.idle)
		byIdle := c.deadline.IsZero() || d.Before(c.deadline)
		if !byIdle {
			d = c.deadline
		}
		if byIdle != c.byIdle || d.Sub(c.set) > c.idle>>4 {
			if err := c.Conn.SetReadDeadline(d); err != nil {
				return 0, err
			}
			c.set, c.byIdle = d, byIdle
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.armed = true
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
		return &idleConn{Conn: c, idle: idle}, nil
	}
}
