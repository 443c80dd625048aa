package cluster

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmpath/warmpath/affinity"
)

// TestNodeSharesIndexAndLoad: what instance A routes, instance B predicts
// (index inserts) and counts (load) over a real NATS server, with replica
// IDs that differ between the two.
func TestNodeSharesIndexAndLoad(t *testing.T) {
	ns := startNATS(t, 0)
	ra, rb := newRouter(t, affinity.Config{}, 0, 1, 2), newRouter(t, affinity.Config{}, 2, 1, 0)
	a := startNode(t, testCfg(natsURL(ns), "a"), ra)
	b := startNode(t, testCfg(natsURL(ns), "b"), rb)
	waitFor(t, "both connected", func() bool { return a.Connected() && b.Connected() })
	waitFor(t, "peers see each other", func() bool { return len(a.Peers()) == 1 && len(b.Peers()) == 1 })

	hs := chain(1, 20)
	if got := cachedOn(t, rb, "r1:1", hs); got != 0 {
		t.Fatalf("b predicts %d cached before any update", got)
	}
	route(t, ra, "r1:1", hs)
	want := cachedOn(t, ra, "r1:1", hs)
	waitFor(t, "b learns a's prefix", func() bool { return cachedOn(t, rb, "r1:1", hs) == want })
	if got := cachedOn(t, rb, "r0:1", hs); got != 0 {
		t.Fatalf("b predicts %d cached on r0, where nothing was sent", got)
	}
	// The finished request's tail (continuation credit) reaches b too.
	waitFor(t, "b receives a's finished tail", func() bool { return testutil.ToFloat64(b.m.received[recTail]) >= 1 })

	// A request in flight on a counts in b's load view, and leaves it.
	var f affinity.Flight
	ra.Begin(lookup(t, ra, "r2:1"), req(chain(2, 4)), nil, &f)
	waitFor(t, "b sees a's in-flight request", func() bool { return peerInFlight(t, rb, "r2:1") == 1 })
	ra.End(&f, 5, -1, true)
	waitFor(t, "b sees it end", func() bool { return peerInFlight(t, rb, "r2:1") == 0 })
	if own := peerInFlight(t, ra, "r2:1"); own != 0 {
		t.Fatalf("a counts %d peer in-flight on r2: its own updates echoed", own)
	}
	if testutil.ToFloat64(a.m.sent[recInsert]) == 0 || testutil.ToFloat64(b.m.received[recInsert]) == 0 {
		t.Fatal("insert counters did not move")
	}
}

// TestPeerTimeoutWithdrawsLoad: a peer that goes silent (its node stops
// without a word) has its load withdrawn after peer_timeout.
func TestPeerTimeoutWithdrawsLoad(t *testing.T) {
	ra, rb, a, b, f := busyPair(t)
	a.Close() // a's request stays in flight, but nobody says so any more
	waitFor(t, "b withdraws a's load", func() bool { return peerInFlight(t, rb, "r0:1") == 0 })
	if len(b.Peers()) != 0 {
		t.Fatalf("b still lists peers %v", b.Peers())
	}
	if g := testutil.ToFloat64(b.m.peers); g != 0 {
		t.Fatalf("peers_seen = %v after the timeout", g)
	}
	ra.End(f, 5, -1, true)
}

// TestSnapshotWarmUp: an instance started late predicts the cached
// prefixes its peer routed before it existed, without routing any itself.
func TestSnapshotWarmUp(t *testing.T) {
	ns := startNATS(t, 0)
	ra := newRouter(t, affinity.Config{})
	a := startNode(t, testCfg(natsURL(ns), "a"), ra)
	waitFor(t, "a connected", a.Connected)
	var prompts [][]uint64
	for p := range 30 {
		hs := chain(100+p, 10)
		prompts = append(prompts, hs)
		route(t, ra, testReplicas[p%3], hs)
	}
	rb := newRouter(t, affinity.Config{}, 2, 0, 1)
	b := startNode(t, testCfg(natsURL(ns), "late"), rb)
	waitFor(t, "b imports a's snapshot", func() bool {
		for p, hs := range prompts {
			if cachedOn(t, rb, testReplicas[p%3], hs) != cachedOn(t, ra, testReplicas[p%3], hs) {
				return false
			}
		}
		return true
	})
	if got := testutil.ToFloat64(b.m.snapshotImported); got != 30*10 {
		t.Fatalf("imported %v blocks, want %d", got, 30*10)
	}
	if got := testutil.ToFloat64(a.m.snapshotSent); got != 30*10 {
		t.Fatalf("a sent %v blocks, want %d", got, 30*10)
	}
}

