package affinity

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// queueSink collects a Router's peer updates (copying slices) so a test
// can deliver them to another Router, late, twice, or not at all.
type queueSink struct {
	ups []PeerUpdate
}

func (q *queueSink) PeerInsert(id ReplicaID, hashes []uint64) {
	q.ups = append(q.ups, PeerUpdate{Kind: PeerKindInsert, Replica: id, Hashes: slices.Clone(hashes)})
}
func (q *queueSink) PeerTruncate(id ReplicaID, tail uint64, n int) {
	q.ups = append(q.ups, PeerUpdate{Kind: PeerKindTruncate, Replica: id, Tail: tail, N: n})
}
func (q *queueSink) PeerReset(id ReplicaID) {
	q.ups = append(q.ups, PeerUpdate{Kind: PeerKindReset, Replica: id})
}
func (q *queueSink) PeerTail(id ReplicaID, tail uint64) {
	q.ups = append(q.ups, PeerUpdate{Kind: PeerKindTail, Replica: id, Tail: tail})
}
func (q *queueSink) PeerLoad(id ReplicaID, l PeerLoad) {
	q.ups = append(q.ups, PeerUpdate{Kind: PeerKindLoad, Replica: id, Load: l})
}

// take returns the queued updates and empties the queue.
func (q *queueSink) take() []PeerUpdate {
	ups := q.ups
	q.ups = nil
	return ups
}

