package affinity

import (
	"fmt"
	"strings"
	"testing"
)

// keepTurnWorld: conversation 1's first turn ran on r0, then conversation
// 2's first turn there pushed its history out (on slot engines it takes
// the slot sharing the most, conversation 1's, and keeps over half of it,
// so nothing goes to the host cache; on engines with a paged cache of 48
// blocks the least recently used blocks go, conversation 1's own).
// Conversation 9's first turn ran on r1. Both replicas now hold the system
// prompt of conversation 1's next turn and nothing more of it. r0 then
// runs extra (decoding requests, or requests still awaiting their first
// token when queued) of an unrelated prompt.
func keepTurnWorld(t *testing.T, spec ReplicaSpec, sig EngineSignals, extra int, queued bool) (*Router, [2]ReplicaID) {
	t.Helper()
	r, ids := twoReplicas(t, spec, sig)
	bt := r.bt
	const s = int64(1e9)
	done := func(id ReplicaID, h []uint64, now int64) {
		f := new(Flight)
		r.Begin(id, &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: now}, nil, f)
		first := now + int64(float64(f.UncachedTokens)/2000*1e9)
		r.FirstToken(f, first)
		r.EndWith(f, first+5e8, Outcome{OK: true, CachedTokens: -1})
	}
	done(ids[0], convTurn(1, 0), 1*s)
	done(ids[1], convTurn(9, 0), 1*s)
	done(ids[0], convTurn(2, 0), 3*s)
	for i := range extra {
		f := new(Flight)
		h := chainOf(0x77, uint64(i), 0, 16)
		r.Begin(ids[0], &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: 5 * s}, nil, f)
		if !queued {
			r.FirstToken(f, 5*s)
		}
	}
	return r, ids
}

// nextTurn decides conversation 1's second turn and checks that both
// replicas are predicted to hold its system prompt alone.
func nextTurn(t *testing.T, r *Router, ids [2]ReplicaID) *Decision {
	t.Helper()
	h := convTurn(1, 1)
	req := &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: 6e9}
	d := new(Decision)
	if err := r.Decide(req, d); err != nil {
		t.Fatal(err)
	}
	for i, id := range d.Ranked {
		if d.CachedTokens[i] != slotSysBlocks*r.bt {
			t.Fatalf("replica %v predicted %d cached tokens, want the system prompt's %d (ranked %v, cached %v)",
				id, d.CachedTokens[i], slotSysBlocks*r.bt, d.Ranked, d.CachedTokens)
		}
	}
	return d
}

// TestKeepTurnOnSlotEngines: on engines that cache a prompt per slot, a
// conversation's next turn whose history is gone everywhere goes back to
// the replica of its previous turn, though one more busy request there
// makes the other replica's estimate a little lower; not when its
// estimate there is far worse (two queued prefills ahead of it); and not
// on engines with paged caches, where the estimate decides.
func TestKeepTurnOnSlotEngines(t *testing.T) {
	slots := ReplicaSpec{PrefillTokensPerSec: 2000, CacheModel: CacheSlots, BatchSlots: 4}
	slotSig := EngineSignals{BatchSlots: 4, SlotCaches: true, At: 1}
	paged := ReplicaSpec{PrefillTokensPerSec: 2000, CacheModel: CacheShared, BatchSlots: 4, KVCapacityTokens: 48 * 64}
	pagedSig := EngineSignals{BatchSlots: 4, At: 1}
	for _, tc := range []struct {
		name     string
		spec     ReplicaSpec
		sig      EngineSignals
		extra    int
		queued   bool
		wantHome bool
	}{
		{"slots, one more busy request at home: kept", slots, slotSig, 1, false, true},
		{"slots, two queued prefills at home: moves", slots, slotSig, 2, true, false},
		{"paged cache, one more busy request at home: the estimate moves it", paged, pagedSig, 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ids := keepTurnWorld(t, tc.spec, tc.sig, tc.extra, tc.queued)
			d := nextTurn(t, r, ids)
			if got := d.Ranked[0] == ids[0]; got != tc.wantHome {
				t.Fatalf("ranked %v, want the previous turn's replica %v first: %v", d.Ranked, ids[0], tc.wantHome)
			}
			if len(d.Ranked) != 2 || d.Ranked[0] == d.Ranked[1] {
				t.Fatalf("ranked %v: want both replicas once", d.Ranked)
			}
			// kept against the estimate's first choice: counted and exported
			want := 0
			if tc.wantHome {
				want = 1
			}
			if n := r.Stats().TurnsKept; n != uint64(want) {
				t.Fatalf("Stats().TurnsKept %d, want %d", n, want)
			}
			text := scrape(t, prometheusRegistry(t, r), []string{"warmpath_affinity_turns_kept_total"})
			if !strings.Contains(text, fmt.Sprintf("warmpath_affinity_turns_kept_total %d\n", want)) {
				t.Fatalf("metric:\n%s\nwant %d", text, want)
			}
		})
	}
}

