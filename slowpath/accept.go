package slowpath

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// connListener is the API listener as fasthttp sees it. It
//
//   - survives accept errors that clear up by themselves (EMFILE and ENFILE
//     when the fd limit is reached, ECONNABORTED, ENOBUFS, ENOMEM, timeouts):
//     it backs off (5 ms doubling to 1 s), logs once per episode and counts
//     them, while the connections it already has keep being served; fasthttp
//     itself returns from Serve on any of them, which would end the process;
//   - caps open connections in total (limits.max_connections) and per client
//     address (limits.max_connections_per_client): a connection over a cap is
//     answered 503 with an OpenAI error and closed at once;
//   - gives every connection the stall deadline of limits.stall_timeout.
//
// Accept runs on fasthttp's single accept goroutine; Close of the wrapped
// connections runs on the connections' goroutines.
type connListener struct {
	net.Listener
	stall     time.Duration
	maxConns  int64 // 0 = no cap
	perClient int   // 0 = no cap
	log       *slog.Logger
	m         *connMetrics

	open    atomic.Int64
	mu      sync.Mutex
	clients map[netip.Addr]int
}

// connMetrics are the listener's collectors.
type connMetrics struct {
	open         prometheus.Gauge
	acceptErrors *prometheus.CounterVec // reason
	rejected     *prometheus.CounterVec // cap: total, per_client
	total        prometheus.Counter
	perClient    prometheus.Counter
}

func newConnMetrics(reg prometheus.Registerer) *connMetrics {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: name, Help: help}
	}
	m := &connMetrics{
		open:         prometheus.NewGauge(prometheus.GaugeOpts(o("connections", "Client connections open on the API listener."))),
		acceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts(o("accept_errors_total", "Transient accept errors (the listener backed off and kept serving), by errno.")), []string{"reason"}),
		rejected:     prometheus.NewCounterVec(prometheus.CounterOpts(o("connections_rejected_total", "Client connections refused at accept (503, closed) by the cap they hit: total (limits.max_connections) or per_client (limits.max_connections_per_client).")), []string{"cap"}),
	}
	m.total = m.rejected.WithLabelValues("total")
	m.perClient = m.rejected.WithLabelValues("per_client")
	reg.MustRegister(m.open, m.acceptErrors, m.rejected)
	return m
}

// Accept backoff bounds (net/http's).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// connRefused is written to a connection over a cap before it is closed.
var connRefused = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
	itoa(len(connRefusedBody)) + "\r\n\r\n" + connRefusedBody)

const connRefusedBody = `{"error":{"message":"The router has too many open connections; retry later.","type":"service_unavailable","param":null,"code":"too_many_connections"}}`

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	var failed int
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			reason, ok := transientAccept(err)
			if !ok {
				return nil, err
			}
			l.m.acceptErrors.WithLabelValues(reason).Inc()
			if failed == 0 {
				l.log.Warn("accept failing, backing off; open connections are still served",
					"err", err, "open_connections", l.open.Load())
			}
			failed++
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			time.Sleep(backoff)
			continue
		}
		if failed > 0 {
			l.log.Info("accepting again", "failed_accepts", failed, "open_connections", l.open.Load())
			failed, backoff = 0, 0
		}
		if cc := l.admit(c); cc != nil {
			return cc, nil
		}
	}
}

// admit wraps c, or answers 503 and closes it when a cap is reached.
func (l *connListener) admit(c net.Conn) net.Conn {
	var addr netip.Addr
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		addr = ta.AddrPort().Addr().Unmap()
	}
	if n := l.open.Add(1); l.maxConns > 0 && n > l.maxConns {
		l.open.Add(-1)
		l.m.total.Inc()
		refuse(c)
		return nil
	}
	if l.perClient > 0 && addr.IsValid() {
		l.mu.Lock()
		n := l.clients[addr]
		if n >= l.perClient {
			l.mu.Unlock()
			l.open.Add(-1)
			l.m.perClient.Inc()
			refuse(c)
			return nil
		}
		l.clients[addr] = n + 1
		l.mu.Unlock()
	}
	l.m.open.Inc()
	return &stallConn{Conn: c, d: l.stall, l: l, addr: addr, raw: newRawIO(c)}
}

