package slowpath

import (
	"bufio"
	"errors"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

// The proxy sends each attempt itself over the replica's connection pool
// (HostClient's AcquireConn/ReleaseConn) instead of HostClient.Do, for two
// things Do cannot give:
//
//   - while it waits for the engine's first byte (a non-streamed answer
//     comes whole after the generation; a busy engine may queue a stream
//     before its headers) it checks every clientPoll that the client is
//     still connected; when the client is gone it closes the upstream
//     connection, so the engine sees the request cancelled and frees its
//     slot, instead of generating for nobody until response_timeout;
//   - it knows whether any byte of a response arrived, which decides
//     whether a failed attempt may be retried.
//
// A stream's connection stays with the exchange (upConn) until
// CloseWithError: pooled again when the stream was read to its end,
// closed otherwise (the engine then cancels the generation).

// errClientGone: the client closed its connection before the answer began.
var errClientGone = errors.New("client closed its connection before the answer began")

// clientPoll is how often a wait for an engine's first byte checks that the
// client is still there: the bound on how long an abandoned request keeps
// an engine generating.
const clientPoll = 100 * time.Millisecond

// upConn is an exchange's upstream connection, held from the attempt to the
// end of its stream. cc is HostClient's *clientConn (unexported: kept as
// any and handed back through withConn).
type upConn struct {
	hc   *fasthttp.HostClient
	cc   any
	br   *bufio.Reader
	conn net.Conn // what br reads: an *idleConn, unless TLS wraps it
}

// withConn calls f (a HostClient method taking its connection type) with
// cc; the type is inferred from f, never spelled.
func withConn[C any](f func(C), cc any) { f(cc.(C)) }

// release gives the connection back to the pool when reuse is set, else
// closes it; idempotent.
func (u *upConn) release(reuse bool) {
	if u.hc == nil {
		return
	}
	u.hc.ReleaseReader(u.br)
	if reuse {
		withConn(u.hc.ReleaseConn, u.cc)
	} else {
		withConn(u.hc.CloseConn, u.cc)
	}
	*u = upConn{}
}

// attempt sends ureq to r and reads the answer into uresp: the whole body,
// bounded by limits.max_response_bytes, or, for a stream (uresp.StreamBody),
// the headers, the body left to read through uresp.BodyStream() on the
// connection then held in ex.up. started reports whether any byte of a
// response arrived.
func (s *Server) attempt(ctx *fasthttp.RequestCtx, ex *exchange, r *replica, ureq *fasthttp.Request, uresp *fasthttp.Response) (started bool, err error) {
	stream := uresp.StreamBody
	for try := 1; ; try++ {
		var stale bool
		started, stale, err = s.attemptOnce(ctx, ex, r.hc, ureq, uresp)
		if err == nil || !stale || try >= staleRetries {
			return started, err
		}
		// A pooled keep-alive connection the engine had closed (its idle
		// timeout): nothing was read, try a fresh one.
		uresp.Reset()
		uresp.StreamBody = stream
	}
}

func (s *Server) attemptOnce(ctx *fasthttp.RequestCtx, ex *exchange, hc *fasthttp.HostClient, ureq *fasthttp.Request, uresp *fasthttp.Response) (started, stale bool, err error) {
	cc, err := hc.AcquireConn(0, false)
	if err != nil {
		return false, false, err
	}
	conn := cc.Conn()
	reused := !cc.LastUseTime().IsZero()
	if reused {
		// A pooled connection the engine has closed since (rawIO.peerClosed):
		// a fresh one at once, not a request that waits out the client poll.
		if ic := idleOf(conn.LocalAddr()); ic != nil && ic.raw != nil && ic.raw.peerClosed() {
			hc.CloseConn(cc)
			return false, true, fasthttp.ErrConnectionClosed
		}
	}
	uresp.ParseNetConn(conn)
	now := time.Now()
	// On a raw upstream connection the request's last bytes are written
	// inside the read session that waits for the answer (awaitFirstByte).
	var bw, flush *bufio.Writer
	if err = setWriteDeadline(conn, now, hc.WriteTimeout); err == nil {
		bw = hc.AcquireWriter(conn)
		if err = ureq.Write(bw); err == nil {
			if ic, ok := conn.(*idleConn); ok && ic.raw != nil {
				flush = bw
			} else {
				err = bw.Flush()
			}
		}
	}
	if err != nil {
		if bw != nil {
			hc.ReleaseWriter(bw)
		}
		hc.CloseConn(cc)
		return false, reused && isStaleConn(err), err
	}
	if flush == nil {
		hc.ReleaseWriter(bw)
	}
	deadline := now.Add(s.conf().Upstream.ResponseTimeout)
	br := hc.AcquireReader(conn)
	err = awaitFirstByte(ctx, conn, br, flush, now, deadline)
	if flush != nil {
		hc.ReleaseWriter(bw)
	}
	if err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return false, reused && isStaleConn(err), err
	}
	if err = conn.SetReadDeadline(deadline); err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return true, false, err
	}
	if ic := idleOf(conn.LocalAddr()); ic != nil && !uresp.StreamBody {
		ic.release() // a buffered answer produces output from its first byte
	}
	uresp.Header.DisableNormalizing()
	if err = uresp.ReadLimitBody(br, s.conf().Limits.MaxResponseBytes); err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		if x, ok := err.(interface{ Timeout() bool }); ok && x.Timeout() && !errors.Is(err, errUpstreamIdle) {
			err = fasthttp.ErrTimeout
		}
		return true, false, err
	}
	if uresp.StreamBody && uresp.BodyStream() != nil {
		ex.up = upConn{hc: hc, cc: cc, br: br, conn: conn}
		return true, false, nil
	}
	hc.ReleaseReader(br)
	if ureq.ConnectionClose() || uresp.ConnectionClose() {
		hc.CloseConn(cc)
	} else {
		hc.ReleaseConn(cc)
	}
	return true, false, nil
}

