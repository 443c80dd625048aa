package steer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath"
)

// Options configure New.
type Options struct {
	// Datapath receives services, backends and affinity entries. Required.
	Datapath fastpath.Datapath
	// Source is the slowpath. Required.
	Source Source
	// Services are the VIP:port addresses; every promoted client gets an
	// entry for each. Required (at least one).
	Services []fastpath.Service
	// SampleEvery is written to every backend (fastpath.Backend.SampleEvery).
	SampleEvery uint32
	// Interval is Run's period. 0 means 1s.
	Interval time.Duration
	// Promoter holds the promotion rule's thresholds.
	Promoter affinity.PromoterConfig
	// SignalMaxAge: engine load signals younger than this count as load in
	// rebalancing. 0 means 5s.
	SignalMaxAge time.Duration
	// Logger; nil means slog.Default() with component=steer.
	Logger *slog.Logger
	// Registerer, if set, gets the controller's metrics.
	Registerer prometheus.Registerer
}

// backend is one GPU host as the datapath knows it.
type backend struct {
	id      fastpath.BackendID
	addr    netip.Addr
	gen     uint32
	healthy bool
	present bool // some current replica lives on it
}

// Controller is the fast-path control loop. ObserveRouted is called per
// proxied request; Sync (or Run) is the periodic step.
type Controller struct {
	dp       fastpath.Datapath
	src      Source
	svcs     []fastpath.Service
	sample   uint32
	interval time.Duration
	maxAge   time.Duration
	prom     *affinity.Promoter
	log      *slog.Logger
	m        metrics

	mu        sync.RWMutex // backends and replica mapping
	byHost    map[netip.Addr]*backend
	byID      [fastpath.MaxBackends]*backend
	byReplica []*backend // ReplicaID -> backend, nil = not steerable
	saturated []bool     // ReplicaID -> saturated at the last Sync: no promotion into it
	nextID    int

	conns connTable // recent source ports per client (sample scaling)

	onEntry atomic.Pointer[EntryHook] // SetEntryHook: share entries with peers

	routedMu sync.Mutex
	routed   []uint64 // ReplicaID -> requests observed since the last Sync

	syncMu    sync.Mutex // one Sync at a time; the fields below
	lastSteer [fastpath.MaxBackends]uint64
	ebuf      []affinity.Entry
	cbuf      []affinity.Change
	lbuf      []affinity.ReplicaLoad
}

// ClientKey is the Promoter's key of an IPv4 client: its address in the low
// 32 bits and bit 32 set (never 0, reversible).
func ClientKey(a netip.Addr) uint64 {
	b := a.As4()
	return 1<<32 | uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
}

// New validates opts, adopts the backends already in the datapath (a
// restarted process keeps their ids and generations, so pinned entries stay
// valid), writes the services and runs one Sync.
func New(opts Options) (*Controller, error) {
	if opts.Datapath == nil || opts.Source == nil {
		return nil, errors.New("steer: Datapath and Source are required")
	}
	if len(opts.Services) == 0 {
		return nil, errors.New("steer: at least one service (VIP:port) is required")
	}
	prom, err := affinity.NewPromoter(opts.Promoter)
	if err != nil {
		return nil, fmt.Errorf("steer: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default().With("component", "steer")
	}
	c := &Controller{
		dp: opts.Datapath, src: opts.Source, svcs: append([]fastpath.Service(nil), opts.Services...),
		sample:   opts.SampleEvery,
		interval: opts.Interval, maxAge: opts.SignalMaxAge, prom: prom, log: log,
		byHost: map[netip.Addr]*backend{}, m: newMetrics(),
	}
	if c.interval <= 0 {
		c.interval = time.Second
	}
	if c.maxAge <= 0 {
		c.maxAge = 5 * time.Second
	}
	if opts.Registerer != nil {
		if err := c.m.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("steer: register metrics: %w", err)
		}
	}
	if err := c.dp.SetServices(c.svcs); err != nil {
		return nil, fmt.Errorf("steer: set services: %w", err)
	}
	pinned, err := c.dp.Backends()
	if err != nil {
		return nil, fmt.Errorf("steer: read backends: %w", err)
	}
	for _, b := range pinned {
		nb := &backend{id: b.ID, addr: b.Addr, gen: b.Generation, healthy: b.Healthy}
		c.byHost[b.Addr] = nb
		c.byID[b.ID] = nb
	}
	if len(pinned) > 0 {
		log.Info("adopted pinned fast-path backends", "backends", len(pinned))
	}
	if err := c.Sync(); err != nil {
		return nil, err
	}
	return c, nil
}