// refuse writes the 503 without waiting on the client: the socket buffer of
// a fresh connection takes it whole.
func refuse(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	_, _ = c.Write(connRefused)
	_ = c.Close()
}

// closed gives back the connection's place under the caps.
func (l *connListener) closed(addr netip.Addr) {
	l.open.Add(-1)
	l.m.open.Dec()
	if l.perClient > 0 && addr.IsValid() {
		l.mu.Lock()
		if n := l.clients[addr] - 1; n > 0 {
			l.clients[addr] = n
		} else {
			delete(l.clients, addr)
		}
		l.mu.Unlock()
	}
}

// transientAccept reports whether an accept error clears up by itself, and
// its name for the metric.
func transientAccept(err error) (string, bool) {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EMFILE:
			return "emfile", true
		case syscall.ENFILE:
			return "enfile", true
		case syscall.ECONNABORTED:
			return "econnaborted", true
		case syscall.ENOBUFS:
			return "enobufs", true
		case syscall.ENOMEM:
			return "enomem", true
		case syscall.EINTR:
			return "eintr", true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout", true
	}
	return "", false
}

// stallConn gives every accepted connection a write deadline of d from
// the start of each write (limits.stall_timeout): a client that stops
// reading is cut after d without progress, any progress restarts the clock.
// The deadline moves only when it would move by more than d/16, so most
// writes of a stream cost a clock read and no timer update; a stalled
// client is then cut after between 15/16 of d and d.
type stallConn struct {
	net.Conn
	d     time.Duration
	until time.Time // a write deadline set by the server (limits.write_timeout); zero = none
	set   time.Time // the write deadline in force; zero = none
	rd    lazyDeadline
	raw   *rawIO // the socket's raw reads and writes (rawio_linux.go); nil: Conn's own

	l      *connListener
	addr   netip.Addr
	closed atomic.Bool
}

// Close closes the connection and gives back its place under the caps.
func (c *stallConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) && c.l != nil {
		c.l.closed(c.addr)
	}
	return err
}

// SetWriteDeadline records the server's own deadline so Write keeps the
// earlier of the two.
func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.until, c.set = t, t
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.until, c.set = t, t
	c.rd.force(t)
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline keeps the read deadline lazily (lazyDeadline): fasthttp
// moves it twice per keep-alive request (idle_timeout while waiting,
// read_timeout once the request begins), nearly always later; the
// connection's goroutine is the only one that reads or moves it.
func (c *stallConn) SetReadDeadline(t time.Time) error { return c.rd.move(c.Conn, t) }

// Read reads, moving a lazily kept read deadline when it times out early.
func (c *stallConn) Read(p []byte) (int, error) { return c.rd.read(c.Conn, c.raw, p) }

func (c *stallConn) Write(p []byte) (int, error) {
	dl := time.Now().Add(c.d)
	if !c.until.IsZero() && c.until.Before(dl) {
		dl = c.until
	}
	if c.set.IsZero() || dl.Before(c.set) || dl.Sub(c.set) > c.d>>4 {
		if err := c.Conn.SetWriteDeadline(dl); err != nil {
			return 0, err
		}
		c.set = dl
	}
	return connWrite(c.Conn, c.raw, p)
}

// resolveMaxConns turns limits.max_connections into the cap in force: a
// positive value as is, 0 half the soft fd limit (each proxied request may
// hold an upstream connection too, and the process needs files for
// itself), -1 no cap.
func resolveMaxConns(v int) int {
	switch {
	case v > 0:
		return v
	case v < 0:
		return 0
	}
	if n := fdSoftLimit(); n > 0 {
		return int(min(max(n/2, 16), 1<<30))
	}
	return 0
}

// NetConn returns the client's connection (for clientGone).
func (c *stallConn) NetConn() net.Conn { return c.Conn }
