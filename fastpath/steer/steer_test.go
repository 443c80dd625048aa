package steer

import (
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath"
)

var vip = netip.MustParseAddrPort("10.100.0.1:8000")

// fakeSource is a slowpath stand-in: a real affinity.Router (loads,
// prefill rates) and a replica list with hosts and health.
type fakeSource struct {
	mu     sync.Mutex
	reps   []Replica
	router *affinity.Router
	now    int64
}

func (f *fakeSource) Replicas() []Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Replica(nil), f.reps...)
}
func (f *fakeSource) Router() *affinity.Router { return f.router }
func (f *fakeSource) Now() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeSource) setHealthy(i int, ok bool) {
	f.mu.Lock()
	f.reps[i].Healthy = ok
	f.mu.Unlock()
	f.router.SetHealthy(affinity.ReplicaID(f.reps[i].ID), ok)
}

func (f *fakeSource) remove(i int) {
	f.mu.Lock()
	id := f.reps[i].ID
	f.reps = append(f.reps[:i:i], f.reps[i+1:]...)
	f.mu.Unlock()
	f.router.RemoveReplica(affinity.ReplicaID(id))
}

// clock is shared by the source and the userspace datapath.
type clock struct {
	mu  sync.Mutex
	ns  int64
	src *fakeSource
}

func (c *clock) get() int64 { c.mu.Lock(); defer c.mu.Unlock(); return c.ns }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.ns += int64(d)
	c.mu.Unlock()
	c.src.mu.Lock()
	c.src.now += int64(d)
	c.src.mu.Unlock()
}

// kernelMode makes the userspace datapath report kernel mode, so the
// controller applies sample scaling as it would with XDP.
type kernelMode struct{ *fastpath.Userspace }

func (kernelMode) Mode() fastpath.Mode { return fastpath.ModeKernel }

type rig struct {
	t   *testing.T
	src *fakeSource
	clk *clock
	dp  fastpath.Datapath
	us  *fastpath.Userspace
	c   *Controller
	reg *prometheus.Registry
}