// peerPair is two routers over the same three replicas (same names, added
// in a different order so their IDs differ, as on two instances) and the
// sink of the first. Updates are translated by replica name.
func peerPair(t *testing.T, policy string) (a, b *Router, sink *queueSink, deliver func(ups []PeerUpdate)) {
	t.Helper()
	var err error
	if a, err = NewRouter(Config{Policy: policy}); err != nil {
		t.Fatal(err)
	}
	if b, err = NewRouter(Config{Policy: policy}); err != nil {
		t.Fatal(err)
	}
	names := []string{"r0", "r1", "r2"}
	for i := range names {
		if _, err := a.AddReplica(ReplicaSpec{Name: names[i], Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.AddReplica(ReplicaSpec{Name: names[len(names)-1-i], Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
	}
	sink = &queueSink{}
	a.SetPeerSink(sink)
	nameOf := map[ReplicaID]string{}
	for _, st := range a.Replicas() {
		nameOf[st.ID] = st.Name
	}
	deliver = func(ups []PeerUpdate) {
		t.Helper()
		out := make([]PeerUpdate, 0, len(ups))
		for _, u := range ups {
			id, ok := b.Lookup(nameOf[u.Replica])
			if !ok {
				t.Fatalf("replica %d of a unknown to b", u.Replica)
			}
			u.Replica = id
			out = append(out, u)
		}
		if err := b.ApplyPeer(3, out); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, sink, deliver
}

func idOf(t *testing.T, r *Router, name string) ReplicaID {
	t.Helper()
	id, ok := r.Lookup(name)
	if !ok {
		t.Fatalf("no replica %s", name)
	}
	return id
}

func peerLoadOf(t *testing.T, r *Router, name string) (own, peer int) {
	t.Helper()
	for _, st := range r.Replicas() {
		if st.Name == name {
			return st.InFlight, st.PeerInFlight
		}
	}
	t.Fatalf("no replica %s", name)
	return 0, 0
}

func TestPeerIndexSharing(t *testing.T) {
	a, b, sink, deliver := peerPair(t, "cost")
	sys := strings.Repeat("You answer questions about the handbook. ", 400) // ~16 KiB
	req := request(t, chatBody("m", sys, "first question"), 1)
	next := request(t, chatBody("m", sys, "second question"), 2)

	// Without sync b knows nothing of the prefix.
	if d := decide(t, b, next); slices.Max(d.CachedTokens) != 0 {
		t.Fatalf("b predicts %v cached before any update", d.CachedTokens)
	}
	var f Flight
	a.Begin(idOf(t, a, "r1"), req, nil, &f)
	a.FirstToken(&f, 10)
	a.End(&f, 20, -1, true)
	deliver(sink.take())

	d := decide(t, b, next)
	if d.Ranked[0] != idOf(t, b, "r1") {
		t.Fatalf("b ranks %v first, want r1 (id %d) where a sent the prefix", d.Ranked[0], idOf(t, b, "r1"))
	}
	want := cachedOn(t, a, next, idOf(t, a, "r1"))
	if want == 0 || d.CachedTokens[0] != want {
		t.Fatalf("b predicts %d cached on r1, a predicts %d", d.CachedTokens[0], want)
	}
	// The applied insert is not echoed back by b (b has no sink here, and
	// a's sink got nothing from b's ApplyPeer).
	if len(sink.ups) != 0 {
		t.Fatalf("a's sink got %d updates from b's apply", len(sink.ups))
	}
}

func TestPeerUpdatesIdempotent(t *testing.T) {
	a, b, sink, deliver := peerPair(t, "cost")
	var ups []PeerUpdate
	for i := range 6 {
		req := request(t, chatBody("m", strings.Repeat(fmt.Sprintf("doc %d ", i%3), 2000), "q"), int64(i))
		var f Flight
		a.Begin(idOf(t, a, fmt.Sprintf("r%d", i%3)), req, nil, &f)
		if i%2 == 0 {
			a.FirstToken(&f, int64(i)+1)
			a.End(&f, int64(i)+2, -1, true)
		}
	}
	ups = sink.take()
	deliver(ups)
	st1, s1 := b.Replicas(), b.Stats()
	deliver(ups)
	deliver(ups[len(ups)/2:]) // a repeated tail, as after a redelivery
	st2, s2 := b.Replicas(), b.Stats()
	if s1.TrackedPairs != s2.TrackedPairs || s1.TrackedBlocks != s2.TrackedBlocks {
		t.Fatalf("index changed on repeat: %d/%d pairs, %d/%d blocks", s1.TrackedPairs, s2.TrackedPairs, s1.TrackedBlocks, s2.TrackedBlocks)
	}
	for i := range st1 {
		if st1[i].PeerInFlight != st2[i].PeerInFlight || st1[i].PeerPendingTokens != st2[i].PeerPendingTokens {
			t.Fatalf("%s: peer load %d/%d -> %d/%d on repeat", st1[i].Name,
				st1[i].PeerInFlight, st1[i].PeerPendingTokens, st2[i].PeerInFlight, st2[i].PeerPendingTokens)
		}
	}
	// The three requests left open on a (odd i: r1, r0, r2) are b's peer
	// load; a's own view does not include them twice.
	for _, name := range []string{"r0", "r1", "r2"} {
		ownA, peerA := peerLoadOf(t, a, name)
		ownB, peerB := peerLoadOf(t, b, name)
		if ownA != 1 || peerA != 0 || ownB != 0 || peerB != 1 {
			t.Fatalf("%s: a own/peer %d/%d, b own/peer %d/%d; want 1/0 and 0/1", name, ownA, peerA, ownB, peerB)
		}
	}
}

func TestPeerLoadSteersAway(t *testing.T) {
	a, b, sink, deliver := peerPair(t, "least-request")
	r0 := idOf(t, a, "r0")
	var fs [4]Flight
	for i := range fs {
		a.Begin(r0, &Request{Model: []byte("m"), PromptTokens: 100}, nil, &fs[i])
	}
	deliver(sink.take())
	req := &Request{Model: []byte("m"), PromptTokens: 100}
	for range 20 {
		if d := decide(t, b, req); d.Ranked[0] == idOf(t, b, "r0") {
			t.Fatal("b ranked r0 first while a has 4 requests in flight there")
		}
	}
	var d Decision
	if err := b.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if l := d.view.r.reps[idOf(t, b, "r0")]; l.totalInFlight() != 4 || l.inFlight.Load() != 0 {
		t.Fatalf("b's r0: total %d own %d, want 4 and 0", l.totalInFlight(), l.inFlight.Load())
	}
	loads := map[string]PeerLoad{}
	a.LocalLoads(func(_ ReplicaID, name string, l PeerLoad) { loads[name] = l })
	if want := (PeerLoad{InFlight: 4, PendingPrefillTokens: 400, PendingRequests: 4}); loads["r0"] != want || loads["r1"] != (PeerLoad{}) {
		t.Fatalf("LocalLoads: %v, want r0 %v and r1 idle", loads, want)
	}
	for i := range fs {
		a.End(&fs[i], 5, -1, true)
	}
	deliver(sink.take())
	if own, peer := peerLoadOf(t, b, "r0"); own != 0 || peer != 0 {
		t.Fatalf("after a's requests ended b sees own %d peer %d", own, peer)
	}

	// A peer that goes quiet is withdrawn by ClearPeer.
	a.Begin(r0, &Request{Model: []byte("m"), PromptTokens: 100}, nil, &fs[0])
	deliver(sink.take())
	if _, peer := peerLoadOf(t, b, "r0"); peer != 1 {
		t.Fatalf("peer in flight %d, want 1", peer)
	}
	b.ClearPeer(3)
	if _, peer := peerLoadOf(t, b, "r0"); peer != 0 {
		t.Fatalf("after ClearPeer: peer in flight %d", peer)
	}
}

func TestPeerTruncateAndReset(t *testing.T) {
	a, b, sink, deliver := peerPair(t, "cost")
	sys := strings.Repeat("Policy text. ", 1000)
	req := request(t, chatBody("m", sys, "q"), 1)
	r2a, r2b := idOf(t, a, "r2"), idOf(t, b, "r2")

	var f Flight
	a.Begin(r2a, req, nil, &f)
	deliver(sink.take())
	if cachedOn(t, b, req, r2b) == 0 {
		t.Fatal("insert not applied")
	}
	a.End(&f, 5, -1, false) // failed before its first token: rolled back
	deliver(sink.take())
	if got := cachedOn(t, b, req, r2b); got != 0 {
		t.Fatalf("after the peer's rollback b predicts %d cached", got)
	}

	warm(a, r2a, req)
	deliver(sink.take())
	if cachedOn(t, b, req, r2b) == 0 {
		t.Fatal("insert not applied")
	}
	a.ResetCache(r2a)
	deliver(sink.take())
	if got := cachedOn(t, b, req, r2b); got != 0 {
		t.Fatalf("after the peer's reset b predicts %d cached", got)
	}

	// Out of order: a truncation before its insert removes nothing, and
	// unknown replicas and bad slots are handled.
	if err := b.ApplyPeer(0, []PeerUpdate{{Kind: PeerKindTruncate, Replica: r2b, Tail: 42, N: 3}, {Kind: PeerKindReset, Replica: 99}}); err != nil {
		t.Fatal(err)
	}
	if err := b.ApplyPeer(MaxPeers, nil); !errors.Is(err, ErrPeerSlot) {
		t.Fatalf("slot MaxPeers: %v", err)
	}
}

func TestExportImportIndex(t *testing.T) {
	a, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		spec := ReplicaSpec{Name: fmt.Sprintf("r%d", i), Models: []string{"m"}}
		if _, err := a.AddReplica(spec); err != nil {
			t.Fatal(err)
		}
		if _, err := c.AddReplica(spec); err != nil {
			t.Fatal(err)
		}
	}
	var reqs []*Request
	for i := range 30 {
		docs := strings.Repeat(fmt.Sprintf("document %d. ", i%7), 300+40*i)
		req := request(t, chatBody("m", docs, fmt.Sprintf("question %d", i)), int64(i))
		reqs = append(reqs, req)
		warm(a, ReplicaID(i%3), req)
	}
	export := func(limit int) map[string]int {
		n := map[string]int{}
		a.ExportIndex(limit, func(name string, hs, ps []uint64) {
			n[name] = len(hs)
			if err := c.ImportIndex(idOf(t, c, name), hs, ps); err != nil {
				t.Fatal(err)
			}
		})
		return n
	}
	export(1 << 20)
	if sa, sc := a.Stats(), c.Stats(); sa.TrackedPairs != sc.TrackedPairs || sa.TrackedBlocks != sc.TrackedBlocks {
		t.Fatalf("full snapshot: a %d pairs %d blocks, c %d %d", sa.TrackedPairs, sa.TrackedBlocks, sc.TrackedPairs, sc.TrackedBlocks)
	}
	for _, req := range reqs {
		for id := range ReplicaID(3) {
			if ga, gc := cachedOn(t, a, req, id), cachedOn(t, c, req, id); ga != gc {
				t.Fatalf("replica %d: a predicts %d cached, c %d", id, ga, gc)
			}
		}
	}
	checkIndex(t, c.idx)

	// A bounded snapshot keeps each replica's most recent blocks and the
	// prefix property (the binary-search match equals the linear scan).
	for _, id := range []ReplicaID{0, 1, 2} {
		c.ResetCache(id)
	}
	for name, n := range export(50) {
		if n != 50 {
			t.Fatalf("%s: exported %d blocks, want 50", name, n)
		}
	}
	if got := c.Stats().TrackedPairs; got != 150 {
		t.Fatalf("bounded snapshot: %d pairs, want 150", got)
	}
	checkIndex(t, c.idx)
	for _, req := range reqs {
		if fast, lin := matches(c.idx, req.Hashes, false), matches(c.idx, req.Hashes, true); !maps.Equal(fast, lin) {
			t.Fatalf("prefix property broken by a bounded snapshot: longest %v, linear %v", fast, lin)
		}
	}
	last := reqs[len(reqs)-1]
	if cachedOn(t, c, last, ReplicaID((len(reqs)-1)%3)) == 0 {
		t.Fatal("the most recent request's prefix is missing from a bounded snapshot")
	}
	if err := c.ImportIndex(0, []uint64{1}, nil); err == nil {
		t.Fatal("mismatched slices accepted")
	}
}

func TestPeerTailShared(t *testing.T) {
	a, b, sink, deliver := peerPair(t, "cost")
	sys := strings.Repeat("Chat rules. ", 600)
	q1, ans, q2 := strings.Repeat("first question ", 40), strings.Repeat("an answer ", 60), strings.Repeat("second question ", 40)
	turn1 := request(t, chatBody("m", sys, q1), 1)
	turn2 := request(t, chatBody("m", sys, q1, ans, q2), 2)
	r1a, r1b := idOf(t, a, "r1"), idOf(t, b, "r1")
	var f Flight
	a.Begin(r1a, turn1, nil, &f)
	a.FirstToken(&f, 10)
	a.End(&f, 20, -1, true)
	deliver(sink.take())
	held := cachedOn(t, b, turn2, r1b) / b.bt
	if held == 0 || held >= len(turn2.Hashes) {
		t.Fatalf("turn 2 holds %d of %d blocks on r1", held, len(turn2.Hashes))
	}
	if !b.finishedTail(turn2.Hashes[held-1], r1b) {
		t.Fatal("b does not know that turn 1 finished on r1: no continuation credit for turn 2 there")
	}
	if b.finishedTail(turn2.Hashes[held-1], idOf(t, b, "r0")) {
		t.Fatal("tail recorded for the wrong replica")
	}
	// and which replica served it, for keeping the next turn there on
	// slot engines (CostPolicy.keepTurn)
	if id, ok := b.takeTurn(turn2.Hashes[held-1]); !ok || id != r1b {
		t.Fatalf("b's record of turn 1's replica: %v %v, want %v", id, ok, r1b)
	}
}
