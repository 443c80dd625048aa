package cluster

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/warmpath/warmpath/slowpath/cluster/natstest"

	"github.com/warmpath/warmpath/affinity"
)

// startNATS runs an embedded NATS server on 127.0.0.1 (port 0: random) and
// stops it at cleanup.
func startNATS(t testing.TB, port int) *server.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return startNATSWith(t, &server.Options{Port: port})
}

// startNATSWith runs an embedded NATS server with opts on 127.0.0.1.
func startNATSWith(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	return natstest.Start(t, opts)
}

func natsURL(s *server.Server) string { return natstest.URL(s) }

func natsPort(s *server.Server) int { return s.Addr().(*net.TCPAddr).Port }

var testReplicas = []string{"r0:1", "r1:1", "r2:1"}

// newRouter builds a router over testReplicas, added in the given order of
// indices so that IDs differ between instances as they may in production.
func newRouter(t testing.TB, cfg affinity.Config, order ...int) *affinity.Router {
	t.Helper()
	r, err := affinity.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(order) == 0 {
		order = []int{0, 1, 2}
	}
	for _, i := range order {
		if _, err := r.AddReplica(affinity.ReplicaSpec{Name: testReplicas[i], Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// testCfg is a fast cluster config for tests.
func testCfg(url, instance string) Config {
	return Config{
		NATSURL: URLs{url}, Instance: instance, FlushInterval: time.Millisecond,
		Heartbeat: 20 * time.Millisecond, PeerTimeout: 100 * time.Millisecond, ReconnectWait: 20 * time.Millisecond,
	}
}

func startNode(t testing.TB, cfg Config, r *affinity.Router) *Node {
	t.Helper()
	n, err := Start(Options{Config: cfg, Router: r, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// chain is a synthetic chain of n block hashes for prompt p.
func chain(p, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(p)<<32 | uint64(i+1)
	}
	return hs
}

func req(hs []uint64) *affinity.Request {
	return &affinity.Request{Model: []byte("m"), Hashes: hs, PromptTokens: len(hs) * 64, Now: 1}
}

// route sends a request for hs through r to replica name and finishes it
// (ok).
func route(t testing.TB, r *affinity.Router, name string, hs []uint64) {
	t.Helper()
	var f affinity.Flight
	r.Begin(lookup(t, r, name), req(hs), nil, &f)
	r.FirstToken(&f, 2)
	r.End(&f, 3, -1, true)
}

func lookup(t testing.TB, r *affinity.Router, name string) affinity.ReplicaID {
	t.Helper()
	id, ok := r.Lookup(name)
	if !ok {
		t.Fatalf("no replica %s", name)
	}
	return id
}

// cachedOn is r's predicted cached tokens of hs on replica name.
func cachedOn(t testing.TB, r *affinity.Router, name string, hs []uint64) int {
	t.Helper()
	var d affinity.Decision
	if err := r.Decide(req(hs), &d); err != nil {
		t.Fatal(err)
	}
	id := lookup(t, r, name)
	for i, x := range d.Ranked {
		if x == id {
			return d.CachedTokens[i]
		}
	}
	return 0
}

func peerInFlight(t testing.TB, r *affinity.Router, name string) int {
	t.Helper()
	for _, st := range r.Replicas() {
		if st.Name == name {
			return st.PeerInFlight
		}
	}
	t.Fatalf("no replica %s", name)
	return 0
}

// waitFor polls cond every 5ms for up to 5s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// busyPair connects nodes a and b (routers ra, rb) over a fresh NATS
// server and begins one request on a's replica r0:1, returning once b
// sees it in flight.
func busyPair(t *testing.T) (ra, rb *affinity.Router, a, b *Node, f *affinity.Flight) {
	t.Helper()
	ns := startNATS(t, 0)
	ra, rb = newRouter(t, affinity.Config{}), newRouter(t, affinity.Config{})
	a = startNode(t, testCfg(natsURL(ns), "a"), ra)
	b = startNode(t, testCfg(natsURL(ns), "b"), rb)
	waitFor(t, "connected", func() bool { return a.Connected() && b.Connected() })
	f = new(affinity.Flight)
	ra.Begin(lookup(t, ra, "r0:1"), req(chain(1, 4)), nil, f)
	waitFor(t, "b sees a's load", func() bool { return peerInFlight(t, rb, "r0:1") == 1 })
	return ra, rb, a, b, f
}