func newRig(t *testing.T, kernel bool, sample uint32) *rig {
	t.Helper()
	router, err := affinity.NewRouter(affinity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{router: router, now: int64(time.Hour)}
	for i, host := range []string{"10.2.1.2", "10.2.2.2", "10.2.3.2"} {
		name := host + ":8000"
		id, err := router.AddReplica(affinity.ReplicaSpec{Name: name, Models: []string{"m"}})
		if err != nil {
			t.Fatal(err)
		}
		src.reps = append(src.reps, Replica{ID: int(id), Host: host, Healthy: true})
		_ = i
	}
	clk := &clock{ns: int64(time.Hour), src: src}
	us := fastpath.NewUserspace(clk.get)
	var dp fastpath.Datapath = us
	if kernel {
		dp = kernelMode{us}
	}
	reg := prometheus.NewRegistry()
	c, err := New(Options{Datapath: dp, Source: src, Services: []fastpath.Service{vip}, SampleEvery: sample,
		Promoter: affinity.PromoterConfig{IdleTTL: time.Minute}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, src: src, clk: clk, dp: dp, us: us, c: c, reg: reg}
}

// send observes one completed request of client (addr:port) on replica i
// with a prompt of 1000 tokens, cached of them predicted cached.
func (r *rig) send(client string, port uint16, i int, first uint64, cached int) {
	r.t.Helper()
	r.clk.advance(100 * time.Millisecond)
	ev := &Routed{
		Client:     netip.AddrPortFrom(netip.MustParseAddr(client), port),
		ReplicaID:  affinity.ReplicaID(r.src.reps[i].ID),
		FirstBlock: first, PromptTokens: 1000, PredictedCachedTokens: cached,
		OK: true, End: r.src.Now(),
	}
	r.c.ObserveRouted(ev)
}

func (r *rig) entry(client string) (fastpath.AffinityEntry, bool) {
	r.t.Helper()
	e, ok, err := r.dp.LookupAffinity(netip.MustParseAddr(client), vip)
	if err != nil {
		r.t.Fatal(err)
	}
	return e, ok
}

func (r *rig) backend(i int) fastpath.Backend {
	r.t.Helper()
	bs, err := r.dp.Backends()
	if err != nil {
		r.t.Fatal(err)
	}
	host := netip.MustParseAddr(r.src.reps[i].Host)
	for _, b := range bs {
		if b.Addr == host {
			return b
		}
	}
	r.t.Fatalf("no backend for %s in %+v", host, bs)
	return fastpath.Backend{}
}

func (r *rig) sync() {
	r.t.Helper()
	if err := r.c.Sync(); err != nil {
		r.t.Fatal(err)
	}
}

// promote sends the three consistent cached requests that promote client
// to replica i and checks the entry.
func (r *rig) promote(client string, i int) {
	r.t.Helper()
	for range 3 {
		r.send(client, 40000, i, 7, 900)
	}
	e, ok := r.entry(client)
	if b := r.backend(i); !ok || e.Backend != b.ID || e.Generation != b.Generation {
		r.t.Fatalf("entry of %s = %+v (present %v), want backend %+v", client, e, ok, b)
	}
}

func TestBackendsFollowReplicas(t *testing.T) {
	r := newRig(t, false, 16)
	bs, _ := r.dp.Backends()
	if len(bs) != 3 {
		t.Fatalf("backends %+v", bs)
	}
	for _, b := range bs {
		if !b.Healthy || b.Generation != 1 || b.SampleEvery != 16 {
			t.Errorf("backend %+v", b)
		}
	}
	svcs, _ := r.dp.Services()
	if len(svcs) != 1 || svcs[0] != vip {
		t.Errorf("services %v", svcs)
	}
}

func TestPromotionWritesEntryWithCurrentGeneration(t *testing.T) {
	r := newRig(t, false, 16)
	// Two requests: not yet.
	r.send("10.1.0.2", 40000, 1, 7, 900)
	r.send("10.1.0.2", 40000, 1, 7, 900)
	if _, ok := r.entry("10.1.0.2"); ok {
		t.Fatal("promoted after 2 requests, window is 3")
	}
	// Replica 1 goes out and comes back: its generation moves to 2, and
	// a promotion after that carries generation 2.
	r.src.setHealthy(1, false)
	r.sync()
	r.src.setHealthy(1, true)
	r.sync()
	if g := r.backend(1).Generation; g != 2 {
		t.Fatalf("generation after out and back = %d, want 2", g)
	}
	r.promote("10.1.0.2", 1)
	if got := value(r.c.m.promote); got != 1 {
		t.Errorf("promote counter %v", got)
	}
	// Uncached requests do not promote.
	for range 5 {
		r.send("10.1.0.9", 40000, 0, 11, 0)
	}
	if _, ok := r.entry("10.1.0.9"); ok {
		t.Fatal("client without a cached prefix promoted")
	}
	// IPv6 clients are never promoted (the datapath steers IPv4).
	for range 5 {
		r.c.ObserveRouted(&Routed{Client: netip.MustParseAddrPort("[fd00::2]:1"), ReplicaID: 0,
			FirstBlock: 7, PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.src.Now()})
	}
	if st := r.c.Promoter().Stats(); st.Promoted != 1 {
		t.Fatalf("promoted %d clients, want 1", st.Promoted)
	}
}

func TestManyUsersClientNeverPromoted(t *testing.T) {
	tests := []struct {
		name string
		req  func(r *rig, n int)
	}{
		{"many prefixes", func(r *rig, n int) { r.send("10.1.0.3", uint16(30000+n), 2, uint64(1000+n), 900) }},
		{"many sessions", func(r *rig, n int) {
			r.clk.advance(100 * time.Millisecond)
			r.c.ObserveRouted(&Routed{Client: netip.AddrPortFrom(netip.MustParseAddr("10.1.0.3"), uint16(30000+n)),
				ReplicaID: affinity.ReplicaID(r.src.reps[2].ID), FirstBlock: 7, SessionKey: uint64(100 + n),
				PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.src.Now()})
		}},
		{"demand over the replica's share", func(r *rig, n int) {
			// One prefix, but 10 requests/s of 40,000 uncached tokens: far
			// over half of the replica's 10,000 tokens/s.
			r.clk.advance(100 * time.Millisecond)
			r.c.ObserveRouted(&Routed{Client: netip.AddrPortFrom(netip.MustParseAddr("10.1.0.3"), 30000),
				ReplicaID: affinity.ReplicaID(r.src.reps[2].ID), FirstBlock: 7, PromptTokens: 100000,
				PredictedCachedTokens: 60000, OK: true, End: r.src.Now()})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, false, 16)
			promotedAt := -1
			for n := range 200 {
				tc.req(r, n)
				if _, ok := r.entry("10.1.0.3"); ok && promotedAt < 0 {
					promotedAt = n
				}
			}
			// The first window may promote before the guard has seen enough
			// (3 requests, 3 prefixes); the entry must be gone and stay gone.
			if _, ok := r.entry("10.1.0.3"); ok {
				t.Fatalf("many-users client holds an entry after 200 requests (first promoted at %d)", promotedAt)
			}
			if promotedAt > 3 {
				t.Fatalf("many-users client promoted at request %d", promotedAt)
			}
			if st := r.c.Promoter().Stats(); st.Crowds == 0 {
				t.Fatalf("no crowd observations: %+v", st)
			}
		})
	}
}

func TestSampledRevalidation(t *testing.T) {
	tests := []struct {
		name    string
		replica int
		cached  int
		want    int // replica the entry points to; -1 = none
	}{
		{"same replica keeps", 0, 900, 0},
		{"other replica with the cache moves", 2, 900, 2},
		{"other replica without cache drops", 1, 0, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true, 16)
			r.promote("10.1.0.2", 0)
			// A sampled SYN: a new connection of the promoted client.
			r.send("10.1.0.2", 50000, tc.replica, 7, tc.cached)
			e, ok := r.entry("10.1.0.2")
			switch {
			case tc.want < 0 && ok:
				t.Fatalf("entry kept: %+v", e)
			case tc.want >= 0 && (!ok || e.Backend != r.backend(tc.want).ID):
				t.Fatalf("entry %+v (present %v), want backend of replica %d", e, ok, tc.want)
			}
		})
	}
}

