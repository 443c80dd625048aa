package affinity

import (
	"fmt"
	"testing"
	"time"
)

// One company's instructions (64 blocks, 4,096 tokens) and a user's
// question (2 blocks) after them.
const holdSysBlocks = 64

func holdPrompt(user uint64) []uint64 {
	return chainOf(0xc0de, 0x900|user, holdSysBlocks, holdSysBlocks+2)
}

// holdFleet is two llama.cpp-like replicas (4 slots, each keeping its own
// prompt) prefilling 2,000 tokens/s, each with a measured slot time of 1 s
// (measureSlots), and a request helper.
func holdFleet(t *testing.T, cfg Config, model CacheModel) (*Router, [2]ReplicaID, func(user uint64, now int64) *Request) {
	r, ids, mk := holdFleetUnmeasured(t, cfg, model)
	measureSlots(r, ids[:], 1)
	return r, ids, mk
}

// measureSlots gives replicas ids a measured slot time of d seconds, as
// their requests' ends would (sampleSlot).
func measureSlots(r *Router, ids []ReplicaID, d float64) {
	for _, id := range ids {
		storeF(&r.hotOf(id).slotSec, d)
	}
}

// holdFleetUnmeasured is holdFleet before any slot time is measured.
func holdFleetUnmeasured(t *testing.T, cfg Config, model CacheModel) (*Router, [2]ReplicaID, func(user uint64, now int64) *Request) {
	return holdFleetAt(t, cfg, model, 2000)
}

// holdFleetAt is holdFleetUnmeasured with replicas prefilling rate
// tokens/s.
func holdFleetAt(t *testing.T, cfg Config, model CacheModel, rate float64) (*Router, [2]ReplicaID, func(user uint64, now int64) *Request) {
	t.Helper()
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ids [2]ReplicaID
	for i := range ids {
		spec := ReplicaSpec{Name: []string{"r0", "r1"}[i], Models: []string{"m"}, PrefillTokensPerSec: rate, BatchSlots: 4, CacheModel: model}
		if ids[i], err = r.AddReplica(spec); err != nil {
			t.Fatal(err)
		}
		// Fresh engines: every slot empty (llama.cpp /slots).
		r.SetSignals(ids[i], EngineSignals{FreshSlots: 4})
	}
	mk := func(user uint64, now int64) *Request {
		h := holdPrompt(user)
		return &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: now}
	}
	return r, ids, mk
}

// TestHoldForSlotHoldingPrompt: on engines whose slots each keep their own
// prompt, a request whose prompt is being computed in a busy slot, while
// computing it again would share an engine with another cold prompt, is
// advised to wait for that slot; once the slot frees it goes there and
// reuses the prompt. Without the hold it is computed a third time.
func TestHoldForSlotHoldingPrompt(t *testing.T) {
	// A slot time measured on the replica, in its pool (the replicas of
	// its model) or in the fleet prices the wait.
	t.Run("measured", func(t *testing.T) { testHoldForSlotHoldingPrompt(t, "own") })
	t.Run("measured-in-pool", func(t *testing.T) { testHoldForSlotHoldingPrompt(t, "pool") })
	t.Run("measured-in-fleet", func(t *testing.T) { testHoldForSlotHoldingPrompt(t, "fleet") })
	// Before any request has ended anywhere, the slot time the wait would
	// be priced with is the default, not the engines': no hold, since a
	// cold router's first burst held for slots it had no measure of (the
	// simulator's llama.cpp fleets lost 2-8% mean TTFT to it).
	t.Run("unmeasured", func(t *testing.T) { testHoldForSlotHoldingPrompt(t, "") })
}

