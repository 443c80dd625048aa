package main

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath"
	"github.com/warmpath/warmpath/fastpath/steer"
	"github.com/warmpath/warmpath/slowpath"
	"github.com/warmpath/warmpath/slowpath/cluster"
	"github.com/warmpath/warmpath/slowpath/cluster/natstest"
)

// TestPeerEntries: an entry the controller of edge host A writes reaches
// edge host B's datapath over NATS (slowpath/cluster), pointing at B's
// backend of the same replica; B reports nothing back (no echo loop); a
// drop on A deletes it on B; and B never adopts an entry into a replica
// unhealthy here.
func TestPeerEntries(t *testing.T) {
	url := natstest.URL(natstest.Start(t, nil))

	a, b := newPeerRig(t), newPeerRig(t)
	node := func(name string, r *peerRig) *cluster.Node {
		n, err := cluster.Start(cluster.Options{Router: r.router, Logger: slog.New(slog.DiscardHandler),
			Config: cluster.Config{NATSURL: cluster.URLs{url}, Instance: name, FlushInterval: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		return n
	}
	na, nb := node("a", a), node("b", b)
	a.ctl.SetEntryHook(na.PublishEntry)
	var echoed atomic.Int32
	b.ctl.SetEntryHook(func(netip.Addr, affinity.ReplicaID, bool) { echoed.Add(1) })
	nb.SetEntryHandler(b.ctl.ApplyPeerEntry)
	waitUntil(t, "connected", func() bool { return na.Connected() && nb.Connected() })

	a.promote("10.1.0.9", 2)
	waitUntil(t, "entry on b", func() bool {
		e, ok := b.entry("10.1.0.9")
		return ok && e.Backend == b.backend(2).ID && e.Generation == b.backend(2).Generation
	})
	if n := echoed.Load(); n != 0 {
		t.Fatalf("b's hook saw %d entries applied from a peer", n)
	}

	// A drop decided on a (the client's request went elsewhere without a
	// cache to speak of) removes it on b too.
	a.send("10.1.0.9", 40000, 0, 99, 0)
	if e, ok := a.entry("10.1.0.9"); ok {
		t.Fatalf("a kept the entry: %+v", e)
	}
	waitUntil(t, "entry gone on b", func() bool { _, ok := b.entry("10.1.0.9"); return !ok })

	// Replica 1 is unhealthy on b: a's promotion into it is not adopted.
	b.setHealthy(1, false)
	b.sync()
	a.promote("10.1.0.10", 1)
	a.promote("10.1.0.11", 0) // a later entry that b does adopt: the earlier one has been applied
	waitUntil(t, "second entry on b", func() bool { _, ok := b.entry("10.1.0.11"); return ok })
	if e, ok := b.entry("10.1.0.10"); ok {
		t.Fatalf("b adopted %+v into a replica unhealthy here", e)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// peerRig is one edge host's control loop as serve wires it: a real
// affinity.Router, a userspace datapath, requests observed through
// steerObserver (the slowpath.Observer adapter) and replicas read through
// the steer.Source interface.
type peerRig struct {
	t      *testing.T
	router *affinity.Router
	dp     *fastpath.Userspace
	ctl    *steer.Controller
	obs    slowpath.Observer

	mu   sync.Mutex
	reps []steer.Replica
	now  int64
}

func (r *peerRig) Replicas() []steer.Replica {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]steer.Replica(nil), r.reps...)
}
func (r *peerRig) Router() *affinity.Router { return r.router }
func (r *peerRig) Now() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now
}

func newPeerRig(t *testing.T) *peerRig {
	t.Helper()
	router, err := affinity.NewRouter(affinity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := &peerRig{t: t, router: router, now: int64(time.Hour)}
	for _, host := range []string{"10.2.1.2", "10.2.2.2", "10.2.3.2"} {
		id, err := router.AddReplica(affinity.ReplicaSpec{Name: host + ":8000", Models: []string{"m"}})
		if err != nil {
			t.Fatal(err)
		}
		r.reps = append(r.reps, steer.Replica{ID: int(id), Host: host, Healthy: true})
	}
	r.dp = fastpath.NewUserspace(r.Now)
	r.ctl, err = steer.New(steer.Options{Datapath: r.dp, Source: r, Services: []fastpath.Service{vipLF}, SampleEvery: 16,
		Promoter: affinity.PromoterConfig{IdleTTL: time.Minute}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	r.obs = steerObserver{r.ctl}
	return r
}

var vipLF = netip.MustParseAddrPort("10.100.0.1:8000")

// send observes one completed request of client (addr:port) on replica i
// with a prompt of 1000 tokens, cached of them predicted cached.
func (r *peerRig) send(client string, port uint16, i int, first uint64, cached int) {
	r.t.Helper()
	r.mu.Lock()
	r.now += int64(100 * time.Millisecond)
	now, rep := r.now, r.reps[i]
	r.mu.Unlock()
	r.obs.ObserveRouted(&slowpath.RoutedEvent{
		Client: netip.AddrPortFrom(netip.MustParseAddr(client), port), Model: []byte("m"),
		Replica: rep.Host + ":8000", ReplicaID: affinity.ReplicaID(rep.ID),
		Hashes: []uint64{first, first + 1}, PromptTokens: 1000, PredictedCachedTokens: cached,
		CachedTokens: -1, Status: 200, OK: true, Start: now, End: now,
	})
}

func (r *peerRig) entry(client string) (fastpath.AffinityEntry, bool) {
	r.t.Helper()
	e, ok, err := r.dp.LookupAffinity(netip.MustParseAddr(client), vipLF)
	if err != nil {
		r.t.Fatal(err)
	}
	return e, ok
}

func (r *peerRig) backend(i int) fastpath.Backend {
	r.t.Helper()
	bs, err := r.dp.Backends()
	if err != nil {
		r.t.Fatal(err)
	}
	host := netip.MustParseAddr(r.reps[i].Host)
	for _, b := range bs {
		if b.Addr == host {
			return b
		}
	}
	r.t.Fatalf("no backend for %s in %+v", host, bs)
	return fastpath.Backend{}
}

func (r *peerRig) sync() {
	r.t.Helper()
	if err := r.ctl.Sync(); err != nil {
		r.t.Fatal(err)
	}
}

func (r *peerRig) setHealthy(i int, ok bool) {
	r.mu.Lock()
	r.reps[i].Healthy = ok
	id := r.reps[i].ID
	r.mu.Unlock()
	r.router.SetHealthy(affinity.ReplicaID(id), ok)
}

// promote sends the three consistent cached requests that promote client
// to replica i and checks the entry.
func (r *peerRig) promote(client string, i int) {
	r.t.Helper()
	for range 3 {
		r.send(client, 40000, i, 7, 900)
	}
	e, ok := r.entry(client)
	if b := r.backend(i); !ok || e.Backend != b.ID || e.Generation != b.Generation {
		r.t.Fatalf("entry of %s = %+v (present %v), want backend %+v", client, e, ok, b)
	}
}
