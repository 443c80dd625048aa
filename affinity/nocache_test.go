package affinity

import "testing"

// TestNoPrefixCacheSpreadsBurst: a burst of one shared prompt on engines
// that cache nothing, after one request of it has finished on r0. With
// the engine's signal (or the spec) saying so, no hit is predicted on r0
// and the burst spreads over both replicas; without it, the index says
// r0 holds the prompt, every request there looks nearly free, and the
// burst piles onto it.
func TestNoPrefixCacheSpreadsBurst(t *testing.T) {
	for _, mode := range []struct {
		name       string
		spec       CacheModel
		signal     bool
		wantSpread bool
	}{
		{"signals", CacheAuto, true, true},
		{"spec", CacheNone, false, true},
		{"shared", CacheShared, true, false},
		{"no-signal", CacheAuto, false, false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			r, ids := twoReplicas(t, ReplicaSpec{PrefillTokensPerSec: 10000, CacheModel: mode.spec},
				EngineSignals{NoPrefixCache: mode.signal, At: 1})
			bt := r.bt
			h := chainOf(0xdead, 0xbeef, 64, 66) // a 4k-token shared prompt, a 2-block question
			req := &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: 1e9}
			first := new(Flight)
			r.Begin(ids[0], req, nil, first)
			r.FirstToken(first, 1e9+4e8)
			r.End(first, 2e9, 0, true) // the engine reports nothing cached, as predicted
			on := map[ReplicaID]int{}
			var d Decision
			for i := range 6 {
				req.Now = 3e9 + int64(i)*1e6 // a burst: 1 ms apart, no first token yet
				if err := r.Decide(req, &d); err != nil {
					t.Fatal(err)
				}
				id := d.Ranked[0]
				if i > 0 && mode.wantSpread {
					for k, c := range d.CachedTokens {
						if c != 0 {
							t.Fatalf("request %d: predicted %d cached tokens on %v, want none", i, c, d.Ranked[k])
						}
					}
				}
				on[id]++
				r.Begin(id, req, &d, new(Flight))
			}
			spread := on[ids[0]] > 0 && on[ids[1]] > 0
			if spread != mode.wantSpread {
				t.Fatalf("burst placed %v, want spread over both: %v", on, mode.wantSpread)
			}
			if st := r.Replicas()[0]; st.NoPrefixCache != mode.wantSpread {
				t.Fatalf("ReplicaStatus.NoPrefixCache %v, want %v", st.NoPrefixCache, mode.wantSpread)
			}
		})
	}
}

// twoReplicas is a Router with replicas r0 and r1 of model m, each spec
// (Name and Models set here) and signals sig.
func twoReplicas(t *testing.T, spec ReplicaSpec, sig EngineSignals) (*Router, [2]ReplicaID) {
	t.Helper()
	r, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var ids [2]ReplicaID
	for i := range ids {
		spec.Name, spec.Models = []string{"r0", "r1"}[i], []string{"m"}
		if ids[i], err = r.AddReplica(spec); err != nil {
			t.Fatal(err)
		}
		r.SetSignals(ids[i], sig)
	}
	return r, ids
}