// testHoldForSlotHoldingPrompt runs the scenario with the slot time
// measured where measured says ("own", "pool", "fleet"; "": nowhere).
func testHoldForSlotHoldingPrompt(t *testing.T, measured string) {
	r, ids, mk := holdFleetUnmeasured(t, Config{}, CacheSlots)
	switch measured {
	case "own":
		measureSlots(r, ids[:], 1)
	case "pool":
		storeF(&r.hotOf(ids[0]).fleetPrefill.slotMean, 1)
	case "fleet":
		storeF(r.hotOf(ids[0]).fleetSlot, 1)
	}
	unmeasured := measured == ""
	const ms = int64(time.Millisecond)
	var f1, f2 Flight
	var d Decision
	// The first request computes the prompt on r0; a second, 100 ms
	// later, finds r1 idle: computing it there (2.1 s) beats waiting for
	// r0's slot (its prefill and decode, 3 s).
	req := mk(1, 0)
	r.Begin(ids[0], req, nil, &f1)
	req = mk(2, 100*ms)
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if d.Hold.Holding() || d.Ranked[0] != ids[1] {
		t.Fatalf("second request: ranked %v, hold %+v; want r1 now, no hold", d.Ranked, d.Hold)
	}
	r.Begin(ids[1], req, &d, &f2)
	// A third finds both computing the prompt: a cold copy shares an
	// engine with one (over 4 s); r0's slot frees in about 3 s.
	req = mk(3, 200*ms)
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if d.Hold.Holding() != !unmeasured {
		t.Fatalf("third request, slot times measured %v: hold %+v", !unmeasured, d.Hold)
	}
	if unmeasured {
		return // no hold priced on the default slot time
	}
	if !d.Hold.Holding() || d.Hold.Replica != ids[0] || d.Hold.Owner == 0 {
		t.Fatalf("third request: ranked %v, hold %+v; want a hold for r0", d.Ranked, d.Hold)
	}
	if w := d.Hold.Wait; w < 2.5 || w > 3.5 {
		t.Fatalf("hold wait %.2fs, want r0's prefill left (1.9s) and its slot time (1s)", w)
	}
	// A hold is advised where it saves a quarter of the best estimate or
	// more: its gain is at least a third of its own estimate, which is at
	// least its wait.
	if g := d.Hold.Gain; g < d.Hold.Wait/3 {
		t.Fatalf("hold gain %.2fs, want at least a third of the wait (%.2fs)", g, d.Hold.Wait)
	}
	// Given up at the wait and half again, plus 50 ms, or at the wait and
	// what waiting saves, whichever is sooner.
	checkHoldUntil(t, req.Now, d.Hold)
	first := d.Hold
	// Held, it counts: a fourth request waits behind it, so the slot
	// that frees first is one slot time further for it.
	r.Hold(first, 1)
	req4 := mk(4, 250*ms)
	if err := r.Decide(req4, &d); err != nil {
		t.Fatal(err)
	}
	// Behind it on r0 the fourth would wait a slot time (1 s) more: it
	// waits for r1's slot instead, which frees 0.1 s after r0's.
	if !d.Hold.Holding() || d.Hold.Replica != ids[1] || d.Hold.Wait < first.Wait {
		t.Fatalf("fourth request: hold %+v with the third held for r0 (%+v); want a hold for r1", d.Hold, first)
	}
	// A caller that will not wait gets no advice, and a request held
	// since longer than SlotHold ago none either.
	req4.NoHold = true
	if r.Decide(req4, &d); d.Hold.Holding() {
		t.Fatalf("NoHold: advised %+v", d.Hold)
	}
	req.HoldSince = req.Now - int64(DefaultSlotHold)
	if r.Decide(req, &d); d.Hold.Holding() {
		t.Fatalf("held for SlotHold already: advised %+v", d.Hold)
	}
	req.HoldSince = 0
	// r0's request ends: its slot keeps the prompt, and the held request
	// goes there and reuses it.
	r.Hold(first, -1)
	r.FirstToken(&f1, 2100*ms)
	// Decoding for 0.1 s, r0's request has its slot time less that left.
	req.Now = 2200 * ms
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if !d.Hold.Holding() || d.Hold.Replica != ids[0] || d.Hold.Wait < 0.85 || d.Hold.Wait > 0.95 {
		t.Fatalf("r0's request decoding: hold %+v, want r0's slot in 0.9 s", d.Hold)
	}
	r.EndWith(&f1, 2600*ms, Outcome{OK: true, CachedTokens: 0})
	req.Now = 2600 * ms
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if d.Hold.Holding() || d.Ranked[0] != ids[0] || d.CachedTokens[0] != holdSysBlocks*r.bt {
		t.Fatalf("after r0's end: ranked %v cached %v hold %+v; want r0 with the prompt's %d tokens", d.Ranked, d.CachedTokens, d.Hold, holdSysBlocks*r.bt)
	}
}