// Promoter exposes the promotion rule (stats, tests).
func (c *Controller) Promoter() *affinity.Promoter { return c.prom }

// ObserveRouted feeds one proxied request to the promotion rule and
// writes, re-points or deletes the client's affinity entry as the rule
// says (cmd/warmpath calls it from the slowpath's Observer). Runs on the
// request goroutine; it takes two short locks and, on a decision, one map
// write per service.
func (c *Controller) ObserveRouted(ev *Routed) {
	if !ev.OK {
		return
	}
	a := ev.Client.Addr().Unmap()
	if !a.Is4() {
		return
	}
	key := ClientKey(a)
	c.countRouted(ev.ReplicaID)
	scale := 1.0
	if pre := c.conns.note(key, ev.Client.Port()); !pre && c.sample > 0 && c.dp.Mode() == fastpath.ModeKernel {
		// A promoted client's new connection reached the slowpath: it is
		// the sampled one of every SampleEvery, so it stands for them all.
		scale = float64(c.sample)
	}
	o := affinity.Observation{
		Client: key, Replica: ev.ReplicaID, FirstBlock: ev.FirstBlock, SessionKey: ev.SessionKey,
		PromptTokens: ev.PromptTokens, CachedTokens: ev.PredictedCachedTokens,
		Capacity: c.src.Router().PrefillRate(ev.ReplicaID), Scale: scale, Now: ev.End,
	}
	act, r := c.prom.Observe(&o)
	switch act {
	case affinity.ActionPromote, affinity.ActionMove:
		if c.write(a, r) {
			c.conns.promote(key)
			c.m.action(act).Inc()
			c.share(a, r, true)
		} else {
			c.prom.Demote(key)
			c.conns.demote(key)
		}
	case affinity.ActionDrop:
		c.delete(a)
		c.conns.demote(key)
		c.m.action(act).Inc()
		c.share(a, affinity.NoReplica, false)
	}
}

// write points a's entries at replica r's backend with its current
// generation; false when r has no usable backend or the write failed.
func (c *Controller) write(a netip.Addr, r affinity.ReplicaID) bool {
	c.mu.RLock()
	var b *backend
	if int(r) >= 0 && int(r) < len(c.byReplica) {
		b = c.byReplica[r]
	}
	var id fastpath.BackendID
	var gen uint32
	ok := b != nil && b.healthy && !(int(r) < len(c.saturated) && c.saturated[r])
	if ok {
		id, gen = b.id, b.gen
	}
	c.mu.RUnlock()
	if !ok {
		return false
	}
	for _, svc := range c.svcs {
		if err := c.dp.SetAffinity(fastpath.Affinity{Client: a, Service: svc, Backend: id, Generation: gen}); err != nil {
			c.m.errWrite.Inc()
			c.log.Debug("write affinity", "client", a, "err", err)
			c.delete(a)
			return false
		}
	}
	return true
}

func (c *Controller) delete(a netip.Addr) {
	for _, svc := range c.svcs {
		if err := c.dp.DeleteAffinity(a, svc); err != nil {
			c.m.errDelete.Inc()
			c.log.Debug("delete affinity", "client", a, "err", err)
		}
	}
}

func (c *Controller) countRouted(r affinity.ReplicaID) {
	if r < 0 {
		return
	}
	c.routedMu.Lock()
	if int(r) >= len(c.routed) {
		c.routed = append(c.routed, make([]uint64, int(r)+1-len(c.routed))...)
	}
	c.routed[r]++
	c.routedMu.Unlock()
}

