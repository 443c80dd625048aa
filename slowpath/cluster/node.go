package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/affinity"
)

// Options configure Start.
type Options struct {
	// Config is the cluster block (defaults are applied). Required:
	// Config.NATSURL.
	Config Config
	// Router is this instance's routing brain. Required.
	Router *affinity.Router
	// Tenancy is the tenancy mode (slowpath tenancy.salt_from), part of the
	// hash fingerprint: "" means "none".
	Tenancy string
	// HashKeyed reports whether the prefix hashes are keyed with a
	// per-deployment secret (slowpath hash_key_file); KeyID identifies the
	// key (a one-way digest of it), part of the fingerprint, so instances
	// with different keys do not mix their hashes.
	HashKeyed bool
	KeyID     uint64
	// Logger; nil means slog.Default(). The node adds component=cluster.
	Logger *slog.Logger
	// Registerer, if set, gets the node's metrics.
	Registerer prometheus.Registerer
	// Usage, if set, is shared with the peers: per-tenant budgets fleet
	// wide (usage.go).
	Usage UsageLedger
}

// EntryFunc receives a peer's fast-path affinity entry: client steered to
// this instance's replica (add) or no longer steered (!add; replica may be
// NoReplica). steer.Controller.ApplyPeerEntry is one.
type EntryFunc func(client netip.Addr, replica affinity.ReplicaID, add bool)

// Node is one instance's member of the fleet: it is the Router's PeerSink
// (batches what the Router learns and publishes it to NATS) and applies the
// peers' batches to the Router. Start it with Start, stop it with Close.
type Node struct {
	cfg      Config
	rt       *affinity.Router
	fp       uint64
	log      *slog.Logger
	m        *metrics
	nc       *nats.Conn
	subjOut  string // <prefix>.u.<instance>
	subjIn   string // <prefix>.u.*
	subjPfx  string // <prefix>.u.
	inc      uint64 // this process's incarnation (random)
	subjSnap string // <prefix>.snapshot
	maxChain int    // hashes per insert record

	connected atomic.Bool
	entryFn   atomic.Pointer[EntryFunc]

	// Pending batch, filled by the sink on request goroutines.
	mu      sync.Mutex
	pend    []byte
	spare   []byte
	used    []bool // sender replica ids referenced by pend
	loads   []affinity.PeerLoad
	dirty   []bool // loads[id] changed since the last flush
	counts  [recKinds]int
	allLoad bool // the next flush is a full-load batch (heartbeat, reconnect)

	armed bool // a flush is scheduled for what is pending (arm signalled)

	kick    chan struct{} // flush now: the batch is half full
	arm     chan struct{} // the first update since the last flush
	warm    chan struct{}
	closing chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	// Flusher-only state.
	seq      uint64
	leaving  bool   // the final flush: flagLeave
	seen     []bool // refreshLoads scratch
	names    []string
	out      []byte
	sendCnt  [recKinds]int
	sendUsed []bool

	// Receive side: the subscription goroutine; peers also by the
	// expiry goroutine and Close.
	peerMu  sync.Mutex
	closed  bool // Close withdrew the peers: apply nothing more
	peers   map[string]*peer
	slots   [affinity.MaxPeers]bool
	msg     Message
	ups     []affinity.PeerUpdate
	local   map[uint32]affinity.ReplicaID
	entries []entryUp

	wMu    sync.Mutex
	warned map[string]bool // keys logged once (mismatch, stale, no slot)

	snapMu sync.Mutex // snapshot import (its own subscription goroutine)
	// lastSnap is when the last snapshot was answered (UnixNano; 0 never).
	lastSnap  atomic.Int64
	snapEvery atomic.Int64 // ns between snapshot answers: snapshotMinInterval (tests lengthen it)
	snapMsg   Message
	snapLoc   map[uint32]affinity.ReplicaID

	usage usageState // tenant budgets (usage.go)
}

// maxGap: a sequence jump at least this large is a peer's restart.
const maxGap = 1 << 20

type peer struct {
	slot     int
	inc      uint64 // incarnation of its batches
	lastSeq  uint64
	lastSeen time.Time
}

type entryUp struct {
	client netip.Addr
	r      affinity.ReplicaID
	add    bool
}

