package main

import (
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath/steer/steertest"
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

	a, b := steertest.New(t, false, 16), steertest.New(t, false, 16)
	node := func(name string, r *steertest.Rig) *cluster.Node {
		n, err := cluster.Start(cluster.Options{Router: r.Src.Router(), Logger: slog.New(slog.DiscardHandler),
			Config: cluster.Config{NATSURL: cluster.URLs{url}, Instance: name, FlushInterval: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		return n
	}
	na, nb := node("a", a), node("b", b)
	a.C.SetEntryHook(na.PublishEntry)
	var echoed atomic.Int32
	b.C.SetEntryHook(func(netip.Addr, affinity.ReplicaID, bool) { echoed.Add(1) })
	nb.SetEntryHandler(b.C.ApplyPeerEntry)
	waitUntil(t, "connected", func() bool { return na.Connected() && nb.Connected() })

	a.Promote("10.1.0.9", 2)
	waitUntil(t, "entry on b", func() bool {
		e, ok := b.Entry("10.1.0.9")
		return ok && e.Backend == b.Backend(2).ID && e.Generation == b.Backend(2).Generation
	})
	if n := echoed.Load(); n != 0 {
		t.Fatalf("b's hook saw %d entries applied from a peer", n)
	}

	// A drop decided on a (the client's request went elsewhere without a
	// cache to speak of) removes it on b too.
	a.Send("10.1.0.9", 40000, 0, 99, 0)
	if e, ok := a.Entry("10.1.0.9"); ok {
		t.Fatalf("a kept the entry: %+v", e)
	}
	waitUntil(t, "entry gone on b", func() bool { _, ok := b.Entry("10.1.0.9"); return !ok })

	// Replica 1 is unhealthy on b: a's promotion into it is not adopted.
	b.Src.SetHealthy(1, false)
	b.Sync()
	a.Promote("10.1.0.10", 1)
	a.Promote("10.1.0.11", 0) // a later entry that b does adopt: the earlier one has been applied
	waitUntil(t, "second entry on b", func() bool { _, ok := b.Entry("10.1.0.11"); return ok })
	if e, ok := b.Entry("10.1.0.10"); ok {
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
