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

var (
	_ affinity.PeerSink     = (*Node)(nil)
	_ affinity.PeerTailSink = (*Node)(nil)
)