// Run calls Sync every interval until ctx ends. Errors are logged (once
// per distinct message) and counted; the loop keeps going.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.Sync(); err != nil {
			c.m.errSync.Inc()
			if msg := err.Error(); msg != last {
				c.log.Warn("fast-path sync", "err", err)
				last = msg
			}
		} else {
			last = ""
		}
	}
}

// Sync is one control-loop step: backends follow the replicas' hosts and
// health (an unhealthy or removed host gets its generation bumped, so its
// entries stop steering at once), then the entries are re-checked against
// load, eligibility and idleness (Promoter.Rebalance) and the dropped ones
// deleted.
func (c *Controller) Sync() error {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	// A datapath lost mid-run (XDP detached, interface gone) turns into a
	// userspace one here (fastpath.Fallback), logging it once.
	if ck, ok := c.dp.(fastpath.Checker); ok {
		if err := ck.Check(); err != nil {
			return fmt.Errorf("check datapath: %w", err)
		}
	}
	if err := c.syncBackends(); err != nil {
		return err
	}
	return c.rebalance()
}

func (c *Controller) syncBackends() error {
	reps := c.src.Replicas()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.byHost {
		b.present = false
	}
	healthy := map[*backend]bool{}
	maxID := 0
	for i := range reps {
		maxID = max(maxID, reps[i].ID)
	}
	byReplica := make([]*backend, maxID+1)
	for i := range reps {
		r := &reps[i]
		h, err := netip.ParseAddr(r.Host)
		if err != nil || !h.Is4() {
			continue
		}
		b := c.byHost[h]
		if b == nil {
			id, ok := c.freeID()
			if !ok {
				c.log.Warn("fast path: no free backend id, host not steerable", "host", h)
				continue
			}
			b = &backend{id: id, addr: h, gen: 1}
			c.byHost[h] = b
			c.byID[id] = b
		}
		b.present = true
		healthy[b] = healthy[b] || r.Healthy
		if r.ID >= 0 {
			byReplica[r.ID] = b
		}
	}
	c.byReplica = byReplica
	list := make([]fastpath.Backend, 0, len(c.byHost))
	for id := range c.byID {
		b := c.byID[id]
		if b == nil {
			continue
		}
		want := b.present && healthy[b]
		if b.healthy && !want {
			// Unhealthy or removed: every entry written for this host stops
			// counting now; re-admission starts a new generation (the
			// slowpath also forgets its cache then).
			gen, err := c.dp.BumpGeneration(b.id)
			if err != nil {
				return fmt.Errorf("bump generation of backend %d (%s): %w", b.id, b.addr, err)
			}
			b.gen = gen
			c.m.bumps.Inc()
			c.log.Info("fast path: backend out, entries invalidated", "backend", b.id, "host", b.addr, "generation", gen)
		}
		b.healthy = want
		list = append(list, fastpath.Backend{ID: b.id, Addr: b.addr, Healthy: want, Generation: b.gen, SampleEvery: c.sample})
	}
	if err := c.dp.SetBackends(list); err != nil {
		return fmt.Errorf("set backends: %w", err)
	}
	return nil
}

// freeID returns the lowest backend id never used by this controller or
// the pinned state (ids are not reused, so an old entry can never point at
// a new host). Called with mu held.
func (c *Controller) freeID() (fastpath.BackendID, bool) {
	for c.nextID < fastpath.MaxBackends && c.byID[c.nextID] != nil {
		c.nextID++
	}
	if c.nextID >= fastpath.MaxBackends {
		return 0, false
	}
	id := fastpath.BackendID(c.nextID)
	c.nextID++
	return id, true
}

