package steer_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath"
	"github.com/warmpath/warmpath/fastpath/steer"
	"github.com/warmpath/warmpath/fastpath/steer/steertest"
)

var vip = steertest.VIP

func TestBackendsFollowReplicas(t *testing.T) {
	r := steertest.New(t, false, 16)
	bs, _ := r.DP.Backends()
	if len(bs) != 3 {
		t.Fatalf("backends %+v", bs)
	}
	for _, b := range bs {
		if !b.Healthy || b.Generation != 1 || b.SampleEvery != 16 {
			t.Errorf("backend %+v", b)
		}
	}
	svcs, _ := r.DP.Services()
	if len(svcs) != 1 || svcs[0] != vip {
		t.Errorf("services %v", svcs)
	}
}

func TestPromotionWritesEntryWithCurrentGeneration(t *testing.T) {
	r := steertest.New(t, false, 16)
	// Two requests: not yet.
	r.Send("10.1.0.2", 40000, 1, 7, 900)
	r.Send("10.1.0.2", 40000, 1, 7, 900)
	if _, ok := r.Entry("10.1.0.2"); ok {
		t.Fatal("promoted after 2 requests, window is 3")
	}
	// Replica 1 goes out and comes back: its generation moves to 2, and
	// a promotion after that carries generation 2.
	r.Src.SetHealthy(1, false)
	r.Sync()
	r.Src.SetHealthy(1, true)
	r.Sync()
	if g := r.Backend(1).Generation; g != 2 {
		t.Fatalf("generation after out and back = %d, want 2", g)
	}
	r.Promote("10.1.0.2", 1)
	if got := r.Counter("actions_total", "promote"); got != 1 {
		t.Errorf("promote counter %v", got)
	}
	// Uncached requests do not promote.
	for range 5 {
		r.Send("10.1.0.9", 40000, 0, 11, 0)
	}
	if _, ok := r.Entry("10.1.0.9"); ok {
		t.Fatal("client without a cached prefix promoted")
	}
	// IPv6 clients are never promoted (the datapath steers IPv4).
	for range 5 {
		r.C.ObserveRouted(&steer.Routed{Client: netip.MustParseAddrPort("[fd00::2]:1"), ReplicaID: 0,
			FirstBlock: 7, PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.Src.Now()})
	}
	if st := r.C.Promoter().Stats(); st.Promoted != 1 {
		t.Fatalf("promoted %d clients, want 1", st.Promoted)
	}
}

