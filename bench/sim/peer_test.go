package sim

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/workload"
)

// Four routers in front of the same engines, shared-prefix traffic spread
// at random: alone, each router learns a quarter of the prefixes and the
// hit rate falls; with zero-delay sync they act as one router; a large
// delay sits between, over the seeds (at one seed, routers working from
// load a second old can land a point below unsynced ones: seed 1, 0.622 vs
// 0.629).
func TestScaleOutHitRate(t *testing.T) {
	w := smallShared(t, 40)
	var lateSum, aloneSum, syncedSum float64
	seeds := []uint64{1, 9, 23}
	defer func() {
		n := float64(len(seeds))
		if late, alone, synced := lateSum/n, aloneSum/n, syncedSum/n; late <= alone || late >= synced {
			t.Errorf("1s-late sync hit %.3f over the seeds, not between unsynced %.3f and synced %.3f", late, alone, synced)
		}
	}()
	for _, seed := range seeds {
		run := func(c Config) *Result {
			t.Helper()
			c.Replicas, c.Seed = 4, seed
			r, err := Run(c, w)
			if err != nil {
				t.Fatal(err)
			}
			if r.Completed != len(w.Requests) {
				t.Fatalf("%+v: %d of %d completed", c, r.Completed, len(w.Requests))
			}
			return r
		}
		single := run(Config{})
		alone := run(Config{Routers: 4})
		synced := run(Config{Routers: 4, Sync: true})
		late := run(Config{Routers: 4, Sync: true, SyncDelay: time.Second})
		t.Logf("seed %d hit rate: 1 router %.3f, 4 unsynced %.3f, 4 synced %.3f, 4 synced 1s late %.3f",
			seed, single.HitRate, alone.HitRate, synced.HitRate, late.HitRate)
		if alone.HitRate > 0.9*single.HitRate {
			t.Errorf("seed %d: 4 unsynced routers hit %.3f, not clearly below one router's %.3f", seed, alone.HitRate, single.HitRate)
		}
		if math.Abs(synced.HitRate-single.HitRate) > 0.05*single.HitRate {
			t.Errorf("seed %d: 4 synced routers hit %.3f, not within 5%% of one router's %.3f", seed, synced.HitRate, single.HitRate)
		}
		lateSum, aloneSum, syncedSum = lateSum+late.HitRate, aloneSum+alone.HitRate, syncedSum+synced.HitRate
		if alone.PeerMessages != 0 || synced.PeerMessages == 0 || synced.PeerUpdates < 3*synced.PeerMessages {
			t.Errorf("seed %d: peer messages %d unsynced, %d synced carrying %d updates to 3 peers",
				seed, alone.PeerMessages, synced.PeerMessages, synced.PeerUpdates)
		}
	}
}

// One router is the simulator without scale-out, whatever the sync fields
// say: same Result, outcome for outcome.
func TestOneRouterUnchanged(t *testing.T) {
	mt := workload.DefaultMultiTurn()
	mt.Conversations, mt.Seed = 8, 2
	multi, err := workload.MultiTurn(mt)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workload.Workload{smallShared(t, 60), multi} {
		for _, p := range []string{"cost", "sglang-cache-aware", "dynamo-kv", "oracle"} {
			t.Run(w.Name+"/"+p, func(t *testing.T) {
				base, err := Run(Config{Replicas: 3, Policy: p, Seed: 4, KeepOutcomes: true}, w)
				if err != nil {
					t.Fatal(err)
				}
				one, err := Run(Config{Replicas: 3, Policy: p, Seed: 4, KeepOutcomes: true, Routers: 1, Sync: true, SyncDelay: time.Millisecond}, w)
				if err != nil {
					t.Fatal(err)
				}
				base.DecideNanos, one.DecideNanos = 0, 0
				if !reflect.DeepEqual(base, one) {
					t.Fatalf("Routers=1 changed the result:\n%+v\n%+v", base, one)
				}
			})
		}
	}
}