func TestSampledConnectionStandsForSampleEvery(t *testing.T) {
	// Every sampled request stands for SampleEvery=2000 requests of 356
	// token-equivalents: a few of them exceed half the replica's prefill
	// rate and the client is dropped as too big. The same requests on the
	// connection it was promoted on count once each and keep it.
	for _, tc := range []struct {
		name    string
		port    uint16
		dropped bool
	}{{"pre-promotion connection", 40000, false}, {"new (sampled) connections", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true, 2000)
			r.promote("10.1.0.2", 0)
			for n := range 5 {
				port := tc.port
				if port == 0 {
					port = uint16(50000 + n)
				}
				r.send("10.1.0.2", port, 0, 7, 900)
			}
			if _, ok := r.entry("10.1.0.2"); ok == tc.dropped {
				t.Fatalf("entry present %v, want dropped %v", ok, tc.dropped)
			}
		})
	}
}

func TestRebalanceDropsEntriesOfSaturatedReplica(t *testing.T) {
	r := newRig(t, false, 16)
	r.promote("10.1.0.2", 0)
	r.promote("10.1.0.4", 1)
	r.sync()
	if _, ok := r.entry("10.1.0.2"); !ok {
		t.Fatal("entry dropped without load")
	}
	// Replica 0's engine reports 20 busy requests, the others none.
	r.src.router.SetSignals(affinity.ReplicaID(r.src.reps[0].ID), affinity.EngineSignals{Running: 4, Waiting: 16, At: r.src.Now()})
	r.sync()
	if _, ok := r.entry("10.1.0.2"); ok {
		t.Fatal("entry on the saturated replica kept")
	}
	if _, ok := r.entry("10.1.0.4"); !ok {
		t.Fatal("entry on an idle replica dropped")
	}
	if got := value(r.c.m.sat); got != 1 {
		t.Errorf("saturated drops %v", got)
	}
	// While replica 0 stays saturated, a full window of requests the
	// slowpath still sends there does not re-promote the client into it.
	for range 3 {
		r.send("10.1.0.2", 40001, 0, 7, 900)
	}
	if _, ok := r.entry("10.1.0.2"); ok {
		t.Fatal("client re-promoted into the saturated replica")
	}
	// Re-decided through the slowpath, the client lands on replica 2 and
	// is promoted there: moved.
	for range 3 {
		r.send("10.1.0.2", 40001, 2, 7, 900)
	}
	if e, ok := r.entry("10.1.0.2"); !ok || e.Backend != r.backend(2).ID {
		t.Fatalf("after re-decision: %+v %v", e, ok)
	}
}

