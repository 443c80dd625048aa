package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
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
	// Logger; nil means slog.Default(). The node adds component=cluster.
	Logger *slog.Logger
	// Registerer, if set, gets the node's metrics.
	Registerer prometheus.Registerer
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
	allLoad bool // send every load at the next flush (heartbeat, reconnect)

	armed bool // a flush is scheduled for what is pending (arm signalled)

	kick    chan struct{} // flush now: the batch is half full
	arm     chan struct{} // the first update since the last flush
	warm    chan struct{}
	closing chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	// Flusher-only state.
	seq      uint64
	names    []string
	out      []byte
	sendCnt  [recKinds]int
	sendUsed []bool

	// Receive side: the subscription goroutine; peers also by the
	// flusher's timeout check.
	peerMu  sync.Mutex
	peers   map[string]*peer
	slots   [affinity.MaxPeers]bool
	msg     Message
	ups     []affinity.PeerUpdate
	local   map[uint32]affinity.ReplicaID
	entries []entryUp

	wMu    sync.Mutex
	warned map[string]bool // keys logged once (mismatch, stale, no slot)

	snapMu  sync.Mutex // snapshot import (its own subscription goroutine)
	snapMsg Message
	snapLoc map[uint32]affinity.ReplicaID
}

// maxGap: a sequence jump at least this large is a peer's restart.
const maxGap = 1 << 20

type peer struct {
	slot     int
	lastSeq  uint64
	lastSeen time.Time
}

type entryUp struct {
	client netip.Addr
	r      affinity.ReplicaID
	add    bool
}