// awaitFirstByte waits until br has a byte, the deadline passes
// (fasthttp.ErrTimeout) or the client of ctx is gone (errClientGone). now
// is the time the request was sent (a clock read costs ~0.2 µs on a VM).
// flush, when set, holds the end of the request, not yet written: conn is
// then an *idleConn with raw I/O (firstByteSession).
func awaitFirstByte(ctx *fasthttp.RequestCtx, conn net.Conn, br *bufio.Reader, flush *bufio.Writer, now, deadline time.Time) error {
	for first := true; ; first = false {
		if !first {
			now = time.Now()
		}
		if !now.Before(deadline) {
			return fasthttp.ErrTimeout
		}
		if err := conn.SetReadDeadline(earlier(deadline, now.Add(clientPoll))); err != nil {
			return err
		}
		var err error
		if flush != nil {
			var werr error
			if flush, werr, err = firstByteSession(conn.(*idleConn), br, flush); werr != nil {
				return werr // the request did not go out: never a wait's timeout
			}
		} else {
			_, err = br.Peek(1)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if clientGone(ctx.Conn()) {
			return errClientGone
		}
	}
}

// firstByteSession waits for br's first byte in a read session of ic
// (rawIO.session), flushing flush first: the answer cannot arrive before
// the request, so the session waits on the poller straight after the
// write, without the read that would only learn EAGAIN. An early lazy
// deadline is moved (lazyDeadline.retry). left is the writer still to
// flush (nil once flushed: a session that ended before its first step
// leaves it), werr the flush's error, err the read's or the wait's.
func firstByteSession(ic *idleConn, br *bufio.Reader, flush *bufio.Writer) (left *bufio.Writer, werr, err error) {
	fb := &ic.fb
	fb.br, fb.flush, fb.werr, fb.err = br, flush, nil, nil
	defer func() { fb.br, fb.flush = nil, nil }()
	for {
		serr := ic.raw.session(fb.fn)
		if serr == nil || fb.werr != nil {
			return fb.flush, fb.werr, fb.err
		}
		again, rerr := ic.rd.retry(ic.Conn, 0, serr)
		if rerr != nil {
			return fb.flush, nil, rerr
		}
		if !again {
			return fb.flush, nil, serr
		}
	}
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// capByConns bounds a replica's in-flight cap (0 = none) by its connection
// pool: every proxied request holds one upstream connection until it ends,
// so past upstream.max_conns_per_replica a request could only fail (a 502
// "no free connections"); capped, it meets limits.on_limit instead (429,
// or a wait in the queue).
func capByConns(inFlight, conns int) int {
	if conns > 0 && (inFlight <= 0 || inFlight > conns) {
		return conns
	}
	return inFlight
}