// TestKeepTurnNotIntoFullBatch: a turn whose history is gone everywhere
// goes back to its previous replica whose four slots are all taken while
// the wait there is priced small (the batch began 2 s ago, near its end;
// the other replica runs three of its four): within a quarter of the best
// estimate. Once the pool's measured waits have run three times what was
// priced (fleetPrefill.sampleWait), the same wait is priced at three times
// and the turn goes where a slot is free.
func TestKeepTurnNotIntoFullBatch(t *testing.T) {
	spec := ReplicaSpec{PrefillTokensPerSec: 2000, CacheModel: CacheSlots, BatchSlots: 4}
	sig := EngineSignals{BatchSlots: 4, SlotCaches: true, At: 1}
	decoding := func(r *Router, id ReplicaID, tag uint64, n int, at int64) {
		for i := range n {
			f := new(Flight)
			h := chainOf(tag, uint64(i), 0, 16)
			r.Begin(id, &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: at}, nil, f)
			r.FirstToken(f, at)
		}
	}
	for _, longWaits := range []bool{false, true} {
		t.Run(fmt.Sprintf("waits measured long: %v", longWaits), func(t *testing.T) {
			r, ids := keepTurnWorld(t, spec, sig, 0, false)
			decoding(r, ids[0], 0x77, 4, 4e9)
			decoding(r, ids[1], 0x78, 3, 5e9)
			if longWaits {
				for range 40 {
					r.hotOf(ids[0]).fleetPrefill.sampleWait(0.1, 0.3)
				}
			}
			d := nextTurn(t, r, ids)
			if kept := d.Ranked[0] == ids[0]; kept == longWaits {
				t.Fatalf("ranked %v (home %v): kept %v with every slot busy there, waits measured long %v", d.Ranked, ids[0], kept, longWaits)
			}
		})
	}
}

// TestSlotWaitScaleLearned: with Config.LearnSlotWaits, requests that
// found every batch slot taken and waited twice what was priced raise the
// pool's wait factor to about 2 (the priced wait then matches); waits as
// priced leave it at 1; the factor is shared by the pool's replicas and
// stays within [1/2, 8]. Without the setting it stays at 1.
func TestSlotWaitScaleLearned(t *testing.T) {
	for _, tc := range []struct {
		took     float64 // measured wait / priced
		lo, hi   float64
		clampsAt float64
		off      bool // Config.LearnSlotWaits off
	}{{2, 1.8, 2.2, 0, false}, {1, 0.99, 1.01, 0, false}, {100, 7.9, 8, 8, false}, {0, 0.5, 0.51, 0.5, false},
		{2, 1, 1, 0, true}} {
		t.Run(fmt.Sprintf("waits %gx, learning off %v", tc.took, tc.off), func(t *testing.T) {
			r, err := NewRouter(Config{LearnSlotWaits: !tc.off})
			if err != nil {
				t.Fatal(err)
			}
			var ids [2]ReplicaID
			for i := range ids {
				if ids[i], err = r.AddReplica(ReplicaSpec{Name: fmt.Sprint("r", i), Models: []string{"m"}, PrefillTokensPerSec: 2000, BatchSlots: 4}); err != nil {
					t.Fatal(err)
				}
				r.SetSignals(ids[i], EngineSignals{BatchSlots: 4, At: 1})
			}
			const s = int64(1e9)
			for i := range 4 { // every slot of r0 decoding, for good
				f := new(Flight)
				r.Begin(ids[0], &Request{Model: []byte("m"), Hashes: chainOf(0x55, uint64(i), 0, 4), PromptTokens: 256, Now: s}, nil, f)
				r.FirstToken(f, s)
			}
			now := 2 * s
			n := 60
			if tc.clampsAt != 0 {
				n = 400
			}
			for i := range n {
				f := new(Flight)
				r.Begin(ids[0], &Request{Model: []byte("m"), Hashes: chainOf(0x66, uint64(i), 0, 4), PromptTokens: 256, Now: now}, nil, f)
				if !(f.slotWait > 0) {
					t.Fatalf("request %d: no slot wait priced with every slot busy", i)
				}
				// the engine's wait: took times what the priced wait was before scaling
				raw := f.slotWait / r.hotOf(ids[0]).fleetPrefill.waitScale()
				first := now + int64((f.predTTFT-f.slotWait+tc.took*raw)*1e9)
				r.FirstToken(f, first)
				r.EndWith(f, first+s/10, Outcome{OK: true, CachedTokens: 0})
				now = first + s/10
			}
			for _, id := range ids {
				if k := r.hotOf(id).fleetPrefill.waitScale(); k < tc.lo || k > tc.hi {
					t.Fatalf("replica %v: wait factor %.3f after waits of %gx the priced, want [%g, %g]", id, k, tc.took, tc.lo, tc.hi)
				}
			}
		})
	}
}

// TestKeepTurnOnce: the record of where a turn ended is used by one
// decision only, so requests that share a conversation's prompt up to
// that block (users of one template, a retry after the first was routed)
// are ranked by the estimate alone.
func TestKeepTurnOnce(t *testing.T) {
	r, ids := keepTurnWorld(t, ReplicaSpec{PrefillTokensPerSec: 2000, CacheModel: CacheSlots, BatchSlots: 4},
		EngineSignals{BatchSlots: 4, SlotCaches: true, At: 1}, 1, false)
	if d := nextTurn(t, r, ids); d.Ranked[0] != ids[0] {
		t.Fatalf("first decision ranked %v, want the previous turn's replica %v first", d.Ranked, ids[0])
	}
	if d := nextTurn(t, r, ids); d.Ranked[0] != ids[1] {
		t.Fatalf("second decision ranked %v, want the less loaded %v first", d.Ranked, ids[1])
	}
}