func TestManyUsersClientNeverPromoted(t *testing.T) {
	tests := []struct {
		name string
		req  func(r *steertest.Rig, n int)
	}{
		{"many prefixes", func(r *steertest.Rig, n int) { r.Send("10.1.0.3", uint16(30000+n), 2, uint64(1000+n), 900) }},
		{"many sessions", func(r *steertest.Rig, n int) {
			r.Advance(100 * time.Millisecond)
			r.C.ObserveRouted(&steer.Routed{Client: netip.AddrPortFrom(netip.MustParseAddr("10.1.0.3"), uint16(30000+n)),
				ReplicaID: affinity.ReplicaID(r.Src.Reps[2].ID), FirstBlock: 7, SessionKey: uint64(100 + n),
				PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.Src.Now()})
		}},
		{"demand over the replica's share", func(r *steertest.Rig, n int) {
			// One prefix, but 10 requests/s of 40,000 uncached tokens: far
			// over half of the replica's 10,000 tokens/s.
			r.Advance(100 * time.Millisecond)
			r.C.ObserveRouted(&steer.Routed{Client: netip.AddrPortFrom(netip.MustParseAddr("10.1.0.3"), 30000),
				ReplicaID: affinity.ReplicaID(r.Src.Reps[2].ID), FirstBlock: 7, PromptTokens: 100000,
				PredictedCachedTokens: 60000, OK: true, End: r.Src.Now()})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := steertest.New(t, false, 16)
			promotedAt := -1
			for n := range 200 {
				tc.req(r, n)
				if _, ok := r.Entry("10.1.0.3"); ok && promotedAt < 0 {
					promotedAt = n
				}
			}
			// The first window may promote before the guard has seen enough
			// (3 requests, 3 prefixes); the entry must be gone and stay gone.
			if _, ok := r.Entry("10.1.0.3"); ok {
				t.Fatalf("many-users client holds an entry after 200 requests (first promoted at %d)", promotedAt)
			}
			if promotedAt > 3 {
				t.Fatalf("many-users client promoted at request %d", promotedAt)
			}
			if st := r.C.Promoter().Stats(); st.Crowds == 0 {
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
			r := steertest.New(t, true, 16)
			r.Promote("10.1.0.2", 0)
			// A sampled SYN: a new connection of the promoted client.
			r.Send("10.1.0.2", 50000, tc.replica, 7, tc.cached)
			e, ok := r.Entry("10.1.0.2")
			switch {
			case tc.want < 0 && ok:
				t.Fatalf("entry kept: %+v", e)
			case tc.want >= 0 && (!ok || e.Backend != r.Backend(tc.want).ID):
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
			r := steertest.New(t, true, 2000)
			r.Promote("10.1.0.2", 0)
			for n := range 5 {
				port := tc.port
				if port == 0 {
					port = uint16(50000 + n)
				}
				r.Send("10.1.0.2", port, 0, 7, 900)
			}
			if _, ok := r.Entry("10.1.0.2"); ok == tc.dropped {
				t.Fatalf("entry present %v, want dropped %v", ok, tc.dropped)
			}
		})
	}
}

func TestRebalanceDropsEntriesOfSaturatedReplica(t *testing.T) {
	r := steertest.New(t, false, 16)
	r.Promote("10.1.0.2", 0)
	r.Promote("10.1.0.4", 1)
	r.Sync()
	if _, ok := r.Entry("10.1.0.2"); !ok {
		t.Fatal("entry dropped without load")
	}
	// Replica 0's engine reports 20 busy requests, the others none.
	r.Src.Router().SetSignals(affinity.ReplicaID(r.Src.Reps[0].ID), affinity.EngineSignals{Running: 4, Waiting: 16, At: r.Src.Now()})
	r.Sync()
	if _, ok := r.Entry("10.1.0.2"); ok {
		t.Fatal("entry on the saturated replica kept")
	}
	if _, ok := r.Entry("10.1.0.4"); !ok {
		t.Fatal("entry on an idle replica dropped")
	}
	if got := r.Counter("rebalance_drops_total", "saturated"); got != 1 {
		t.Errorf("saturated drops %v", got)
	}
	// While replica 0 stays saturated, a full window of requests the
	// slowpath still sends there does not re-promote the client into it.
	for range 3 {
		r.Send("10.1.0.2", 40001, 0, 7, 900)
	}
	if _, ok := r.Entry("10.1.0.2"); ok {
		t.Fatal("client re-promoted into the saturated replica")
	}
	// Re-decided through the slowpath, the client lands on replica 2 and
	// is promoted there: moved.
	for range 3 {
		r.Send("10.1.0.2", 40001, 2, 7, 900)
	}
	if e, ok := r.Entry("10.1.0.2"); !ok || e.Backend != r.Backend(2).ID {
		t.Fatalf("after re-decision: %+v %v", e, ok)
	}
}

func TestUnhealthyOrRemovedBumpsGeneration(t *testing.T) {
	tests := []struct {
		name string
		out  func(r *steertest.Rig)
	}{
		{"unhealthy", func(r *steertest.Rig) { r.Src.SetHealthy(0, false) }},
		{"removed", func(r *steertest.Rig) { r.Src.Remove(0) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := steertest.New(t, false, 16)
			r.Promote("10.1.0.2", 0)
			before := r.Backend(0)
			host := before.Addr
			tc.out(r)
			r.Sync()
			bs, _ := r.DP.Backends()
			var after fastpath.Backend
			for _, b := range bs {
				if b.Addr == host {
					after = b
				}
			}
			if after.Healthy || after.Generation != before.Generation+1 || after.ID != before.ID {
				t.Fatalf("backend before %+v after %+v", before, after)
			}
			if _, ok := r.Entry("10.1.0.2"); ok {
				t.Fatal("entry of an out backend kept")
			}
			if got := r.Counter("generation_bumps_total", ""); got != 1 {
				t.Errorf("bumps %v", got)
			}
			// A promotion to an out replica is refused.
			for range 3 {
				r.Send("10.1.0.5", 40000, 0, 9, 900)
			}
			if _, ok := r.Entry("10.1.0.5"); ok && tc.name == "unhealthy" {
				t.Fatal("promoted to an unhealthy backend")
			}
		})
	}
}

func TestIdleEntriesExpire(t *testing.T) {
	r := steertest.New(t, false, 16)
	r.Promote("10.1.0.2", 0)
	r.Advance(30 * time.Second)
	r.Sync()
	if _, ok := r.Entry("10.1.0.2"); !ok {
		t.Fatal("entry expired before idle_ttl (1m)")
	}
	r.Advance(31 * time.Second)
	r.Sync()
	if _, ok := r.Entry("10.1.0.2"); ok {
		t.Fatal("entry idle for 61s kept")
	}
	if st := r.C.Promoter().Stats(); st.Promoted != 0 {
		t.Fatalf("promoter still believes %d promoted", st.Promoted)
	}
	if got := r.Counter("rebalance_drops_total", "idle"); got != 1 {
		t.Errorf("idle drops %v", got)
	}
}

func TestAdoptsPinnedState(t *testing.T) {
	// A previous process left backends (ids 5 and 9, generation 3) and an
	// entry; the new controller keeps ids, generations and the entry, and
	// drops an entry for a host no replica lives on any more.
	r := steertest.New(t, false, 16)
	us := fastpath.NewUserspace(r.Src.Now)
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
	c, err := steer.New(steer.Options{Datapath: us, Source: r.Src, Services: []fastpath.Service{vip}, Promoter: affinity.PromoterConfig{IdleTTL: time.Minute}})
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