func TestUnhealthyOrRemovedBumpsGeneration(t *testing.T) {
	tests := []struct {
		name string
		out  func(r *rig)
	}{
		{"unhealthy", func(r *rig) { r.src.setHealthy(0, false) }},
		{"removed", func(r *rig) { r.src.remove(0) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, false, 16)
			r.promote("10.1.0.2", 0)
			before := r.backend(0)
			host := before.Addr
			tc.out(r)
			r.sync()
			bs, _ := r.dp.Backends()
			var after fastpath.Backend
			for _, b := range bs {
				if b.Addr == host {
					after = b
				}
			}
			if after.Healthy || after.Generation != before.Generation+1 || after.ID != before.ID {
				t.Fatalf("backend before %+v after %+v", before, after)
			}
			if _, ok := r.entry("10.1.0.2"); ok {
				t.Fatal("entry of an out backend kept")
			}
			if got := value(r.c.m.bumps); got != 1 {
				t.Errorf("bumps %v", got)
			}
			// A promotion to an out replica is refused.
			for range 3 {
				r.send("10.1.0.5", 40000, 0, 9, 900)
			}
			if _, ok := r.entry("10.1.0.5"); ok && tc.name == "unhealthy" {
				t.Fatal("promoted to an unhealthy backend")
			}
		})
	}
}

func TestIdleEntriesExpire(t *testing.T) {
	r := newRig(t, false, 16)
	r.promote("10.1.0.2", 0)
	r.clk.advance(30 * time.Second)
	r.sync()
	if _, ok := r.entry("10.1.0.2"); !ok {
		t.Fatal("entry expired before idle_ttl (1m)")
	}
	r.clk.advance(31 * time.Second)
	r.sync()
	if _, ok := r.entry("10.1.0.2"); ok {
		t.Fatal("entry idle for 61s kept")
	}
	if st := r.c.Promoter().Stats(); st.Promoted != 0 {
		t.Fatalf("promoter still believes %d promoted", st.Promoted)
	}
	if got := value(r.c.m.idle); got != 1 {
		t.Errorf("idle drops %v", got)
	}
}

func TestAdoptsPinnedState(t *testing.T) {
	// A previous process left backends (ids 5 and 9, generation 3) and an
	// entry; the new controller keeps ids, generations and the entry, and
	// drops an entry for a host no replica lives on any more.
	r := newRig(t, false, 16)
	us := fastpath.NewUserspace(r.clk.get)
	old := []fastpath.Backend{
		{ID: 5, Addr: netip.MustParseAddr("10.2.1.2"), Healthy: true, Generation: 3},
		{ID: 9, Addr: netip.MustParseAddr("10.2.9.2"), Healthy: true, Generation: 3},
	}
	if err := us.SetBackends(old); err != nil {
		t.Fatal(err)
	}
	for _, a := range []fastpath.Affinity{
		{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 5, Generation: 3},
		{Client: netip.MustParseAddr("10.1.0.7"), Service: vip, Backend: 9, Generation: 3},
	} {
		if err := us.SetAffinity(a); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Options{Datapath: us, Source: r.src, Services: []fastpath.Service{vip}, Promoter: affinity.PromoterConfig{IdleTTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	_ = c
	e, ok, _ := us.LookupAffinity(netip.MustParseAddr("10.1.0.2"), vip)
	if !ok || e.Backend != 5 || e.Generation != 3 {
		t.Fatalf("adopted entry %+v %v", e, ok)
	}
	if _, ok, _ := us.LookupAffinity(netip.MustParseAddr("10.1.0.7"), vip); ok {
		t.Fatal("entry of a host without replica kept")
	}
	bs, _ := us.Backends()
	var ids []string
	for _, b := range bs {
		ids = append(ids, b.Addr.String()+"="+string(rune('0'+b.ID%10)))
		if b.ID == 5 && (!b.Healthy || b.Generation != 3) {
			t.Errorf("adopted backend %+v", b)
		}
		if b.ID == 9 && (b.Healthy || b.Generation != 4) {
			t.Errorf("orphan backend %+v: want unhealthy, generation bumped", b)
		}
	}
	if len(bs) != 4 || !strings.Contains(strings.Join(ids, ","), "10.2.1.2=5") {
		t.Fatalf("backends %v", ids)
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