// Warnings lists what is weak in a cluster setup, one sentence each, for
// Start to log: a NATS URL without TLS (tls://) carries the fleet's prefix
// hashes and routing state in the clear; without nkey_seed_file,
// creds_file or credentials in the URL anyone who reaches the server can
// read them and inject state; unkeyed hashes let a reader test guessed
// prompts against them.
func Warnings(cfg Config, hashKeyed bool) []string {
	var out []string
	auth := cfg.NkeySeedFile != "" || cfg.CredsFile != ""
	for _, raw := range cfg.NATSURL {
		u, err := url.Parse(raw)
		if err != nil {
			continue // Validate reports it
		}
		host := u.Host
		if u.Scheme != "tls" && cfg.TLSCAFile == "" {
			out = append(out, "cluster: NATS URL "+host+" is plaintext (not tls://): routing state and prefix hashes cross the network readable")
		}
		if u.User != nil {
			auth = true
		}
	}
	if !auth {
		out = append(out, "cluster: NATS connection unauthenticated (no nkey_seed_file, creds_file or URL credentials): anyone who reaches the server can read and inject routing state")
	}
	if !hashKeyed {
		out = append(out, "cluster: prefix hashes are unkeyed (no hash_key_file): a reader of the NATS traffic can test guessed prompts against them")
	}
	return out
}

// Start connects to NATS (in the background: Start never waits for a
// server, reachable or not, and the node keeps trying forever, auth errors
// included), subscribes to the peers' batches and snapshot requests, asks
// the peers for a warm-up snapshot once connected, and becomes
// opts.Router's PeerSink. Close undoes it.
func Start(opts Options) (*Node, error) {
	n, err := newNode(opts)
	if err != nil {
		return nil, err
	}
	cfg := n.cfg
	for _, w := range Warnings(cfg, opts.HashKeyed) {
		n.log.Warn(w)
	}
	if opts.Registerer != nil {
		if err := n.m.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	opts2, err := authOptions(cfg)
	if err != nil {
		return nil, err
	}
	// The dialer refuses the synchronous first round of nats.Connect, so
	// that with RetryOnFailedConnect every real attempt happens in nats.go's
	// reconnect goroutine: a server that accepts TCP but never answers
	// delays Start by nothing (instead of nats.Timeout per URL).
	dial := &lazyDialer{d: net.Dialer{Timeout: connectTimeout}}
	nc, err := nats.Connect(strings.Join(cfg.NATSURL, ","), append(opts2,
		nats.Name("warmpath "+cfg.Instance),
		nats.NoEcho(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.ReconnectJitter(cfg.ReconnectWait/4, cfg.ReconnectWait/4),
		nats.ReconnectBufSize(2*cfg.MaxBatchBytes),
		nats.RetryOnFailedConnect(true),
		nats.SetCustomDialer(dial),
		nats.Timeout(connectTimeout),
		// A stalled path (no reset) must not block the flusher for
		// nats.go's default minute: a write that cannot finish in
		// writeTimeout fails (nats.go's flusher then reconnects), and
		// pings find a dead server within a few peer timeouts.
		nats.FlusherTimeout(writeTimeout(cfg)),
		nats.ReconnectOnFlusherError(),
		nats.PingInterval(max(cfg.PeerTimeout, time.Second)),
		nats.MaxPingsOutstanding(3),
		// Credentials rejected twice (not yet provisioned, an auth
		// callout failing during a NATS restart) must not end the
		// connection for good.
		nats.IgnoreAuthErrorAbort(),
		nats.ConnectHandler(n.onConnect),
		nats.ReconnectHandler(n.onReconnect),
		nats.DisconnectErrHandler(n.onDisconnect),
		nats.ClosedHandler(n.onClosed),
		nats.ErrorHandler(n.onAsyncError),
		nats.ReconnectErrHandler(n.onReconnectErr),
	)...)
	dial.ready.Store(true)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect %s: %w", strings.Join(cfg.NATSURL, ","), err)
	}
	n.nc = nc
	if _, err := nc.Subscribe(n.subjIn, n.onBatch); err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: subscribe %s: %w", n.subjIn, err)
	}
	if _, err := nc.Subscribe(n.subjSnap, n.onSnapshotRequest); err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: subscribe %s: %w", n.subjSnap, err)
	}
	n.rt.SetPeerSink(n)
	n.wg.Add(2)
	go n.loop()
	go n.expireLoop()
	if err := n.startUsage(opts); err != nil {
		n.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return n, nil
}

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

