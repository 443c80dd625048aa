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