// TestCopyComputedPrefix: with routing.copy_computed a hold is advised
// for a busy slot while its request computes the prefix (a copy would be
// computed beside it), not once the prefix is computed there, whether its
// request decodes or found the prefix in the slot and computes only its
// question: the request computes a copy in a free slot, which the
// requests after it reuse too. By default it waits in all three.
func TestCopyComputedPrefix(t *testing.T) {
	for _, copyComputed := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy_computed=%v", copyComputed), func(t *testing.T) {
			r, ids, mk := holdFleet(t, Config{CopyComputed: copyComputed}, CacheSlots)
			const ms = int64(time.Millisecond)
			var d Decision
			decide := func(user uint64, now int64) {
				t.Helper()
				if err := r.Decide(mk(user, now), &d); err != nil {
					t.Fatal(err)
				}
			}
			// Both replicas compute the instructions: a third request waits.
			var fs [2]Flight
			for i := range fs {
				r.Begin(ids[i], mk(uint64(i+1), 0), nil, &fs[i])
			}
			if decide(3, 200*ms); !d.Hold.Holding() {
				t.Fatalf("prefix being computed: no hold (ranked %v)", d.Ranked)
			}
			// Both decode: computed.
			for i := range fs {
				r.FirstToken(&fs[i], 2100*ms)
			}
			if decide(4, 2200*ms); d.Hold.Holding() == copyComputed {
				t.Fatalf("both decoding: hold %+v, want one %v", d.Hold, !copyComputed)
			}
			if copyComputed && d.CachedTokens[0] >= holdSysBlocks*r.bt {
				t.Fatalf("both decoding: ranked %v cached %v, want a copy computed in a free slot", d.Ranked, d.CachedTokens)
			}
			// Both end and each slot's next request finds the instructions
			// there: it computes its question only, no first token yet.
			for i := range fs {
				r.End(&fs[i], 3100*ms, 0, true)
				r.Begin(ids[i], mk(uint64(5+i), 3110*ms), nil, &fs[i])
			}
			if decide(7, 3120*ms); d.Hold.Holding() == copyComputed {
				t.Fatalf("slots reusing the prefix: hold %+v, want one %v", d.Hold, !copyComputed)
			}
		})
	}
}

// checkHoldUntil: a hold advised at now gives up at its wait plus half
// of it and 50 ms, or plus its predicted gain, whichever is sooner.
func checkHoldUntil(t *testing.T, now int64, h HoldAdvice) {
	t.Helper()
	want := now + int64((h.Wait+min(0.5*h.Wait+0.05, h.Gain))*1e9)
	if h.Until < want-1e3 || h.Until > want+1e3 {
		t.Fatalf("hold %+v until %d, want %d", h, h.Until, want)
	}
}

// TestHoldGivesUpByItsGain: a hold for a short prompt on a fast engine
// saves little; it gives up once it has waited its predicted wait and
// that saving, well before the wait and half again plus 50 ms: past that
// point even a slot freeing at once would have been slower than going
// at once as the decision priced it.
func TestHoldGivesUpByItsGain(t *testing.T) {
	r, ids, mk := holdFleetAt(t, Config{}, CacheSlots, 100000)
	measureSlots(r, ids[:], 0.02)
	// Both replicas compute the shared prompt (41 ms each); a third
	// request 4 ms later waits for r0's slot rather than compute a third
	// copy beside one of them.
	var f1, f2 Flight
	r.Begin(ids[0], mk(1, 0), nil, &f1)
	r.Begin(ids[1], mk(2, 0), nil, &f2)
	req := mk(3, 4e6)
	var d Decision
	if err := r.Decide(req, &d); err != nil || !d.Hold.Holding() {
		t.Fatalf("no hold advised: %v %+v", err, d.Hold)
	}
	h := d.Hold
	if !(h.Gain > 0 && h.Gain < 0.5*h.Wait+0.05) {
		t.Fatalf("hold %+v: want a gain above 0 and under half the wait plus 50 ms", h)
	}
	checkHoldUntil(t, req.Now, h)
}