// A router learns a prefix from its own traffic at once and from a peer's
// exactly SyncDelay later, never earlier: on one replica, the router's
// predicted cached tokens for each request say whether it knew the shared
// system prompt.
func TestSyncDelivery(t *testing.T) {
	const n, gap = 40, 300 * time.Millisecond
	reqs := make([]workload.Request, n)
	for i := range reqs {
		reqs[i] = workload.Request{ID: i, Arrival: int64(i) * int64(gap), Model: workload.DefaultModel, OutputTokens: 2, Conversation: -1,
			Messages: []workload.Message{
				{Role: workload.System, Segments: []workload.Segment{{ID: 7, Tokens: 1024}}},
				{Role: workload.User, Segments: []workload.Segment{{ID: uint64(100 + i), Tokens: 32}}},
			}}
	}
	w := &workload.Workload{Name: "spaced", Requests: reqs}
	for _, tc := range []struct {
		name  string
		sync  bool
		delay time.Duration
	}{
		{"unsynced", false, 0},
		{"delay=0", true, 0},
		{"delay=1s", true, time.Second},
		{"delay=2.5s", true, 2500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Run(Config{Replicas: 1, Routers: 3, Sync: tc.sync, SyncDelay: tc.delay, Seed: 5, KeepOutcomes: true}, w)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Outcomes) != n {
				t.Fatalf("%d outcomes", len(r.Outcomes))
			}
			byID := make([]Outcome, n)
			used := map[int]bool{}
			for _, o := range r.Outcomes {
				byID[o.ID] = o
				used[o.Router] = true
			}
			if len(used) != 3 {
				t.Fatalf("requests reached %d of 3 routers", len(used))
			}
			for i, o := range byID {
				knows := false
				for j := range i {
					p := byID[j]
					if p.Router == o.Router || (tc.sync && reqs[j].Arrival+int64(tc.delay) <= reqs[i].Arrival) {
						knows = true
					}
				}
				if got := o.Predicted > 0; got != knows {
					t.Fatalf("request %d at %v on router %d: predicted %d cached tokens, want known=%v",
						i, time.Duration(reqs[i].Arrival), o.Router, o.Predicted, knows)
				}
			}
		})
	}
}

// Peers share load: with zero-delay sync, least-request over routers that
// see every in-flight request spreads a simultaneous burst evenly; routers
// that see only their own requests pile some up.
func TestSyncSharesLoad(t *testing.T) {
	reqs := make([]workload.Request, 8)
	for i := range reqs {
		reqs[i] = workload.Request{ID: i, Model: workload.DefaultModel, OutputTokens: 50, Conversation: -1,
			Messages: []workload.Message{{Role: workload.User, Segments: []workload.Segment{{ID: uint64(i + 1), Tokens: 256}}}}}
	}
	w := &workload.Workload{Name: "burst", Requests: reqs}
	uneven := 0
	for seed := uint64(1); seed <= 10; seed++ {
		for _, sync := range []bool{true, false} {
			r, err := Run(Config{Replicas: 2, Routers: 4, Sync: sync, Policy: "least-request", Seed: seed, KeepOutcomes: true}, w)
			if err != nil {
				t.Fatal(err)
			}
			per := [2]int{}
			for _, o := range r.Outcomes {
				per[o.Replica]++
			}
			if sync && per != [2]int{4, 4} {
				t.Fatalf("seed %d: synced routers split a burst of 8 as %v", seed, per)
			}
			if !sync && per != [2]int{4, 4} {
				uneven++
			}
		}
	}
	if uneven == 0 {
		t.Fatal("unsynced routers split every burst evenly: their load is not their own")
	}
}

// Every policy runs behind several synced routers, deterministically for a
// seed, and every request finishes exactly once.
func TestScaleOutDeterministicAndConserving(t *testing.T) {
	mt := workload.DefaultMultiTurn()
	mt.Conversations, mt.Seed = 6, 3
	multi, err := workload.MultiTurn(mt)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workload.Workload{smallShared(t, 80), multi} {
		for _, p := range Policies() {
			t.Run(w.Name+"/"+p.Name, func(t *testing.T) {
				cfg := Config{Replicas: 3, Policy: p.Name, Seed: 6, KeepOutcomes: true, Routers: 3, Sync: true, SyncDelay: 2 * time.Millisecond}
				a, err := Run(cfg, w)
				if err != nil {
					t.Fatal(err)
				}
				b, err := Run(cfg, w)
				if err != nil {
					t.Fatal(err)
				}
				a.DecideNanos, b.DecideNanos, a.ApplyNanos, b.ApplyNanos = 0, 0, 0, 0
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("same seed, different results:\n%+v\n%+v", a, b)
				}
				seen := map[int]bool{}
				for _, o := range a.Outcomes {
					if seen[o.ID] {
						t.Fatalf("request %d finished twice", o.ID)
					}
					seen[o.ID] = true
				}
				if len(seen) != len(w.Requests) || a.Completed != len(w.Requests) || a.PeerMessages == 0 {
					t.Fatalf("%d of %d requests finished, %d completed, %d peer messages", len(seen), len(w.Requests), a.Completed, a.PeerMessages)
				}
			})
		}
	}
}