// Start connects to NATS (in the background: an unreachable server delays
// nothing, the node keeps trying forever), subscribes to the peers'
// batches and snapshot requests, asks the peers for a warm-up snapshot once
// connected, and becomes opts.Router's PeerSink. Close undoes it.
func Start(opts Options) (*Node, error) {
	n, err := newNode(opts)
	if err != nil {
		return nil, err
	}
	cfg := n.cfg
	if opts.Registerer != nil {
		if err := n.m.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	opts2, err := authOptions(cfg)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(cfg.NATSURL, ","), append(opts2,
		nats.Name("warmpath "+cfg.Instance),
		nats.NoEcho(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.ReconnectJitter(cfg.ReconnectWait/4, cfg.ReconnectWait/4),
		nats.ReconnectBufSize(2*cfg.MaxBatchBytes),
		nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(n.onConnect),
		nats.ReconnectHandler(n.onReconnect),
		nats.DisconnectErrHandler(n.onDisconnect),
		nats.ErrorHandler(n.onAsyncError),
	)...)
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
	n.wg.Add(1)
	go n.loop()
	return n, nil
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
	return &Node{
		cfg: cfg, rt: opts.Router, fp: Fingerprint(opts.Router.HashConfig(), ten),
		log: log.With("component", "cluster", "instance", cfg.Instance), m: newMetrics(),
		subjOut: cfg.SubjectPrefix + ".u." + cfg.Instance, subjIn: cfg.SubjectPrefix + ".u.*",
		subjSnap: cfg.SubjectPrefix + ".snapshot", maxChain: cfg.MaxBatchBytes / 16,
		pend: make([]byte, 0, cfg.MaxBatchBytes), spare: make([]byte, 0, cfg.MaxBatchBytes),
		kick: make(chan struct{}, 1), arm: make(chan struct{}, 1), warm: make(chan struct{}, 1), closing: make(chan struct{}),
		seq: uint64(time.Now().UnixNano()), peers: map[string]*peer{}, local: map[uint32]affinity.ReplicaID{},
		warned: map[string]bool{}, snapLoc: map[uint32]affinity.ReplicaID{},
	}, nil
}

// Close stops publishing and applying, withdraws the peers' load from the
// Router (it is alone again) and closes the NATS connection.
func (n *Node) Close() {
	n.once.Do(func() {
		n.rt.SetPeerSink(nil)
		n.connected.Store(false) // PublishEntry after Close drops
		close(n.closing)
		n.wg.Wait()
		n.nc.Close()
		n.peerMu.Lock()
		for name, p := range n.peers {
			n.rt.ClearPeer(p.slot)
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

func (n *Node) onAsyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	subj := ""
	if sub != nil {
		subj = sub.Subject
	}
	n.log.Debug("nats async error", "subject", subj, "err", err)
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
			// Re-read every replica's load from the Router: concurrent
			// requests' PeerLoad calls may have left a value one change
			// old (affinity.PeerSink), and this heals it.
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
			})
			n.mu.Lock()
			n.allLoad = true
			n.mu.Unlock()
			n.flush(true)
			n.expirePeers(time.Now())
		case <-n.warm:
			if !warmed {
				warmed = true
				n.wg.Add(1)
				go n.warmUp()
			}
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
		n.m.updDropped[dropDisconnected].Add(float64(total))
		return
	}
	if err := n.nc.Publish(n.subjOut, out); err != nil {
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
// send and heartbeat is false. total counts the updates in it. The result
// is valid until the next call (flusher goroutine only).
func (n *Node) encodeBatch(heartbeat bool, sendNs int64) (out []byte, total int) {
	n.mu.Lock()
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
	n.out = appendHeader(n.out[:0], msgBatch, n.fp, n.seq, sendNs, n.cfg.Instance)
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
	n.applyBatch(msg.Data, time.Now())
}

// applyBatch decodes b and applies it; now is the receive time.
func (n *Node) applyBatch(b []byte, now time.Time) {
	n.m.batchesReceived.Inc()
	n.m.bytesReceived.Add(float64(len(b)))
	m := &n.msg
	if err := Decode(b, m); err != nil || m.Kind != msgBatch {
		n.m.batchDropped[dropDecode].Inc()
		n.log.Debug("undecodable batch", "err", err)
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
	if age := now.UnixNano() - m.SendNs; age > int64(n.cfg.MaxAge) {
		n.m.batchDropped[dropStale].Inc()
		n.warnOnce("stale/"+m.Instance, "peer's batches arrive older than max_age (clock skew or a slow link?): dropped", "peer", m.Instance, "age", time.Duration(age).Round(time.Millisecond))
		return
	}
	n.peerMu.Lock()
	p := n.peers[m.Instance]
	if p == nil {
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
		p = &peer{slot: slot}
		n.peers[m.Instance] = p
		n.m.peers.Set(float64(len(n.peers)))
		n.log.Info("peer joined", "peer", m.Instance)
	}
	late := p.lastSeq != 0 && m.Seq <= p.lastSeq
	switch gap := m.Seq - p.lastSeq - 1; {
	case p.lastSeq == 0 || m.Seq <= p.lastSeq+1:
	case gap < maxGap:
		n.m.batchDropped[dropGap].Add(float64(gap))
	default:
		// Sequences start at the sender's start time in nanoseconds: a
		// jump this large is a restart, not lost batches.
		n.log.Info("peer restarted", "peer", m.Instance)
	}
	if !late {
		p.lastSeq = m.Seq
	}
	p.lastSeen = now
	slot := p.slot
	n.peerMu.Unlock()

	clear(n.local)
	for _, nm := range m.Names {
		if id, ok := n.rt.Lookup(nm.Name); ok {
			n.local[nm.ID] = id
		}
	}
	n.ups, n.entries = n.ups[:0], n.entries[:0]
	var got [recKinds]int
	for i := range m.Records {
		r := &m.Records[i]
		id, ok := n.local[r.Replica]
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
			n.entries = append(n.entries, entryUp{client: r.Client, r: id, add: r.Kind == recEntryAdd})
		default:
			continue
		}
		got[r.Kind]++
	}
	if len(n.ups) > 0 {
		_ = n.rt.ApplyPeer(slot, n.ups) // slot is in range by construction
	}
	if fn := n.entryFn.Load(); fn != nil {
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
	if !seen && len(n.warned) < 1024 {
		n.warned[key] = true
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
