package affinity

import "testing"

// TestSignalMarkOwnRequests: a scrape's counts are the engine's at some
// moment between sending it and SetSignals. A request of this router
// that waited at that moment, and has ended by the time the reply is
// read, is this router's own, not another router's queue: with the mark
// taken before sending, the warm replica stays warm and idle. Requests
// the engine counted beyond the mark's still count as other routers'.
func TestSignalMarkOwnRequests(t *testing.T) {
	h := chainOf(0xfeed, 0xface, 12, 12) // a 12-block prompt
	for _, tc := range []struct {
		name         string
		mark         bool
		waiting      int // the engine's count at the scrape
		wantBusy     int
		wantQueued   bool // another router's request priced ahead of a new one
		wantWarmWins bool
	}{
		// The failure this guards against: the engine's waiting request
		// was ours, so r0 is idle and should win on its cached prefix.
		{name: "own request, marked", mark: true, waiting: 1, wantBusy: 0, wantWarmWins: true},
		// Without a mark the counts are SetSignals' own (0 pending by
		// then): the one waiting request reads as someone else's.
		{name: "own request, unmarked", mark: false, waiting: 1, wantBusy: 1, wantQueued: true},
		// Two waiting, one ours: one is another router's, marked or not.
		{name: "another router's too", mark: true, waiting: 2, wantBusy: 1, wantQueued: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ids := twoReplicas(t, ReplicaSpec{PrefillTokensPerSec: 10000}, EngineSignals{})
			bt := r.bt
			req := &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: 1e9}
			f := new(Flight)
			r.Begin(ids[0], req, nil, f)
			var mark SignalMark
			if tc.mark {
				mark = r.MarkSignals(ids[0]) // the scrape is sent while f waits
			}
			r.FirstToken(f, 1e9+2e7)
			r.End(f, 1e9+3e7, 0, true)
			const at = 1e9 + 4e7 // the reply is read after f ended
			r.SetSignals(ids[0], EngineSignals{Waiting: tc.waiting, At: at, Mark: mark})
			r.SetSignals(ids[1], EngineSignals{At: at, Mark: r.MarkSignals(ids[1])})

			var l Load
			r.rep(ids[0]).queueLoad(&l, at, int64(r.cfg.SignalMaxAge))
			if !l.Fresh || l.Busy() != tc.wantBusy || (l.QueuedTokens() > 0) != tc.wantQueued {
				t.Fatalf("r0 load: fresh %v busy %d (want %d) queued tokens %.0f (want some: %v)",
					l.Fresh, l.Busy(), tc.wantBusy, l.QueuedTokens(), tc.wantQueued)
			}
			if !tc.wantWarmWins {
				return
			}
			req.Now = at + 1e6
			var d Decision
			if err := r.Decide(req, &d); err != nil {
				t.Fatal(err)
			}
			if d.Ranked[0] != ids[0] || d.CachedTokens[0] == 0 {
				t.Fatalf("ranked %v cached %v: want the warm, idle r0 first", d.Ranked, d.CachedTokens)
			}
		})
	}
}

// TestSignalMarkBeganInWindow: a request begun after the mark may have
// reached the engine before it counted, so it is this router's too; and a
// mark from a replica's earlier life (its ID reused) is ignored.
func TestSignalMarkBeganInWindow(t *testing.T) {
	r, ids := twoReplicas(t, ReplicaSpec{PrefillTokensPerSec: 10000}, EngineSignals{})
	h := chainOf(0xabc, 0xdef, 8, 8)
	req := &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: 1e9}
	mark := r.MarkSignals(ids[0])
	f := new(Flight)
	r.Begin(ids[0], req, nil, f) // after the mark, before the engine counted
	r.FirstToken(f, 1e9+1e7)
	r.End(f, 1e9+2e7, 0, true)
	const at = 1e9 + 3e7
	r.SetSignals(ids[0], EngineSignals{Waiting: 1, At: at, Mark: mark})
	var l Load
	r.rep(ids[0]).queueLoad(&l, at, int64(r.cfg.SignalMaxAge))
	if l.Busy() != 0 || l.QueuedTokens() != 0 {
		t.Fatalf("request begun in the window read as another router's: busy %d queued %.0f", l.Busy(), l.QueuedTokens())
	}

	// The same ID after a remove and add: the old mark does not apply.
	stale := r.MarkSignals(ids[0])
	stale.busy, stale.pend = 5, 5
	r.RemoveReplica(ids[0])
	id, err := r.AddReplica(ReplicaSpec{Name: "r2", Models: []string{"m"}, PrefillTokensPerSec: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if id != ids[0] {
		t.Fatalf("ID not reused (%v, was %v): the check below would test nothing", id, ids[0])
	}
	r.SetSignals(id, EngineSignals{Waiting: 1, At: at, Mark: stale})
	r.rep(id).queueLoad(&l, at, int64(r.cfg.SignalMaxAge))
	if l.Busy() != 1 {
		t.Fatalf("a mark from the ID's previous replica applied: busy %d, want 1", l.Busy())
	}
}