// TestHoldPromiseKept: a hold promises the busy slot's shared prompt
// (HoldAdvice.Shared); held requests that then reuse only a little of it
// (llama.cpp gave them another slot, or the prompt was gone) make the next
// hold on that replica priced at what they did reuse, and the same
// situation no longer advises waiting; held requests that reuse it all
// leave the advice as it was.
func TestHoldPromiseKept(t *testing.T) {
	for _, kept := range []bool{true, false} {
		r, ids, mk := holdFleet(t, Config{}, CacheSlots)
		var f1, f2 Flight
		var d Decision
		r.Begin(ids[0], mk(1, 0), nil, &f1)
		r.Begin(ids[1], mk(2, 0), nil, &f2)
		req := mk(3, 2e8)
		if err := r.Decide(req, &d); err != nil || !d.Hold.Holding() {
			t.Fatalf("no hold advised: %v %+v", err, d.Hold)
		}
		promised := d.Hold.Shared
		if promised != holdSysBlocks*r.bt {
			t.Fatalf("hold promises %d tokens, want the shared instructions' %d", promised, holdSysBlocks*r.bt)
		}
		// Five held requests end on a replica, each having reused all of
		// the promise or a tenth of it.
		endHeld := func(id ReplicaID) {
			for i := range 5 {
				other := &Request{Model: []byte("m"), Hashes: chainOf(0xbeef, uint64(i)<<8|uint64(id), 4, 4), PromptTokens: 4 * r.bt, Now: 2e8,
					HoldSince: 1e8, HeldFor: promised}
				var f Flight
				r.Begin(id, other, nil, &f)
				cached := promised / 10
				if kept {
					cached = promised
				}
				r.EndWith(&f, 2e8, Outcome{OK: true, CachedTokens: cached})
			}
		}
		endHeld(ids[0])
		if err := r.Decide(req, &d); err != nil {
			t.Fatal(err)
		}
		if kept && !d.Hold.Holding() || !kept && d.Hold.Holding() && d.Hold.Replica == ids[0] {
			t.Fatalf("held requests on r0 reused all of the promise %v: hold %+v", kept, d.Hold)
		}
		endHeld(ids[1])
		if err := r.Decide(req, &d); err != nil {
			t.Fatal(err)
		}
		if d.Hold.Holding() != kept {
			t.Fatalf("held requests on both reused all of the promise %v: hold %+v", kept, d.Hold)
		}
	}
}

// TestHoldCountsItsReplicaOnly: a hold counted on a replica that is
// removed, its ID given to a new one, does not count on the new one.
func TestHoldCountsItsReplicaOnly(t *testing.T) {
	r, ids, mk := holdFleet(t, Config{}, CacheSlots)
	var f1, f2 Flight
	var d Decision
	r.Begin(ids[0], mk(1, 0), nil, &f1)
	r.Begin(ids[1], mk(2, 0), nil, &f2)
	if err := r.Decide(mk(3, 2e8), &d); err != nil || !d.Hold.Holding() {
		t.Fatalf("no hold advised: %v %+v", err, d.Hold)
	}
	h := d.Hold
	r.Hold(h, 1)
	held := func(id ReplicaID) int {
		for _, st := range r.Replicas() {
			if st.ID == id {
				return st.HeldRequests
			}
		}
		return -1
	}
	if n := held(h.Replica); n != 1 {
		t.Fatalf("held %d, want 1", n)
	}
	r.RemoveReplica(h.Replica)
	id, err := r.AddReplica(ReplicaSpec{Name: "r2", Models: []string{"m"}, BatchSlots: 4, CacheModel: CacheSlots})
	if err != nil || id != h.Replica {
		t.Fatalf("re-added as %v (%v), want the ID %v reused", id, err, h.Replica)
	}
	r.Hold(h, -1)
	if n := held(id); n != 0 {
		t.Fatalf("the new replica counts %d held, want 0", n)
	}
}

// TestHoldOnlyForSlotCaches: engines with a shared prefix cache, and a
// router configured without holds, never advise one.
func TestHoldOnlyForSlotCaches(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		model CacheModel
	}{
		{"shared", Config{}, CacheShared},
		{"off", Config{SlotHold: -1}, CacheSlots},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, ids, mk := holdFleet(t, c.cfg, c.model)
			var f1, f2 Flight
			var d Decision
			r.Begin(ids[0], mk(1, 0), nil, &f1)
			r.Begin(ids[1], mk(2, 0), nil, &f2)
			if err := r.Decide(mk(3, 1e8), &d); err != nil {
				t.Fatal(err)
			}
			if d.Hold.Holding() {
				t.Fatalf("advised %+v", d.Hold)
			}
		})
	}
}