// TestSnapshotChunks: a snapshot larger than max_batch_bytes is split into
// chunks that each fit and together hold every block in order.
func TestSnapshotChunks(t *testing.T) {
	r := newRouter(t, affinity.Config{})
	for p := range 50 {
		route(t, r, testReplicas[p%3], chain(p+1, 40))
	}
	cfg := testCfg("nats://127.0.0.1:1", "a")
	cfg.MaxBatchBytes = 4096
	n, err := newNode(Options{Config: cfg, Router: r})
	if err != nil {
		t.Fatal(err)
	}
	chunks := n.exportChunks(1)
	if len(chunks) < 50*40*16/cfg.MaxBatchBytes {
		t.Fatalf("%d chunks for 2000 blocks of 16 bytes in 4 KiB chunks", len(chunks))
	}
	got := map[string][]uint64{}
	for i, c := range chunks {
		if len(c.data) > cfg.MaxBatchBytes+256 {
			t.Fatalf("chunk %d is %d bytes", i, len(c.data))
		}
		var m Message
		if err := Decode(c.data, &m); err != nil {
			t.Fatal(err)
		}
		for _, rec := range m.Records {
			name := m.Names[rec.Replica].Name
			got[name] = append(got[name], rec.Hashes...)
		}
	}
	want := map[string][]uint64{}
	r.ExportIndex(cfg.SnapshotMaxBlocks, func(name string, hs, _ []uint64) { want[name] = append([]uint64(nil), hs...) })
	for name, hs := range want {
		if !equalU64(got[name], hs) {
			t.Fatalf("replica %s: chunks carry %d blocks, export has %d (or order differs)", name, len(got[name]), len(hs))
		}
	}
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// pair is a sender and a receiver node driven without NATS: the test takes
// the sender's encoded batches and hands them to the receiver as it likes
// (late, twice, never).
func pair(t *testing.T, recvCfg affinity.Config) (ra, rb *affinity.Router, a, b *Node) {
	t.Helper()
	ra, rb = newRouter(t, affinity.Config{}), newRouter(t, recvCfg, 1, 2, 0)
	var err error
	if a, err = newNode(Options{Config: testCfg("nats://127.0.0.1:1", "a"), Router: ra, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	if b, err = newNode(Options{Config: testCfg("nats://127.0.0.1:1", "b"), Router: rb, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	a.connected.Store(true)
	ra.SetPeerSink(a)
	return ra, rb, a, b
}

func take(t *testing.T, n *Node, at time.Time) []byte {
	t.Helper()
	out, _ := n.encodeBatch(false, at.UnixNano())
	return bytes.Clone(out)
}

func TestApplyBatch(t *testing.T) {
	now := time.Now()
	t.Run("idempotent re-delivery", func(t *testing.T) {
		ra, rb, a, b := pair(t, affinity.Config{})
		hs := chain(1, 12)
		var f affinity.Flight
		ra.Begin(lookup(t, ra, "r1:1"), req(hs), nil, &f)
		batch := take(t, a, now)
		b.applyBatch(batch, now)
		cached, load := cachedOn(t, rb, "r1:1", hs), peerInFlight(t, rb, "r1:1")
		if cached == 0 || load != 1 {
			t.Fatalf("after one delivery: cached %d, peer in flight %d", cached, load)
		}
		for range 3 {
			b.applyBatch(batch, now)
		}
		if c, l := cachedOn(t, rb, "r1:1", hs), peerInFlight(t, rb, "r1:1"); c != cached || l != load {
			t.Fatalf("after re-delivery: cached %d (was %d), peer in flight %d (was %d)", c, cached, l, load)
		}
		// A newer batch (the request ended), then the old one again: the
		// old absolute load must not overwrite the newer one.
		ra.End(&f, 5, -1, true)
		b.applyBatch(take(t, a, now), now)
		b.applyBatch(batch, now)
		if l := peerInFlight(t, rb, "r1:1"); l != 0 {
			t.Fatalf("a replayed old batch set peer in flight back to %d", l)
		}
	})
	t.Run("stale batch dropped", func(t *testing.T) {
		ra, rb, a, b := pair(t, affinity.Config{})
		hs := chain(2, 8)
		route(t, ra, "r0:1", hs)
		b.applyBatch(take(t, a, now.Add(-3*time.Second)), now)
		if c := cachedOn(t, rb, "r0:1", hs); c != 0 {
			t.Fatalf("stale batch applied: %d cached", c)
		}
		if got := testutil.ToFloat64(b.m.batchDropped[dropStale]); got != 1 {
			t.Fatalf("stale drops = %v, want 1", got)
		}
	})
	t.Run("hash config mismatch dropped", func(t *testing.T) {
		ra, rb, a, b := pair(t, affinity.Config{Hash: affinity.HashConfig{BlockTokens: 32}})
		hs := chain(3, 8)
		route(t, ra, "r2:1", hs)
		b.applyBatch(take(t, a, now), now)
		if c := cachedOn(t, rb, "r2:1", hs); c != 0 {
			t.Fatalf("batch with another block size applied: %d cached", c)
		}
		if got := testutil.ToFloat64(b.m.batchDropped[dropMismatch]); got != 1 {
			t.Fatalf("mismatch drops = %v, want 1", got)
		}
	})
	t.Run("gap counted", func(t *testing.T) {
		ra, rb, a, b := pair(t, affinity.Config{})
		route(t, ra, "r0:1", chain(4, 2))
		b.applyBatch(take(t, a, now), now)
		route(t, ra, "r0:1", chain(5, 2))
		_ = take(t, a, now) // lost
		hs := chain(6, 2)
		route(t, ra, "r0:1", hs)
		b.applyBatch(take(t, a, now), now)
		if got := testutil.ToFloat64(b.m.batchDropped[dropGap]); got != 1 {
			t.Fatalf("gap = %v, want 1", got)
		}
		if c := cachedOn(t, rb, "r0:1", hs); c == 0 {
			t.Fatal("batch after the gap not applied")
		}
	})
	t.Run("garbage counted", func(t *testing.T) {
		_, _, _, b := pair(t, affinity.Config{})
		b.applyBatch([]byte("PUB nonsense"), now)
		if got := testutil.ToFloat64(b.m.batchDropped[dropDecode]); got != 1 {
			t.Fatalf("decode drops = %v, want 1", got)
		}
	})
	t.Run("fast-path entries", func(t *testing.T) {
		ra, rb, a, b := pair(t, affinity.Config{})
		var mu sync.Mutex
		var got []entryUp
		b.SetEntryHandler(func(c netip.Addr, r affinity.ReplicaID, add bool) {
			mu.Lock()
			got = append(got, entryUp{c, r, add})
			mu.Unlock()
		})
		c := netip.MustParseAddr("192.0.2.7")
		a.PublishEntry(c, lookup(t, ra, "r2:1"), true)
		a.PublishEntry(c, lookup(t, ra, "r2:1"), false)
		b.applyBatch(take(t, a, now), now)
		want := []entryUp{{c, lookup(t, rb, "r2:1"), true}, {c, lookup(t, rb, "r2:1"), false}}
		if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("entries = %v, want %v", got, want)
		}
	})
}

func TestSinkDropsWhenDisconnectedOrFull(t *testing.T) {
	r := newRouter(t, affinity.Config{})
	cfg := testCfg("nats://127.0.0.1:1", "a")
	cfg.MaxBatchBytes = 1024
	n, err := newNode(Options{Config: cfg, Router: r})
	if err != nil {
		t.Fatal(err)
	}
	n.PeerInsert(0, chain(1, 4))
	if got := testutil.ToFloat64(n.m.updDropped[dropDisconnected]); got != 1 {
		t.Fatalf("disconnected drops = %v, want 1", got)
	}
	n.connected.Store(true)
	for range 100 { // nobody flushes: the batch fills up
		n.PeerInsert(0, chain(1, 4))
	}
	if got := testutil.ToFloat64(n.m.updDropped[dropOverflow]); got == 0 || len(n.pend) > cfg.MaxBatchBytes {
		t.Fatalf("overflow drops = %v, pending %d bytes (max %d)", got, len(n.pend), cfg.MaxBatchBytes)
	}
}

func TestSinkAllocs(t *testing.T) {
	r := newRouter(t, affinity.Config{})
	n, err := newNode(Options{Config: testCfg("nats://127.0.0.1:1", "a"), Router: r})
	if err != nil {
		t.Fatal(err)
	}
	n.connected.Store(true)
	hs := chain(1, 32)
	n.PeerLoad(2, affinity.PeerLoad{InFlight: 1})
	allocs := testing.AllocsPerRun(200, func() {
		n.PeerInsert(1, hs)
		n.PeerLoad(1, affinity.PeerLoad{InFlight: 1})
		n.PeerTruncate(1, 5, 2)
		n.PublishEntry(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 1, true)
		n.encodeBatch(false, 1)
	})
	if allocs != 0 {
		t.Fatalf("sink + encode allocate %v per request", allocs)
	}
}

func TestPeerRestartAndDuplicateName(t *testing.T) {
	now := time.Now()
	ra, rb, a, b := pair(t, affinity.Config{})
	route(t, ra, "r0:1", chain(7, 2))
	b.applyBatch(take(t, a, now), now)
	a.seq += uint64(time.Minute) // a restarted: its sequence restarts from its start time
	hs := chain(8, 2)
	route(t, ra, "r1:1", hs)
	b.applyBatch(take(t, a, now), now)
	if got := testutil.ToFloat64(b.m.batchDropped[dropGap]); got != 0 {
		t.Fatalf("a restart counted as %v lost batches", got)
	}
	if cachedOn(t, rb, "r1:1", hs) == 0 {
		t.Fatal("batch after the restart not applied")
	}
	// An instance with the receiver's own name is ignored and counted.
	a.cfg.Instance = "b"
	hs = chain(9, 2)
	route(t, ra, "r2:1", hs)
	b.applyBatch(take(t, a, now), now)
	if cachedOn(t, rb, "r2:1", hs) != 0 || testutil.ToFloat64(b.m.batchDropped[dropMismatch]) != 1 {
		t.Fatal("a batch under the receiver's own instance name was applied")
	}
}

// TestSnapshotRateLimited: a node answers at most one snapshot request per
// interval (a snapshot walks the index and fills the wire); the next asker
// in the interval gets nothing from it (counted), and warms up from a peer
// that has not answered lately.
func TestSnapshotRateLimited(t *testing.T) {
	ns := startNATS(t, 0)
	ra := newRouter(t, affinity.Config{})
	a := startNode(t, testCfg(natsURL(ns), "a"), ra)
	a.snapEvery.Store(int64(time.Hour)) // no wall-clock race: the second request is always within it
	waitFor(t, "a connected", a.Connected)
	for p := range 10 {
		route(t, ra, testReplicas[p%3], chain(100+p, 10))
	}
	b := startNode(t, testCfg(natsURL(ns), "b"), newRouter(t, affinity.Config{}))
	waitFor(t, "b imports a's snapshot", func() bool { return testutil.ToFloat64(b.m.snapshotImported) == 100 })
	c := startNode(t, testCfg(natsURL(ns), "c"), newRouter(t, affinity.Config{}))
	waitFor(t, "a refuses c's request", func() bool { return testutil.ToFloat64(a.m.batchDropped[dropRateLimited]) == 1 })
	waitFor(t, "c warms up from b", func() bool { return testutil.ToFloat64(c.m.snapshotImported) == 100 })
	if got := testutil.ToFloat64(a.m.snapshotSent); got != 100 {
		t.Fatalf("a sent %v blocks, want one snapshot's 100", got)
	}
}

// TestWarnings: plaintext and unauthenticated NATS and unkeyed hashes are
// each named at start.
func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		keyed bool
		want  []string
	}{
		{"plaintext, no auth, unkeyed", Config{NATSURL: URLs{"nats://10.0.0.1:4222"}}, false, []string{"plaintext", "unauthenticated", "unkeyed"}},
		{"tls, nkey, keyed", Config{NATSURL: URLs{"tls://10.0.0.1:4222"}, NkeySeedFile: "/x"}, true, nil},
		{"URL credentials", Config{NATSURL: URLs{"tls://u:p@10.0.0.1:4222"}}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Warnings(tc.cfg, tc.keyed)
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