func (c *Controller) rebalance() error {
	now := c.src.Now()
	// The datapath's entries are the truth (a restarted process adopts
	// entries its Promoter never saw).
	type dpEntry struct {
		addr  netip.Addr
		b     fastpath.BackendID
		stale bool
		idle  time.Duration
	}
	seen := map[uint64]dpEntry{}
	c.mu.RLock()
	err := c.dp.RangeAffinity(func(e fastpath.AffinityEntry) bool {
		k := ClientKey(e.Client)
		b := c.byID[e.Backend]
		d := dpEntry{addr: e.Client, b: e.Backend, idle: e.Idle, stale: b == nil || b.gen != e.Generation}
		if old, ok := seen[k]; ok {
			d.stale = d.stale || old.stale
			d.idle = min(d.idle, old.idle)
		}
		seen[k] = d
		return true
	})
	replicaOf := make(map[fastpath.BackendID]affinity.ReplicaID, len(c.byHost))
	for r, b := range c.byReplica {
		if b != nil {
			if _, ok := replicaOf[b.id]; !ok {
				replicaOf[b.id] = affinity.ReplicaID(r)
			}
		}
	}
	c.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("read affinity: %w", err)
	}

	known := map[uint64]affinity.Entry{}
	c.ebuf = c.prom.Promoted(c.ebuf[:0])
	for _, e := range c.ebuf {
		known[e.Client] = e
	}
	for k := range known {
		if d, ok := seen[k]; !ok || d.stale {
			c.prom.Demote(k) // gone from the datapath (or dead): forget it
			c.conns.demote(k)
		}
	}
	entries := c.ebuf[:0]
	for k, d := range seen {
		if d.stale {
			c.delete(d.addr)
			c.m.rebalance("stale").Inc()
			continue
		}
		r, ok := replicaOf[d.b]
		if !ok {
			r = affinity.NoReplica
		}
		used := now - int64(d.idle)
		e := affinity.Entry{Client: k, Replica: r, PromotedAt: used, LastUsed: used}
		if p, ok := known[k]; ok {
			e.PromotedAt, e.CacheValue = p.PromotedAt, p.CacheValue
			e.LastUsed = max(e.LastUsed, p.LastUsed)
		}
		entries = append(entries, e)
	}
	c.ebuf = entries

	// Loads: the router's view, plus steered (datapath) and routed
	// (observed) connections since the last step.
	cnt, err := c.dp.Counters()
	if err != nil {
		return fmt.Errorf("read counters: %w", err)
	}
	c.routedMu.Lock()
	routed := append([]uint64(nil), c.routed...)
	clear(c.routed)
	c.routedMu.Unlock()
	steered := map[affinity.ReplicaID]float64{}
	for _, bc := range cnt.Backends {
		n := bc.SYN.Packets - bc.Sampled.Packets
		d := n - c.lastSteer[bc.ID]
		if n < c.lastSteer[bc.ID] {
			d = n // counters restarted
		}
		c.lastSteer[bc.ID] = n
		if r, ok := replicaOf[bc.ID]; ok {
			steered[r] += float64(d)
		}
	}
	c.lbuf = c.lbuf[:0]
	for _, st := range c.src.Router().Replicas() {
		l := affinity.ReplicaLoadOf(&st, now, c.maxAge)
		l.Steered = steered[st.ID]
		if int(st.ID) >= 0 && int(st.ID) < len(routed) {
			l.Routed = float64(routed[st.ID])
		}
		c.lbuf = append(c.lbuf, l)
	}
	c.markSaturated()
	c.cbuf = c.prom.Rebalance(now, c.lbuf, entries, c.cbuf[:0])
	for _, ch := range c.cbuf {
		d := seen[ch.Client]
		c.delete(d.addr)
		c.conns.demote(ch.Client)
		c.m.rebalance(ch.Reason.String()).Inc()
		c.log.Debug("fast path: entry dropped", "client", d.addr, "reason", ch.Reason.String())
	}
	c.m.entries.Set(float64(len(seen) - len(c.cbuf)))
	return nil
}

// markSaturated records which replicas Rebalance's saturation test finds
// saturated in c.lbuf (affinity.Promoter.Saturated: the same formula and
// thresholds). Until the next Sync no client is promoted or moved into them:
// a client dropped for saturation whose next requests the slowpath still
// routes there (its cache outweighs the queue in the routing cost) would
// otherwise be re-promoted into the same replica and dropped again at the
// next Sync, and while promoted its requests would bypass the slowpath's
// load view.
func (c *Controller) markSaturated() {
	sat := c.prom.Saturated(c.lbuf, nil)
	c.mu.Lock()
	c.saturated = sat
	c.mu.Unlock()
}
