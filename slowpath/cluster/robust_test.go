package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmpath/warmpath/affinity"
)

// Regression tests for the review of slowpath/cluster (H1..M4, L1..L6).

// syncBuf is a log sink safe for concurrent writers.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// offlineNode is a node that is never connected (applyBatch driven).
func offlineNode(t *testing.T, r *affinity.Router, log *slog.Logger) *Node {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n, err := newNode(Options{Config: testCfg("nats://x:1", "b"), Router: r, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// batch is a batch from instance "a" (incarnation inc) naming r0:1 as
// sender id 0 and r1:1 as 1, with the given loads by sender id.
func batch(n *Node, flags byte, inc, seq uint64, sendNs int64, loads map[uint32]int32) []byte {
	out := appendHeader(nil, msgBatch, flags, n.fp, inc, seq, sendNs, "a")
	out = appendUvarint(out, 2)
	out = appendTableEntry(out, 0, "r0:1")
	out = appendTableEntry(out, 1, "r1:1")
	for id := uint32(0); id < 2; id++ {
		if l, ok := loads[id]; ok {
			out = appendLoad(out, id, affinity.PeerLoad{InFlight: l})
		}
	}
	return out
}

// H1a: a load that drops to zero while NATS is down (a blip shorter than
// peer_timeout) is healed by the next heartbeat, a full-load batch. Old
// code: heartbeats sent only non-zero loads, the peer kept the load.
func TestLostZeroLoadHealedByHeartbeat(t *testing.T) {
	ns := startNATS(t, 0)
	port := natsPort(ns)
	ra, rb := newRouter(t, affinity.Config{}), newRouter(t, affinity.Config{})
	cfg := func(name string) Config {
		c := testCfg(natsURL(ns), name)
		c.PeerTimeout = time.Minute // the outage is far shorter
		return c
	}
	a := startNode(t, cfg("a"), ra)
	b := startNode(t, cfg("b"), rb)
	waitFor(t, "connected", func() bool { return a.Connected() && b.Connected() })
	var f affinity.Flight
	ra.Begin(lookup(t, ra, "r0:1"), req(chain(1, 4)), nil, &f)
	waitFor(t, "b sees a's load", func() bool { return peerInFlight(t, rb, "r0:1") == 1 })

	ns.Shutdown()
	ns.WaitForShutdown()
	waitFor(t, "a notices", func() bool { return !a.Connected() })
	ra.End(&f, 5, -1, true) // a's load on r0 drops to 0: not sent (down)
	startNATS(t, port)
	waitFor(t, "reconnected", func() bool { return a.Connected() && b.Connected() })
	waitFor(t, "b drops a's finished request", func() bool { return peerInFlight(t, rb, "r0:1") == 0 })
}

// H1 unit: a full-load batch zeroes what it does not name; a late one
// changes nothing.
func TestFullBatchReplacesLoads(t *testing.T) {
	rb := newRouter(t, affinity.Config{})
	b := offlineNode(t, rb, nil)
	now := time.Now()
	b.applyBatch(batch(b, 0, 9, 1, now.UnixNano(), map[uint32]int32{0: 3, 1: 2}), now)
	if got := peerInFlight(t, rb, "r0:1") + peerInFlight(t, rb, "r1:1"); got != 5 {
		t.Fatalf("peer in-flight %d, want 5", got)
	}
	b.applyBatch(batch(b, flagFull, 9, 3, now.UnixNano(), map[uint32]int32{1: 1}), now)
	if r0, r1 := peerInFlight(t, rb, "r0:1"), peerInFlight(t, rb, "r1:1"); r0 != 0 || r1 != 1 {
		t.Fatalf("after a full batch naming r1=1: r0 %d r1 %d, want 0 1", r0, r1)
	}
	b.applyBatch(batch(b, flagFull, 9, 2, now.UnixNano(), map[uint32]int32{0: 4}), now) // late
	if r0, r1 := peerInFlight(t, rb, "r0:1"), peerInFlight(t, rb, "r1:1"); r0 != 0 || r1 != 1 {
		t.Fatalf("a late full batch was applied: r0 %d r1 %d, want 0 1", r0, r1)
	}
}

// H1b: a peer that restarts under the same name within peer_timeout (a
// new incarnation) has its predecessor's load withdrawn at once, not merely
// logged as "peer restarted" with the load kept.
func TestRestartWithdrawsPredecessorLoad(t *testing.T) {
	rb := newRouter(t, affinity.Config{})
	b := offlineNode(t, rb, nil)
	now := time.Now()
	b.applyBatch(batch(b, 0, 1111, 500, now.UnixNano(), map[uint32]int32{0: 3}), now)
	if got := peerInFlight(t, rb, "r0:1"); got != 3 {
		t.Fatalf("peer in-flight %d, want 3", got)
	}
	b.applyBatch(batch(b, 0, 2222, 1, now.UnixNano(), map[uint32]int32{1: 1}), now) // crashed, restarted
	if r0, r1 := peerInFlight(t, rb, "r0:1"), peerInFlight(t, rb, "r1:1"); r0 != 0 || r1 != 1 {
		t.Fatalf("after the restart: r0 %d r1 %d, want 0 1 (predecessor's load withdrawn)", r0, r1)
	}
}

// H1c: a replica removed on the sender while busy: its load is withdrawn
// by the next heartbeat, and heartbeats stop re-sending it (no
// unknown_replica drops); the peer does not keep it forever.
func TestRemovedReplicaLoadWithdrawn(t *testing.T) {
	ra, rb, a, b, f := busyPair(t)
	ra.RemoveReplica(lookup(t, ra, "r0:1"))
	ra.End(f, 5, -1, true)
	waitFor(t, "b withdraws the removed replica's load", func() bool { return peerInFlight(t, rb, "r0:1") == 0 })
	// Heartbeats go on; none names the removed id any more.
	sent := testutil.ToFloat64(a.m.batchesSent)
	u0 := testutil.ToFloat64(b.m.updDropped[dropUnknown])
	waitFor(t, "5 more heartbeats", func() bool { return testutil.ToFloat64(a.m.batchesSent) >= sent+5 })
	waitFor(t, "b received them", func() bool { return testutil.ToFloat64(b.m.batchesReceived) >= sent+5 })
	if d := testutil.ToFloat64(b.m.updDropped[dropUnknown]) - u0; d > 1 {
		t.Errorf("heartbeats still re-send the removed replica's load: %v unknown_replica drops", d)
	}
}

// M3: a forged huge sequence number (same incarnation) must not silence
// the peer: a jump of maxGap or more either way starts over, rather than
// every later real batch being "late" and its loads ignored.
func TestForgedSeqDoesNotSilencePeer(t *testing.T) {
	tests := []struct {
		name          string
		forgedInc     uint64
		forgedSeq     uint64
		realInc       uint64
		realSeq       uint64
		wantInFlight  int
		forgedInFlght int32
	}{
		{"same incarnation, MaxUint64", 77, math.MaxUint64, 77, 12, 7, 0},
		{"other incarnation, MaxUint64", 66, math.MaxUint64, 77, 12, 7, 0},
		{"same incarnation, far ahead", 77, 12 + 2*maxGap, 77, 12, 7, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rb := newRouter(t, affinity.Config{})
			b := offlineNode(t, rb, nil)
			now := time.Now()
			b.applyBatch(batch(b, 0, 77, 10, now.UnixNano(), map[uint32]int32{0: 1}), now)
			b.applyBatch(batch(b, 0, tt.forgedInc, tt.forgedSeq, now.UnixNano(), map[uint32]int32{0: tt.forgedInFlght}), now)
			b.applyBatch(batch(b, 0, tt.realInc, tt.realSeq, now.UnixNano(), map[uint32]int32{0: 7}), now)
			b.applyBatch(batch(b, 0, tt.realInc, tt.realSeq+1, now.UnixNano(), map[uint32]int32{0: int32(tt.wantInFlight)}), now)
			if got := peerInFlight(t, rb, "r0:1"); got != tt.wantInFlight {
				t.Fatalf("real peer's load after a forged batch: got %d, want %d", got, tt.wantInFlight)
			}
		})
	}
}

// M3: only <prefix>.u.<instance> speaks for instance: one publisher on
// warmpath.u.evil cannot register every name it makes up.
func TestSubjectMustMatchInstance(t *testing.T) {
	ns := startNATS(t, 0)
	rb := newRouter(t, affinity.Config{})
	b := startNode(t, testCfg(natsURL(ns), "b"), rb)
	waitFor(t, "connected", b.Connected)
	nc, err := nats.Connect(natsURL(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub := func(subj, instance string) {
		t.Helper()
		out := appendHeader(nil, msgBatch, 0, b.fp, 5, 1, time.Now().UnixNano(), instance)
		if err := nc.Publish(subj, appendUvarint(out, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		pub("warmpath.u.evil", fmt.Sprintf("fake%d", i))
	}
	pub("warmpath.u.evil", "evil") // the only name it may use
	waitFor(t, "the honest batch applied", func() bool { return len(b.Peers()) > 0 })
	if p := b.Peers(); len(p) != 1 || p[0] != "evil" {
		t.Fatalf("peers %v, want [evil]", p)
	}
	if d := testutil.ToFloat64(b.m.batchDropped[dropSubject]); d != 50 {
		t.Errorf("subject drops %v, want 50", d)
	}
}

// freezeProxy forwards TCP to target; freeze stops reading from the client
// (a stalled path: no reset, the client's writes block once the socket
// buffers fill).
type freezeProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen chan struct{} // closed = flowing
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, frozen: make(chan struct{})}
	close(p.frozen)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() {
				defer p.wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := s.Read(buf)
					if err != nil {
						c.Close()
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			go func() {
				defer p.wg.Done()
				buf := make([]byte, 4096)
				for {
					p.mu.Lock()
					f := p.frozen
					p.mu.Unlock()
					<-f
					n, err := c.Read(buf)
					if err != nil {
						s.Close()
						return
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.thaw()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *freezeProxy) freeze() { p.mu.Lock(); p.frozen = make(chan struct{}); p.mu.Unlock() }
func (p *freezeProxy) thaw() {
	p.mu.Lock()
	select {
	case <-p.frozen:
	default:
		close(p.frozen)
	}
	p.mu.Unlock()
}

// M1: a stalled NATS path (no reset) must neither stop peer expiry nor
// hang Close (a flusher blocked in nc.Publish for nats.go's one-minute
// write timeout would hold expiry back and make Close wait for it).
func TestStalledPublishKeepsExpiryAndClose(t *testing.T) {
	ns := startNATS(t, 0)
	px := newFreezeProxy(t, ns.Addr().String())
	ra, rb := newRouter(t, affinity.Config{}), newRouter(t, affinity.Config{})
	a := startNode(t, testCfg("nats://"+px.ln.Addr().String(), "a"), ra)
	cb := testCfg(natsURL(ns), "b")
	b, err := Start(Options{Config: cb, Router: rb, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "connected", func() bool { return a.Connected() && b.Connected() })
	var fb affinity.Flight
	rb.Begin(lookup(t, rb, "r1:1"), req(chain(9, 4)), nil, &fb)
	defer rb.End(&fb, 1, -1, true)
	waitFor(t, "a sees b's load", func() bool { return peerInFlight(t, ra, "r1:1") == 1 })

	px.freeze()
	// Big inserts on a, each a kicked batch, until the socket buffers are
	// full and the flusher blocks in Publish.
	for i := range 400 {
		route(t, ra, "r0:1", chain(1000+i, 4096))
	}
	// b vanishes without a word (its leaving batch would reach a through
	// the healthy server otherwise): close its connection under it.
	b.nc.Close()
	b.Close()
	waitFor(t, "a withdraws silent b's load", func() bool { return peerInFlight(t, ra, "r1:1") == 0 })
	done := make(chan struct{})
	go func() { a.Close(); close(done) }()
	waitFor(t, "a.Close returns on a stalled connection", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}

// M2: two auth errors in a row (a NATS restart whose credentials are
// briefly not provisioned) must not end the connection for good; they are
// logged at Warn and counted (nats.go closes the connection on them unless
// IgnoreAuthErrorAbort is set).
func TestAuthErrorsKeepReconnecting(t *testing.T) {
	good := startNATSWith(t, &server.Options{Port: server.RANDOM_PORT, Username: "u", Password: "p"})
	port := natsPort(good)
	n, logs := startUserNode(t, port)
	defer n.Close()
	waitFor(t, "connected", n.Connected)
	good.Shutdown()
	good.WaitForShutdown()
	bad := startNATSWith(t, &server.Options{Port: port, Username: "u", Password: "other"})
	waitFor(t, "auth errors seen", func() bool { return testutil.ToFloat64(n.m.natsErrors) >= 3 })
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("auth errors not logged at Warn: %q", logs.String())
	}
	bad.Shutdown()
	bad.WaitForShutdown()
	startNATSWith(t, &server.Options{Port: port, Username: "u", Password: "p"})
	waitFor(t, "reconnected once the credentials are accepted", n.Connected)
}

// M2: credentials rejected from the first attempt (nats.go reports no
// callback before a first connection) are still warned about, and the
// node connects once they are accepted.
func TestAuthRejectedFromStartWarned(t *testing.T) {
	bad := startNATSWith(t, &server.Options{Port: server.RANDOM_PORT, Username: "u", Password: "other"})
	port := natsPort(bad)
	n, logs := startUserNode(t, port)
	defer n.Close()
	waitFor(t, "a warning naming the auth error", func() bool {
		l := logs.String()
		return strings.Contains(l, "level=WARN") && strings.Contains(strings.ToLower(l), "authorization")
	})
	bad.Shutdown()
	bad.WaitForShutdown()
	startNATSWith(t, &server.Options{Port: port, Username: "u", Password: "p"})
	waitFor(t, "connected once the credentials are accepted", n.Connected)
}

// M4: Start does not wait for a server that accepts TCP but never
// answers (one synchronous attempt per URL would each be given up after
// nats.Timeout, 2s, before Start returned). Here the first connection
// the server sees must still be open, the client waiting for the
// server's INFO in the background.
func TestStartDoesNotWaitForSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testCfg("nats://"+ln.Addr().String(), "a")
	cfg.NATSURL = append(cfg.NATSURL, "nats://"+ln.Addr().String())
	n, err := Start(Options{Config: cfg, Router: newRouter(t, affinity.Config{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("no connection attempt: %v", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	var buf [64]byte
	if _, err := c.Read(buf[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the first connection attempt was given up before Start returned (read: %v)", err)
	}
}

// L1: Close tells the peers (they withdraw its load at once, not after
// peer_timeout), and a batch applied after Close changes nothing.
func TestCloseLeavesAtOnce(t *testing.T) {
	ra, rb, a, b, _ := closablePair(t)
	var f affinity.Flight
	ra.Begin(lookup(t, ra, "r0:1"), req(chain(1, 4)), nil, &f)
	defer ra.End(&f, 5, -1, true)
	waitFor(t, "b sees a's load", func() bool { return peerInFlight(t, rb, "r0:1") == 1 })
	a.Close()
	waitFor(t, "b withdraws a's load", func() bool { return peerInFlight(t, rb, "r0:1") == 0 && len(b.Peers()) == 0 })

	b.Close()
	now := time.Now()
	b.applyBatch(batch(b, 0, 3, 1, now.UnixNano(), map[uint32]int32{0: 4}), now)
	if got, p := peerInFlight(t, rb, "r0:1"), b.Peers(); got != 0 || len(p) != 0 {
		t.Fatalf("a batch applied after Close: in-flight %d, peers %v", got, p)
	}
}

// L2: a batch stamped more than max_age in the future is dropped as stale.
func TestClockAheadDropped(t *testing.T) {
	rb := newRouter(t, affinity.Config{})
	b := offlineNode(t, rb, nil)
	now := time.Now()
	b.applyBatch(batch(b, 0, 1, 1, now.Add(24*time.Hour).UnixNano(), map[uint32]int32{0: 3}), now)
	if got := peerInFlight(t, rb, "r0:1"); got != 0 {
		t.Fatalf("a batch sent 24h in the future was applied (in-flight %d)", got)
	}
	if d := testutil.ToFloat64(b.m.batchDropped[dropStale]); d != 1 {
		t.Errorf("stale drops %v, want 1", d)
	}
}

// L3: once warnOnce remembers 1024 keys it stays quiet instead of warning
// on every batch of an unremembered key.
func TestWarnOnceFullStaysQuiet(t *testing.T) {
	var logs syncBuf
	b := offlineNode(t, newRouter(t, affinity.Config{}), slog.New(slog.NewTextHandler(&logs, nil)))
	mismatched := func(instance string) []byte {
		return appendUvarint(appendHeader(nil, msgBatch, 0, b.fp+1, 1, 1, time.Now().UnixNano(), instance), 0)
	}
	for i := range 1100 {
		b.applyBatch(mismatched(fmt.Sprintf("x%d", i)), time.Now())
	}
	before := strings.Count(logs.String(), "\n")
	for range 100 {
		b.applyBatch(mismatched("x1099"), time.Now())
	}
	if d := strings.Count(logs.String(), "\n") - before; d > 1 {
		t.Fatalf("100 batches from one mismatched peer logged %d warnings", d)
	}
}

// L4: the default instance name is the hostname, dots replaced.
func TestHostInstance(t *testing.T) {
	tests := []struct{ name, host, want string }{
		{"fqdn", "ip-10-0-0-1.ec2.internal", "ip-10-0-0-1_ec2_internal"},
		{"short", "gpu-router-3", "gpu-router-3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := hostInstance(tt.host)
			if got != tt.want {
				t.Fatalf("hostInstance(%q) = %q, want %q", tt.host, got, tt.want)
			}
			c := Config{NATSURL: URLs{"nats://127.0.0.1:4222"}, Instance: got}
			if err := c.Validate(); err != nil {
				t.Fatalf("default instance rejected: %v", err)
			}
		})
	}
}

// L5: a peer's entry add for a replica this instance does not have is
// delivered as a delete (the client's old pin here is stale). L6: entries
// are counted as received only when a handler applies them.
func TestEntryForUnknownReplicaDeletes(t *testing.T) {
	rb := newRouter(t, affinity.Config{})
	b := offlineNode(t, rb, nil)
	client := netip.MustParseAddr("10.0.0.9")
	mk := func(seq uint64) []byte {
		out := appendHeader(nil, msgBatch, 0, b.fp, 1, seq, time.Now().UnixNano(), "a")
		out = appendUvarint(out, 1)
		out = appendTableEntry(out, 0, "elsewhere:1")
		return appendEntry(out, 0, client, true)
	}
	b.applyBatch(mk(1), time.Now())
	if c := testutil.ToFloat64(b.m.received[recEntryAdd]) + testutil.ToFloat64(b.m.received[recEntryDel]); c != 0 {
		t.Fatalf("entries counted as received with no handler: %v", c)
	}
	type call struct {
		client netip.Addr
		r      affinity.ReplicaID
		add    bool
	}
	var got []call
	b.SetEntryHandler(func(c netip.Addr, r affinity.ReplicaID, add bool) { got = append(got, call{c, r, add}) })
	b.applyBatch(mk(2), time.Now())
	if len(got) != 1 || got[0] != (call{client, affinity.NoReplica, false}) {
		t.Fatalf("handler calls %+v, want one delete of %s", got, client)
	}
}

// L6: a batch never published (NATS down) takes no sequence number, so
// the peers count no gap for it.
func TestUnpublishedBatchTakesNoSeq(t *testing.T) {
	n := offlineNode(t, newRouter(t, affinity.Config{}), nil)
	for range 3 {
		n.flush(true)
	}
	if n.seq != 0 {
		t.Fatalf("seq %d after 3 unpublished heartbeats, want 0", n.seq)
	}
}

// H1b end to end: a crashes (no leaving batch: its connection is cut
// first) with a request in flight and restarts under the same name well
// within peer_timeout; b withdraws the dead process's load as soon as the
// new one speaks (its new incarnation, and its first full-load heartbeat,
// each do it; TestRestartWithdrawsPredecessorLoad isolates the first).
func TestCrashRestartWithinPeerTimeout(t *testing.T) {
	ra, rb, a, b, cfg := closablePair(t)
	var f affinity.Flight
	ra.Begin(lookup(t, ra, "r0:1"), req(chain(1, 4)), nil, &f)
	waitFor(t, "b sees a's load", func() bool { return peerInFlight(t, rb, "r0:1") == 1 })
	a.nc.Close() // the crash: nothing more leaves a
	a.Close()
	if got := peerInFlight(t, rb, "r0:1"); got != 1 {
		t.Fatalf("b's view changed before the restart: %d", got)
	}
	ra2 := newRouter(t, affinity.Config{})
	a2 := startNode(t, cfg("a"), ra2)
	waitFor(t, "a2 connected", a2.Connected)
	waitFor(t, "b withdraws the dead process's load", func() bool { return peerInFlight(t, rb, "r0:1") == 0 })
	if p := b.Peers(); len(p) != 1 || p[0] != "a" {
		t.Fatalf("peers %v, want [a]", p)
	}
}

// closablePair starts nodes a and b on one NATS server with a peer_timeout
// of a minute (so only what a says, or not, withdraws its load): the test
// stops a itself (Close, or a crash first); b stops at cleanup.
// cfg makes another node's config for the same server (a restarted a).
func closablePair(t *testing.T) (ra, rb *affinity.Router, a, b *Node, cfg func(name string) Config) {
	t.Helper()
	ns := startNATS(t, 0)
	ra, rb = newRouter(t, affinity.Config{}), newRouter(t, affinity.Config{})
	cfg = func(name string) Config {
		c := testCfg(natsURL(ns), name)
		c.PeerTimeout = time.Minute
		return c
	}
	a, err := Start(Options{Config: cfg("a"), Router: ra, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	b = startNode(t, cfg("b"), rb)
	waitFor(t, "connected", func() bool { return a.Connected() && b.Connected() })
	return ra, rb, a, b, cfg
}

// startUserNode starts node "a" against the NATS server on port with user
// u, password p, logging at Info into the returned buffer.
func startUserNode(t *testing.T, port int) (*Node, *syncBuf) {
	t.Helper()
	logs := new(syncBuf)
	cfg := testCfg(fmt.Sprintf("nats://u:p@127.0.0.1:%d", port), "a")
	n, err := Start(Options{Config: cfg, Router: newRouter(t, affinity.Config{}),
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	return n, logs
}