// newNode builds a Node without connecting it (tests drive it directly).
func newNode(opts Options) (*Node, error) {
	if opts.Router == nil {
		return nil, errors.New("cluster: Router is required")
	}
	cfg := opts.Config.WithDefaults()
	if !cfg.Enabled() {
		return nil, errors.New("cluster: nats_url is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	ten := opts.Tenancy
	if ten == "" {
		ten = "none"
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	n := &Node{
		cfg: cfg, rt: opts.Router, fp: Fingerprint(opts.Router.HashConfig(), ten) ^ opts.KeyID,
		log: log.With("component", "cluster", "instance", cfg.Instance), m: newMetrics(),
		subjOut: cfg.SubjectPrefix + ".u." + cfg.Instance, subjIn: cfg.SubjectPrefix + ".u.*",
		subjPfx: cfg.SubjectPrefix + ".u.", inc: rand.Uint64() | 1,
		subjSnap: cfg.SubjectPrefix + ".snapshot", maxChain: cfg.MaxBatchBytes / 16,
		pend: make([]byte, 0, cfg.MaxBatchBytes), spare: make([]byte, 0, cfg.MaxBatchBytes),
		kick: make(chan struct{}, 1), arm: make(chan struct{}, 1), warm: make(chan struct{}, 1), closing: make(chan struct{}),
		peers: map[string]*peer{}, local: map[uint32]affinity.ReplicaID{},
		warned: map[string]bool{}, snapLoc: map[uint32]affinity.ReplicaID{},
	}
	n.snapEvery.Store(int64(snapshotMinInterval))
	return n, nil
}

// Close publishes what is pending in a last batch that tells the peers
// this instance leaves (they withdraw its load at once, not after
// peer_timeout), stops publishing and applying, withdraws the peers' load
// from the Router (it is alone again) and closes the NATS connection. It
// waits at most about one write timeout (two heartbeats) on a stalled
// connection, at most connectTimeout while a connection attempt hangs.
func (n *Node) Close() {
	n.once.Do(func() {
		n.rt.SetPeerSink(nil)
		close(n.closing) // the flusher sends the leaving batch and returns
		n.wg.Wait()
		n.connected.Store(false) // PublishEntry after Close drops
		n.nc.Close()
		n.peerMu.Lock()
		n.closed = true // a batch handler still running applies nothing
		for name, p := range n.peers {
			n.rt.ClearPeer(p.slot)
			n.slots[p.slot] = false
			delete(n.peers, name)
		}
		n.peerMu.Unlock()
		n.m.connected.Set(0)
		n.m.peers.Set(0)
	})
}

// Connected reports whether the NATS connection is up.
func (n *Node) Connected() bool { return n.connected.Load() }

// Instance is this node's instance name.
func (n *Node) Instance() string { return n.cfg.Instance }

// Peers lists the instances heard from within peer_timeout.
func (n *Node) Peers() []string {
	n.peerMu.Lock()
	defer n.peerMu.Unlock()
	out := make([]string, 0, len(n.peers))
	for name := range n.peers {
		out = append(out, name)
	}
	return out
}

// Status is a node's state as /debug/replicas shows it.
type Status struct {
	Instance  string   `json:"instance"`
	Connected bool     `json:"connected"`
	Peers     []string `json:"peers"` // heard from within peer_timeout, sorted
}

// Status reports the node's state (allocates; not for the hot path).
func (n *Node) Status() Status {
	p := n.Peers()
	slices.Sort(p)
	return Status{Instance: n.cfg.Instance, Connected: n.Connected(), Peers: p}
}

// SetEntryHandler makes fn receive the peers' fast-path entries (nil:
// ignore them). fn runs on the subscription goroutine.
func (n *Node) SetEntryHandler(fn EntryFunc) {
	if fn == nil {
		n.entryFn.Store(nil)
		return
	}
	n.entryFn.Store(&fn)
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

// PeerInsert implements affinity.PeerSink.
func (n *Node) PeerInsert(id affinity.ReplicaID, hashes []uint64) {
	if len(hashes) > n.maxChain {
		hashes = hashes[:n.maxChain] // a chain's prefix is still a chain
	}
	n.add(recInsert, id, 12+8*len(hashes), func(b []byte) []byte { return appendInsert(b, uint32(id), hashes) })
}

// PeerTruncate implements affinity.PeerSink.
func (n *Node) PeerTruncate(id affinity.ReplicaID, tail uint64, k int) {
	n.add(recTruncate, id, 24, func(b []byte) []byte { return appendTruncate(b, uint32(id), tail, k) })
}

// PeerTail implements affinity.PeerTailSink: a finished request's deepest
// block, for the continuation credit of its next turn on any instance.
func (n *Node) PeerTail(id affinity.ReplicaID, tail uint64) {
	n.add(recTail, id, 16, func(b []byte) []byte { return appendTail(b, uint32(id), tail) })
}

// PeerReset implements affinity.PeerSink.
func (n *Node) PeerReset(id affinity.ReplicaID) {
	n.add(recReset, id, 8, func(b []byte) []byte { return appendReset(b, uint32(id)) })
}

// PeerLoad implements affinity.PeerSink: values are absolute, so only the
// latest per replica is kept until the next flush.
func (n *Node) PeerLoad(id affinity.ReplicaID, l affinity.PeerLoad) {
	if id < 0 {
		return
	}
	n.mu.Lock()
	if int(id) >= len(n.loads) {
		n.grow(int(id))
	}
	n.loads[id] = l
	n.dirty[id] = true
	first := !n.armed
	n.armed = true
	n.mu.Unlock()
	if first {
		n.signal(n.arm)
	}
}

// PublishEntry shares a fast-path affinity entry this instance wrote
// (add: client steered to replica) or deleted (!add: replica may be
// NoReplica). It never blocks. Its signature is a steer.EntryHook.
func (n *Node) PublishEntry(client netip.Addr, replica affinity.ReplicaID, add bool) {
	k := byte(recEntryDel)
	if add {
		k = recEntryAdd
	} else {
		replica = max(replica, 0) // a deletion needs no replica
	}
	n.add(k, replica, 24, func(b []byte) []byte { return appendEntry(b, uint32(replica), client, add) })
}

// add appends one record (at most size bytes) to the pending batch, or
// drops it (counted) when NATS is down or the batch is full.
func (n *Node) add(kind byte, id affinity.ReplicaID, size int, enc func([]byte) []byte) {
	if id < 0 {
		return
	}
	if !n.connected.Load() {
		n.m.updDropped[dropDisconnected].Inc()
		return
	}
	n.mu.Lock()
	if len(n.pend)+size > n.cfg.MaxBatchBytes {
		n.mu.Unlock()
		n.m.updDropped[dropOverflow].Inc()
		n.kickFlush()
		return
	}
	n.pend = enc(n.pend)
	if int(id) >= len(n.used) {
		n.grow(int(id))
	}
	n.used[id] = true
	n.counts[kind]++
	half := len(n.pend) >= n.cfg.MaxBatchBytes/2
	first := !n.armed
	n.armed = true
	n.mu.Unlock()
	switch {
	case half:
		n.kickFlush()
	case first:
		n.signal(n.arm)
	}
}

// grow makes the per-replica slices hold id. Called with mu held.
func (n *Node) grow(id int) {
	k := max(id+1, 2*len(n.loads), 16)
	n.loads = append(n.loads, make([]affinity.PeerLoad, k-len(n.loads))...)
	n.dirty = append(n.dirty, make([]bool, k-len(n.dirty))...)
	n.used = append(n.used, make([]bool, k-len(n.used))...)
}

func (n *Node) kickFlush() { n.signal(n.kick) }

func (n *Node) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// loop flushes flush_interval after the first update of a batch (or at
// once when the batch is half full), heartbeats, times out silent peers
// and runs the warm-up when the connection comes up. An idle node wakes
// only for heartbeats.
func (n *Node) loop() {
	defer n.wg.Done()
	t := time.NewTimer(n.cfg.FlushInterval)
	t.Stop()
	defer t.Stop()
	var due <-chan time.Time // t.C while a flush is scheduled
	hb := time.NewTicker(n.cfg.Heartbeat)
	defer hb.Stop()
	warmed := n.cfg.SnapshotMaxBlocks < 0
	for {
		select {
		case <-n.closing:
			// The last batch: what is pending, flagged leaving.
			n.leaving = true
			n.flush(true)
			return
		case <-n.arm:
			if due == nil {
				t.Reset(n.cfg.FlushInterval)
				due = t.C
			}
		case <-due:
			due = nil
			n.flush(false)
		case <-n.kick:
			n.flush(false)
		case <-hb.C:
			if !n.connected.Load() {
				n.warnConnectErr()
			}
			n.refreshLoads()
			n.mu.Lock()
			n.allLoad = true
			n.mu.Unlock()
			n.flush(true)
		case <-n.warm:
			if !warmed {
				warmed = true
				n.wg.Add(1)
				go n.warmUp()
			}
		}
	}
}

// refreshLoads re-reads every replica's load from the Router for the
// heartbeat's full-load batch: concurrent requests' PeerLoad calls may have
// left a value one change old (affinity.PeerSink), and a replica removed
// since has none.
func (n *Node) refreshLoads() {
	n.mu.Lock()
	seen := append(n.seen[:0], make([]bool, len(n.loads))...)
	n.mu.Unlock()
	n.rt.LocalLoads(func(id affinity.ReplicaID, _ string, l affinity.PeerLoad) {
		n.mu.Lock()
		if int(id) >= len(n.loads) {
			n.grow(int(id))
		}
		if n.loads[id] != l {
			n.loads[id] = l
			n.dirty[id] = true
		}
		n.mu.Unlock()
		if int(id) < len(seen) {
			seen[id] = true
		}
	})
	n.mu.Lock()
	for id, ok := range seen {
		if !ok {
			n.loads[id] = affinity.PeerLoad{} // removed: no load, no record
			n.dirty[id] = false
		}
	}
	n.mu.Unlock()
	n.seen = seen
}

// expireLoop times out silent peers on its own ticker: a flusher stuck in
// a slow NATS write must not keep a departed peer's load.
func (n *Node) expireLoop() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.PeerTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.closing:
			return
		case now := <-t.C:
			n.expirePeers(now)
		}
	}
}

// flush publishes the pending batch (heartbeat: even when empty).
func (n *Node) flush(heartbeat bool) {
	out, total := n.encodeBatch(heartbeat, time.Now().UnixNano())
	if out == nil {
		return
	}
	if !n.connected.Load() {
		n.seq-- // never published: not a gap for the peers
		n.m.updDropped[dropDisconnected].Add(float64(total))
		return
	}
	if err := n.nc.Publish(n.subjOut, out); err != nil {
		n.seq--
		n.m.batchDropped[dropPublish].Inc()
		n.m.updDropped[dropDisconnected].Add(float64(total))
		return
	}
	n.m.batchesSent.Inc()
	n.m.bytesSent.Add(float64(len(out)))
	for k, c := range n.sendCnt {
		if c > 0 {
			n.m.sent[k].Add(float64(c))
		}
	}
}

// encodeBatch takes the pending records (and the changed loads) and
// encodes them as one batch sent at sendNs; nil when there is nothing to
// send and heartbeat is false. total counts the updates in it. After a
// heartbeat or a reconnect (allLoad) the batch is a full-load one: every
// non-zero load, flagged so that receivers zero the rest. The result is
// valid until the next call (flusher goroutine only).
func (n *Node) encodeBatch(heartbeat bool, sendNs int64) (out []byte, total int) {
	n.mu.Lock()
	var flags byte
	if n.allLoad {
		flags |= flagFull
	}
	if n.leaving {
		flags |= flagLeave
	}
	for id := range n.dirty {
		if n.dirty[id] || (n.allLoad && n.loads[id] != (affinity.PeerLoad{})) {
			n.dirty[id] = false
			n.pend = appendLoad(n.pend, uint32(id), n.loads[id])
			n.used[id] = true
			n.counts[recLoad]++
		}
	}
	n.allLoad = false
	n.armed = false // the next update schedules the next flush
	if len(n.pend) == 0 && !heartbeat {
		n.mu.Unlock()
		return nil, 0
	}
	recs := n.pend
	n.pend, n.spare = n.spare[:0], recs
	n.sendCnt = n.counts
	n.counts = [recKinds]int{}
	n.sendUsed = append(n.sendUsed[:0], n.used...)
	clear(n.used)
	n.mu.Unlock()

	for _, c := range n.sendCnt {
		total += c
	}
	n.names = n.rt.ReplicaNames(n.names)
	n.seq++
	n.out = appendHeader(n.out[:0], msgBatch, flags, n.fp, n.inc, n.seq, sendNs, n.cfg.Instance)
	cnt := 0
	for id, u := range n.sendUsed {
		if u && id < len(n.names) && n.names[id] != "" {
			cnt++
		}
	}
	n.out = appendUvarint(n.out, uint64(cnt))
	for id, u := range n.sendUsed {
		if u && id < len(n.names) && n.names[id] != "" {
			n.out = appendTableEntry(n.out, uint32(id), n.names[id])
		}
	}
	n.out = append(n.out, recs...)
	return n.out, total
}

// expirePeers withdraws the load of peers silent for peer_timeout.
func (n *Node) expirePeers(now time.Time) {
	n.peerMu.Lock()
	defer n.peerMu.Unlock()
	for name, p := range n.peers {
		if now.Sub(p.lastSeen) > n.cfg.PeerTimeout {
			n.rt.ClearPeer(p.slot)
			n.slots[p.slot] = false
			delete(n.peers, name)
			n.log.Info("peer timed out: its load withdrawn", "peer", name, "silent", now.Sub(p.lastSeen).Round(time.Millisecond))
		}
	}
	n.m.peers.Set(float64(len(n.peers)))
}

// onBatch applies one peer's batch (the subscription goroutine).
func (n *Node) onBatch(msg *nats.Msg) {
	if isUsage(msg.Data) {
		n.onUsage(msg)
		return
	}
	n.apply(msg.Subject, msg.Data, time.Now())
}

// applyBatch decodes b and applies it; now is the receive time. It skips
// the subject check (tests, benchmarks: no subject).
func (n *Node) applyBatch(b []byte, now time.Time) { n.apply("", b, now) }

// apply decodes b, received on subject subj ("": not checked), and
// applies it; now is the receive time.
func (n *Node) apply(subj string, b []byte, now time.Time) {
	n.m.batchesReceived.Inc()
	n.m.bytesReceived.Add(float64(len(b)))
	m := &n.msg
	if err := Decode(b, m); err != nil || m.Kind != msgBatch {
		n.m.batchDropped[dropDecode].Inc()
		n.log.Debug("undecodable batch", "err", err)
		return
	}
	if subj != "" && (len(subj) != len(n.subjPfx)+len(m.Instance) || subj[:len(n.subjPfx)] != n.subjPfx || subj[len(n.subjPfx):] != m.Instance) {
		// Only <prefix>.u.<instance> speaks for instance: one publisher
		// must not fill the peer slots with made-up names.
		n.m.batchDropped[dropSubject].Inc()
		n.warnOnce("subject/"+subj, "batch published on a subject not its instance's: dropped", "subject", subj, "claims", m.Instance)
		return
	}
	if m.Instance == n.cfg.Instance {
		// NoEcho keeps our own batches away: another instance has our name.
		n.m.batchDropped[dropMismatch].Inc()
		n.warnOnce("dup/"+m.Instance, "another instance publishes under this instance name: its updates are ignored; cluster.instance must be unique", "peer", m.Instance)
		return
	}
	if m.Fingerprint != n.fp {
		n.m.batchDropped[dropMismatch].Inc()
		n.warnOnce("mismatch/"+m.Instance, "peer hashes prompts differently (hash.bytes_per_token, hash.block_tokens or tenancy differ): its updates are ignored", "peer", m.Instance)
		return
	}
	if age := now.UnixNano() - m.SendNs; age > int64(n.cfg.MaxAge) || age < -int64(n.cfg.MaxAge) {
		n.m.batchDropped[dropStale].Inc()
		n.warnOnce("stale/"+m.Instance, "peer's clock and ours differ by more than max_age (or its batches arrive that late): dropped", "peer", m.Instance, "age", time.Duration(age).Round(time.Millisecond))
		return
	}
	leave := m.Flags&flagLeave != 0
	n.peerMu.Lock()
	// peerMu is held while the batch is applied to the Router: Close,
	// expiry and a restart's ClearPeer never interleave with it (lock
	// order: peerMu, then the Router's).
	if n.closed {
		n.peerMu.Unlock()
		return
	}
	p := n.peers[m.Instance]
	if p == nil {
		if leave {
			n.peerMu.Unlock()
			return // nothing of it to withdraw
		}
		slot := -1
		for i := range n.slots {
			if !n.slots[i] {
				slot = i
				break
			}
		}
		if slot < 0 {
			n.peerMu.Unlock()
			n.warnOnce("slots/"+m.Instance, "too many peers: ignoring one", "peer", m.Instance, "max", affinity.MaxPeers)
			return
		}
		n.slots[slot] = true
		p = &peer{slot: slot, inc: m.Incarnation}
		n.peers[m.Instance] = p
		n.m.peers.Set(float64(len(n.peers)))
		n.log.Info("peer joined", "peer", m.Instance)
	}
	late := p.lastSeq != 0 && m.Seq <= p.lastSeq
	restart := p.inc != m.Incarnation
	switch {
	case restart:
	case late && p.lastSeq-m.Seq >= maxGap, !late && p.lastSeq != 0 && m.Seq-p.lastSeq-1 >= maxGap:
		// Sequences count from 1 per incarnation: a jump this large
		// either way is not reordering or loss (a forged or corrupted
		// batch): start over from this one rather than ignore the peer.
		restart = true
	case !late && p.lastSeq != 0 && m.Seq > p.lastSeq+1:
		n.m.batchDropped[dropGap].Add(float64(m.Seq - p.lastSeq - 1))
	}
	if restart {
		// A new process under the same name: its predecessor's load is
		// gone with it.
		n.rt.ClearPeer(p.slot)
		p.inc, late = m.Incarnation, false
		n.log.Info("peer restarted: its previous load withdrawn", "peer", m.Instance)
	}
	if !late {
		p.lastSeq = m.Seq
	}
	p.lastSeen = now
	slot := p.slot

	clear(n.local)
	for _, nm := range m.Names {
		if id, ok := n.rt.Lookup(nm.Name); ok {
			n.local[nm.ID] = id
		}
	}
	fn := n.entryFn.Load()
	n.ups, n.entries = n.ups[:0], n.entries[:0]
	var got [recKinds]int
	for i := range m.Records {
		r := &m.Records[i]
		id, ok := n.local[r.Replica]
		if !ok && r.Kind == recEntryAdd {
			// Steered to a replica this instance does not have: its
			// own entry for the client (if any) is stale all the same.
			id, ok, r.Kind = affinity.NoReplica, true, recEntryDel
		}
		if !ok && r.Kind == recEntryDel {
			id, ok = affinity.NoReplica, true // a deletion needs no replica
		}
		if !ok {
			n.m.updDropped[dropUnknown].Inc()
			continue
		}
		switch r.Kind {
		case recInsert:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindInsert, Replica: id, Hashes: r.Hashes})
		case recTruncate:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindTruncate, Replica: id, Tail: r.Tail, N: r.N})
		case recReset:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindReset, Replica: id})
		case recTail:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindTail, Replica: id, Tail: r.Tail})
		case recLoad:
			if late {
				continue // a newer absolute value was applied already
			}
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindLoad, Replica: id, Load: r.Load})
		case recEntryAdd, recEntryDel:
			if fn == nil {
				continue // nobody applies them
			}
			n.entries = append(n.entries, entryUp{client: r.Client, r: id, add: r.Kind == recEntryAdd})
		default:
			continue
		}
		got[r.Kind]++
	}
	if m.Flags&flagFull != 0 && !late {
		// The batch's loads are the peer's whole load: zero the rest
		// (a lost or reordered zero, a replica it removed).
		_ = n.rt.ReplacePeerLoads(slot, n.ups) // slot is in range by construction
	}
	if len(n.ups) > 0 {
		_ = n.rt.ApplyPeer(slot, n.ups)
	}
	if leave {
		n.rt.ClearPeer(slot)
		n.slots[slot] = false
		delete(n.peers, m.Instance)
		n.m.peers.Set(float64(len(n.peers)))
		n.log.Info("peer left: its load withdrawn", "peer", m.Instance)
	}
	n.peerMu.Unlock()
	if fn != nil {
		for _, e := range n.entries {
			(*fn)(e.client, e.r, e.add)
		}
	}
	for k, c := range got {
		if c > 0 {
			n.m.received[k].Add(float64(c))
		}
	}
	n.m.lag.Observe(max(float64(time.Now().UnixNano()-m.SendNs), 0) / 1e9)
}

func (n *Node) warnOnce(key, msg string, args ...any) {
	n.wMu.Lock()
	seen := n.warned[key]
	if !seen {
		if len(n.warned) >= 1024 {
			seen = true // full: stay quiet rather than warn on every batch
		} else {
			n.warned[key] = true
		}
	}
	n.wMu.Unlock()
	if !seen {
		n.log.Warn(msg, args...)
	}
}

var (
	_ affinity.PeerSink     = (*Node)(nil)
	_ affinity.PeerTailSink = (*Node)(nil)
)
