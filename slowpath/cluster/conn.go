package cluster

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// The NATS connection's lifecycle: dialing lazily after Start, TLS and
// credentials, and the connect/disconnect/reconnect callbacks that keep
// Connected, the metrics and the peers' view in step.

// connectTimeout bounds one connection attempt (dial and handshake).
const connectTimeout = 2 * time.Second

// writeTimeout bounds one write to the NATS connection: two heartbeats,
// at least 250ms.
func writeTimeout(cfg Config) time.Duration { return max(2*cfg.Heartbeat, 250*time.Millisecond) }

// errConnectLater: the lazyDialer's answer during nats.Connect.
var errConnectLater = errors.New("cluster: connecting in the background")

// lazyDialer fails every dial until ready, then dials for real.
type lazyDialer struct {
	ready atomic.Bool
	d     net.Dialer
}

func (l *lazyDialer) Dial(network, addr string) (net.Conn, error) {
	if !l.ready.Load() {
		return nil, errConnectLater
	}
	return l.d.Dial(network, addr)
}

// authOptions are the TLS and authentication options of cfg.
func authOptions(cfg Config) ([]nats.Option, error) {
	var out []nats.Option
	if cfg.TLSCAFile != "" {
		out = append(out, nats.RootCAs(cfg.TLSCAFile))
	}
	if cfg.NkeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("cluster: nkey_seed_file: %w", err)
		}
		out = append(out, o)
	}
	if cfg.CredsFile != "" {
		out = append(out, nats.UserCredentials(cfg.CredsFile))
	}
	return out, nil
}

func (n *Node) onConnect(nc *nats.Conn) {
	n.connected.Store(true)
	n.m.connected.Set(1)
	n.log.Info("connected to NATS", "server", nc.ConnectedUrlRedacted())
	select {
	case n.warm <- struct{}{}:
	default:
	}
}

func (n *Node) onReconnect(nc *nats.Conn) {
	n.mu.Lock()
	n.allLoad = true
	n.mu.Unlock()
	n.connected.Store(true)
	n.m.connected.Set(1)
	n.log.Info("reconnected to NATS: sharing state again", "server", nc.ConnectedUrlRedacted())
}

func (n *Node) onDisconnect(_ *nats.Conn, err error) {
	if !n.connected.Swap(false) {
		return
	}
	n.m.connected.Set(0)
	select {
	case <-n.closing:
		return
	default:
	}
	n.log.Warn("disconnected from NATS: routing on local state, reconnecting", "err", err)
}

// onClosed: nats.go gave up on the connection. With MaxReconnects(-1)
// and IgnoreAuthErrorAbort that is only Close; anything else is logged.
func (n *Node) onClosed(nc *nats.Conn) {
	n.connected.Store(false)
	n.m.connected.Set(0)
	select {
	case <-n.closing:
		return
	default:
	}
	n.m.natsErrors.Inc()
	n.log.Error("NATS connection closed for good: not sharing state any more (restart to retry)", "err", nc.LastError())
}

// onReconnectErr: an attempt to (re)connect failed. Counted; a network
// error (refused, timed out: the server is down, already warned on
// disconnect) is logged at Debug, any other once per distinct error.
func (n *Node) onReconnectErr(_ *nats.Conn, err error) {
	if err == nil || errors.Is(err, errConnectLater) {
		return
	}
	n.m.natsErrors.Inc()
	if _, ok := errors.AsType[*net.OpError](err); ok {
		n.log.Debug("NATS connection attempt failed", "err", err)
		return
	}
	n.warnOnce("connect/"+err.Error(), "NATS connection attempt failed (retrying; each error logged once, counted in nats_errors_total)", "err", err)
}

// warnConnectErr warns (once per distinct error) about why the node is not
// connected: nats.go reports no callback for a handshake error (rejected
// credentials, TLS) before the first connection. Flusher only; LastError
// may wait for a connection attempt in progress (at most connectTimeout).
func (n *Node) warnConnectErr() {
	err := n.nc.LastError()
	if err == nil {
		return
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return
	}
	n.warnOnce("connect/"+err.Error(), "NATS connection attempt failed (retrying; each error logged once)", "err", err)
}

func (n *Node) onAsyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	subj := ""
	if sub != nil {
		subj = sub.Subject
	}
	n.m.natsErrors.Inc()
	n.warnOnce("async/"+err.Error(), "NATS error (logged once per kind; counted in nats_errors_total)", "subject", subj, "err", err)
}

// The PeerSink half. Called with the Router's lock held: copy, never block.