// TestHoldRentBuysACopy: one slot of each replica holds one company's
// instructions and decodes; the other slots hold nothing. Each new request
// is advised to wait for one of them, about a second less than computing
// the instructions in a free slot, until the waits charged to the
// instructions (Router.Hold) come to what computing them costs the next
// request more: that request is not held and computes the copy the
// requests after it reuse, and the rent starts again (holdRents). A request already held keeps its wait,
// and waits for a prompt still being computed are not charged.
func TestHoldRentBuysACopy(t *testing.T) {
	r, ids, mk := holdFleet(t, Config{}, CacheSlots)
	const ms = int64(time.Millisecond)
	// A slot of each replica computes the instructions.
	var fs [2]Flight
	for i := range fs {
		r.Begin(ids[i], mk(uint64(i+1), 0), nil, &fs[i])
	}
	var d Decision
	user := uint64(100)
	// advise decides for a new user's request at now.
	advise := func(now int64) *Request {
		t.Helper()
		user++
		req := mk(user, now)
		if err := r.Decide(req, &d); err != nil {
			t.Fatal(err)
		}
		return req
	}
	// While the slots compute the instructions, holds for them are the
	// burst's and charge nothing.
	for i := range 4 {
		advise(200*ms + int64(i)*ms)
		if !d.Hold.Holding() {
			t.Fatalf("prefilling, request %d: no hold", i)
		}
		r.Hold(d.Hold, 1)
		r.Hold(d.Hold, -1)
	}
	for i := range fs {
		r.FirstToken(&fs[i], 2200*ms)
	}
	now := 2300 * ms
	held := 0
	for ; held < 10; held++ {
		req := advise(now)
		if !d.Hold.Holding() {
			if d.CachedTokens[0] >= holdSysBlocks*r.bt {
				t.Fatalf("hold declined after %d: ranked %v cached %v, want a copy computed", held, d.Ranked, d.CachedTokens)
			}
			break
		}
		if d.Hold.Gain <= 0 {
			t.Fatalf("decoding, request %d: hold %+v, want a gain", held, d.Hold)
		}
		// A request already held keeps waiting whatever the rent.
		// Counted with the advice it was held on, released with it too
		// (the advice decided again may name the other replica).
		h := d.Hold
		req.Hold(h, now)
		r.Hold(h, 1)
		if err := r.Decide(req, &d); err != nil || !d.Hold.Holding() {
			t.Fatalf("held request %d decided again: hold %+v (%v)", held, d.Hold, err)
		}
		r.Hold(h, -1)
		now += ms
	}
	// The first decoding hold finds no rent (the prefill's holds charged
	// none); the copy comes after a few, well before ten.
	if held < 1 || held >= 10 {
		t.Fatalf("%d holds before a copy, want at least 1 and under 10", held)
	}
	if n := r.Stats().HoldCopies; n != 1 {
		t.Fatalf("HoldCopies %d, want 1", n)
	}
	// The rent starts again: the next request is held.
	if advise(now); !d.Hold.Holding() {
		t.Fatalf("after the copy: hold %+v, want one again", d.Hold)
	}
}

// TestNoHoldWithUnknownSlots: a router started in front of engines that
// were serving (their /slots show every slot used) does not know what
// the slots it has not used hold; the engine gives a request such a slot
// when it holds the request's prompt. So no hold is advised while one is
// idle: the replica holding the prompt in a busy slot may hold it in an
// idle one too, and the replica a copy would go to may hold it already.
// Slots the engine reports fresh, and slots the router has used, are
// known; with them the hold comes back.
func TestNoHoldWithUnknownSlots(t *testing.T) {
	r, ids, mk := holdFleet(t, Config{}, CacheSlots)
	for _, id := range ids {
		r.reps[id].slotc.setFresh(0) // warm engines: every slot ran something
	}
	const ms = int64(time.Millisecond)
	var f1, f2 Flight
	var d Decision
	r.Begin(ids[0], mk(1, 0), nil, &f1)
	r.Begin(ids[1], mk(2, 100*ms), nil, &f2)
	// As in TestHoldForSlotHoldingPrompt's third request: both replicas
	// compute the prompt in one slot; three slots of each are unknown.
	req := mk(3, 200*ms)
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if d.Hold.Holding() {
		t.Fatalf("unknown idle slots: hold %+v, want none", d.Hold)
	}
	// One replica's engine reports its slots fresh: the other's are still
	// unknown, and a copy there may be no copy at all.
	r.SetSignals(ids[0], EngineSignals{FreshSlots: 4})
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if d.Hold.Holding() {
		t.Fatalf("r1's slots unknown: hold %+v, want none", d.Hold)
	}
	// The router has used r1's slots since (other prompts): all known.
	var fs [3]Flight
	for i := range fs {
		h := chainOf(0xfeed+uint64(i), 0, 2, 2)
		r.Begin(ids[1], &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * r.bt, Now: 150 * ms}, nil, &fs[i])
	}
	for i := range fs {
		r.End(&fs[i], 160*ms, 0, true)
	}
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if !d.Hold.Holding() || d.Hold.Replica != ids[0] {
		t.Fatalf("slots known: ranked %v, hold %+v; want a hold for r0", d.Ranked, d.Hold)
	}
}
