package affinity

import (
	"testing"
)

// Conversations for the slot-model tests: every prompt starts with the
// same 32-block (2,048-token) system prompt; turn k of conversation c is
// that plus 8+4k blocks of its own history, so turn k+1 extends turn k
// and the system prompt is over half of every prompt (as in the live
// bench's multi-turn workload: 74%).
const slotSysBlocks = 32

func convTurn(c uint64, k int) []uint64 {
	return chainOf(0x5157, 0xc0<<8|c, slotSysBlocks, slotSysBlocks+8+4*k)
}

// TestSlotCacheReplaysEngineChoice: the slot model picks slots as
// llama.cpp's get_available_slot does and predicts what it reuses.
func TestSlotCacheReplaysEngineChoice(t *testing.T) {
	var c slotCache
	const n = 2
	a1, b1, c1 := convTurn(1, 0), convTurn(2, 0), convTurn(3, 0)
	a2 := convTurn(1, 1)
	fa, _, _ := c.begin(n, a1) // empty slots: the least recently used, slot 0
	// A second request of the same prompt while the first computes it:
	// the other slot is empty, and nothing is in the RAM cache yet.
	if got := c.predict(n, a1); got != 0 {
		t.Fatalf("a1 still computing in slot 0: predicted %d blocks for a copy, want 0", got)
	}
	fb, _, _ := c.begin(n, b1) // slot 1
	if got := c.predict(n, a2); got != len(a1) {
		t.Fatalf("every slot busy, first to free holds a1: predicted %d blocks, want %d", got, len(a1))
	}
	c.end(fa)
	c.end(fb)
	if got := c.predict(n, a2); got != len(a1) {
		t.Fatalf("a's own slot is idle: predicted %d blocks, want its whole history %d", got, len(a1))
	}
	// A new conversation shares only the system prompt with both idle
	// slots: the engine takes the first, a's, and keeps over half of it
	// (so saves nothing to its RAM cache).
	fc, _, _ := c.begin(n, c1)
	c.end(fc)
	if got := c.predict(n, a2); got != slotSysBlocks {
		t.Fatalf("a's slot overwritten: predicted %d blocks, want the system prompt %d", got, slotSysBlocks)
	}
	if len(c.ram) != 0 {
		t.Fatalf("%d prompts saved to RAM, want none", len(c.ram))
	}
	// Busy slots wait in order: with both slots taken, a third request
	// waits and gets the first one to free.
	f1, _, _ := c.begin(n, convTurn(4, 0))
	f2, _, _ := c.begin(n, convTurn(5, 0))
	f3, _, _ := c.begin(n, convTurn(6, 0))
	if len(c.waiting) != 1 {
		t.Fatalf("waiting %d, want 1", len(c.waiting))
	}
	c.end(f1)
	if len(c.waiting) != 0 || c.slots[0].owner != f3 && c.slots[1].owner != f3 {
		t.Fatalf("the waiting request did not take the freed slot: %+v", c.slots)
	}
	c.end(f2)
	c.end(f3)
	c.end(f3) // idempotent
	for i, s := range c.slots {
		if s.owner != 0 {
			t.Fatalf("slot %d still owned by %d", i, s.owner)
		}
	}
	c.reset()
	if got := c.predict(n, a2); got != 0 {
		t.Fatalf("after reset: predicted %d, want 0", got)
	}

	// The RAM cache: one slot; x and y share 4 of 40 blocks (a share of
	// the request not above the 0.10 threshold), so y takes the slot as
	// the least recently used and the engine first saves x to RAM. x's
	// next turn then finds y in the slot, under half of it shared, and
	// loads x from RAM.
	var r slotCache
	x1, y1 := chainOf(0x99, 1, 4, 40), chainOf(0x99, 2, 4, 40)
	x2 := chainOf(0x99, 1, 4, 44)
	x, _, _ := r.begin(1, x1)
	r.end(x)
	y, _, _ := r.begin(1, y1)
	r.end(y)
	if len(r.ram) != 1 {
		t.Fatalf("%d prompts saved to RAM, want x1", len(r.ram))
	}
	if got := r.predict(1, x2); got != len(x1) {
		t.Fatalf("x's next turn: predicted %d blocks, want x1's %d from the RAM cache", got, len(x1))
	}
	// Saving a prompt that extends a saved one replaces it; saving one
	// a saved prompt covers changes nothing.
	r.save(x2)
	r.save(x1)
	if len(r.ram) != 1 || len(r.ram[0].hashes) != len(x2) {
		t.Fatalf("RAM entries %d (first %d blocks), want x2 alone", len(r.ram), len(r.ram[0].hashes))
	}
	for i := range ramPrompts + 5 {
		r.save(chainOf(7, uint64(1000+i), 0, 8))
		r.evictRAM()
	}
	if len(r.ram) != ramPrompts {
		t.Fatalf("RAM model holds %d prompts, want at most %d", len(r.ram), ramPrompts)
	}
}

// slotConv is turn k of conversation c for the one-slot RAM tests: a
// 4-block system prompt then 36+4k blocks of its own, so two
// conversations share a tenth of a first turn (not above llama.cpp's
// similarity threshold: a new one takes the slot as the least recently
// used, and the engine saves the slot's prompt to RAM first).
func slotConv(c uint64, k int) []uint64 { return chainOf(0x77, 0x700|c, 4, 40+4*k) }

// TestSlotCacheRAMAsLlamaCpp: the RAM cache model keeps what
// server_prompt_cache keeps: a loaded prompt leaves the cache (the slot
// holds it now), and a saved prompt sharing under a quarter of itself
// with the request is not loaded.
func TestSlotCacheRAMAsLlamaCpp(t *testing.T) {
	var c slotCache
	run := func(h []uint64) { o, _, _ := c.begin(1, h); c.end(o) }
	run(slotConv(1, 0))
	run(slotConv(2, 0)) // saves conversation 1
	if got := c.predict(1, slotConv(1, 1)); got != 40 {
		t.Fatalf("conversation 1's next turn: predicted %d blocks, want its first turn's 40 from RAM", got)
	}
	_, shared, use := c.begin(1, slotConv(1, 1)) // saves 2, loads 1
	// The engine saves conversation 2 (40 blocks) before it loads: 1 is
	// there if the cache holds both.
	if shared != 40 || use != (ramUse{shared: 40, own: 4, suffix: 80}) {
		t.Fatalf("begin: shared %d, RAM use %+v; want 40 and {40 4 80}", shared, use)
	}
	if len(c.ram) != 1 || lcp(c.ram[0].hashes, slotConv(2, 0)) != 40 || c.ramBlocks != 40 {
		t.Fatalf("RAM holds %d prompts (%d blocks), want conversation 2's alone: the loaded one leaves it", len(c.ram), c.ramBlocks)
	}

	// A saved 100-block prompt sharing 20 of its blocks with a request
	// (a fifth of itself) is left where it is; sharing 30 it is loaded.
	var d slotCache
	long := chainOf(0x88, 1, 100, 100)
	d.save(long)
	d.slots = []slotEntry{{hashes: chainOf(0x88, 2, 2, 60), used: 1}} // shares 2 blocks with both requests
	if got := d.predict(1, chainOf(0x88, 3, 20, 60)); got != 2 {
		t.Fatalf("saved prompt shares a fifth of itself: predicted %d blocks, want the slot's own 2", got)
	}
	if got := d.predict(1, chainOf(0x88, 3, 30, 60)); got != 30 {
		t.Fatalf("saved prompt shares 0.3 of itself: predicted %d blocks, want 30 from RAM", got)
	}
}

// TestSlotCacheLearnsRAMSize: the model starts with the last ramPrompts
// saves; an answer that reused only the system prompt where the model
// expected a saved prompt bounds the cache below the blocks that prompt
// and the newer saves take, so older saves are no longer predicted; an
// answer that reused such a save (a ghost) or one past the bound raises
// it; a miss a recent confirmed load contradicts changes nothing.
func TestSlotCacheLearnsRAMSize(t *testing.T) {
	const bt = 64
	var c slotCache
	for i := range 10 {
		o, _, _ := c.begin(1, slotConv(uint64(i), 0))
		c.end(o)
	}
	if len(c.ram) != 9 || c.ramBlocks != 360 {
		t.Fatalf("RAM model: %d prompts, %d blocks; want conversations 0-8, 360 blocks", len(c.ram), c.ramBlocks)
	}
	if got := c.predict(1, slotConv(1, 1)); got != 40 {
		t.Fatalf("before learning: predicted %d blocks for conversation 1, want 40 from RAM", got)
	}
	o, _, use := c.begin(1, slotConv(0, 1))
	// The engine saves the slot's prompt (conversation 9), evicting the
	// oldest to make room, before it loads: conversation 0 is there if
	// the cache holds it, the 8 newer saves and 9's, 400 blocks.
	if use != (ramUse{shared: 40, own: 4, suffix: 400}) {
		t.Fatalf("RAM use %+v, want {40 4 400}", use)
	}
	// A difference under two blocks says nothing.
	c.learnRAM(ramUse{shared: 5, own: 4, suffix: 100}, 4*bt, bt)
	if c.ramSize() != 0 {
		t.Fatalf("learned %d blocks from an answer one block from both predictions", c.ramSize())
	}
	c.learnRAM(use, 4*bt+10, bt) // the engine reused the system prompt only
	c.end(o)
	if c.ramSize() != 399 {
		t.Fatalf("after a miss at 400 blocks: size %d, want 399", c.ramSize())
	}
	if got := c.predict(1, slotConv(1, 1)); got != 4 {
		t.Fatalf("conversation 1 is past the learned size: predicted %d blocks, want the system prompt's 4", got)
	}
	if got := c.predict(1, slotConv(2, 1)); got != 40 {
		t.Fatalf("conversation 2 is within it: predicted %d blocks, want 40", got)
	}
	// Conversation 1 stays in the model as a ghost: its next turn is
	// predicted the system prompt only, and records what it would load
	// (conversations 1-9 and the slot's 44-block prompt saved first).
	o, shared, use := c.begin(1, slotConv(1, 1))
	if shared != 4 || !use.ghost || use.shared != 40 || use.suffix != 404 {
		t.Fatalf("conversation 1 past the size: shared %d, RAM use %+v; want 4 and a ghost load of 40 blocks at 404", shared, use)
	}
	// The engine had it after all: the size rises to what it needed.
	c.learnRAM(use, 40*bt, bt)
	c.end(o)
	if c.ramSize() != 404 {
		t.Fatalf("a ghost's load confirmed at 404 blocks: size %d, want 404", c.ramSize())
	}
	// A miss at a size a recent confirmed load needed is the model's
	// slot choice being off, not the cache's size.
	c.learnRAM(ramUse{shared: 40, own: 4, suffix: 300}, 4*bt, bt)
	if c.ramSize() != 404 {
		t.Fatalf("a miss at 300 blocks after a load confirmed at 404: size %d, want 404 kept", c.ramSize())
	}
	c.learnRAM(ramUse{shared: 40, own: 4, suffix: 500}, 40*bt, bt)
	if c.ramSize() != 500 {
		t.Fatalf("a hit at 500 blocks: size %d, want 500", c.ramSize())
	}
	n := c.ramBlocks
	c.save(chainOf(0x66, 1, 0, 501)) // over the whole cache: the engine refuses it
	if c.ramBlocks != n {
		t.Fatalf("a 501-block save into a 500-block cache: the model holds %d blocks, want %d", c.ramBlocks, n)
	}
	c.reset()
	if len(c.ram) != 0 || c.ramBlocks != 0 || c.ramSize() != 500 {
		t.Fatalf("after reset: %d prompts, %d blocks, size %d; want none, 0, the learned 500", len(c.ram), c.ramBlocks, c.ramSize())
	}
}

// TestRouterLearnsRAMSizeFromAnswers: the same through the Router: Begin
// records what the model expects from RAM, EndWith's cached tokens teach
// the size, ReplicaStatus shows it, and decisions predict from it.
func TestRouterLearnsRAMSizeFromAnswers(t *testing.T) {
	r, ids := twoReplicas(t, ReplicaSpec{PrefillTokensPerSec: 2000, CacheModel: CacheSlots, BatchSlots: 1}, EngineSignals{BatchSlots: 1, At: 1})
	bt := r.bt
	send := func(h []uint64, cached int) {
		var f Flight
		r.Begin(ids[0], &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: 1}, nil, &f)
		r.FirstToken(&f, 2)
		r.EndWith(&f, 3, Outcome{OK: true, CachedTokens: cached})
	}
	for i := range 10 {
		send(slotConv(uint64(i), 0), 4*bt)
	}
	decide := func(h []uint64) int {
		var d Decision
		if err := r.Decide(&Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: 4}, &d); err != nil {
			t.Fatal(err)
		}
		for i, id := range d.Ranked {
			if id == ids[0] {
				return d.CachedTokens[i]
			}
		}
		t.Fatalf("r0 not ranked: %v", d.Ranked)
		return 0
	}
	if got := decide(slotConv(1, 1)); got != 40*bt {
		t.Fatalf("before learning: r0 predicted %d cached tokens for conversation 1, want %d", got, 40*bt)
	}
	send(slotConv(0, 1), 4*bt) // the model expected conversation 0 from RAM; the engine had evicted it
	if got := r.Replicas()[0].RAMCacheTokens; got != 399*bt {
		t.Fatalf("RAMCacheTokens %d, want %d", got, 399*bt)
	}
	if got := decide(slotConv(1, 1)); got != 4*bt {
		t.Fatalf("after learning: r0 predicted %d cached tokens for conversation 1, want the system prompt's %d", got, 4*bt)
	}
}

// TestSlotCacheMovesTurnOffLostHome: conversation a ran on r0 and left;
// two other conversations then ran there one after the other (each taking
// the slot sharing the most: a's), and one more is running there. The
// prefix index still says r0 holds a's 2,560-token prompt; a llama.cpp
// server would give a's next turn its other, empty slot and compute it
// all. r1 holds the system prompt and is idle. With the slot model (the engine says it
// has per-slot caches, or the spec says CacheSlots) the cost policy sees
// equal hits and takes the idle replica; with the prefix index alone (the
// old prediction, CacheShared) it keeps the turn on the busy r0 for a hit
// the engine will not give.
func TestSlotCacheMovesTurnOffLostHome(t *testing.T) {
	for _, mode := range []struct {
		name   string
		spec   CacheModel
		signal bool
		wantR1 bool
	}{
		{"signals", CacheAuto, true, true},
		{"spec", CacheSlots, false, true},
		{"shared", CacheShared, true, false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			r, ids := twoReplicas(t, ReplicaSpec{PrefillTokensPerSec: 2000, CacheModel: mode.spec, BatchSlots: 2},
				EngineSignals{BatchSlots: 2, SlotCaches: mode.signal, At: 1})
			bt := r.bt
			run := func(id ReplicaID, h []uint64, now int64) *Flight {
				f := new(Flight)
				r.Begin(id, &Request{Model: []byte("m"), Hashes: h, PromptTokens: len(h) * bt, Now: now}, nil, f)
				return f
			}
			// First tokens as a 2,000 tokens/s engine gives them, the
			// answer 0.5 s later.
			first := func(f *Flight) int64 { return f.Start + int64(float64(f.UncachedTokens)/2000*1e9) }
			done := func(f *Flight) {
				r.FirstToken(f, first(f))
				r.EndWith(f, first(f)+5e8, Outcome{OK: true, CachedTokens: -1})
			}
			const s = int64(1e9)
			done(run(ids[0], convTurn(1, 0), 1*s))
			done(run(ids[1], convTurn(9, 0), 1*s)) // r1 holds the system prompt
			done(run(ids[0], convTurn(2, 0), 3*s)) // takes a's slot (the first sharing the most)
			done(run(ids[0], convTurn(3, 0), 4*s))
			busy := run(ids[0], convTurn(4, 0), 6*s) // running on r0
			r.FirstToken(busy, first(busy))

			req := &Request{Model: []byte("m"), Hashes: convTurn(1, 1), PromptTokens: len(convTurn(1, 1)) * bt, Now: 8 * s}
			var d Decision
			if err := r.Decide(req, &d); err != nil {
				t.Fatal(err)
			}
			cached := map[ReplicaID]int{}
			for i, id := range d.Ranked {
				cached[id] = d.CachedTokens[i]
			}
			if got := d.Ranked[0] == ids[1]; got != mode.wantR1 {
				t.Fatalf("picked %v (cached tokens %v), want r1: %v", d.Ranked[0], cached, mode.wantR1)
			}
			// r0's one idle slot is empty: the engine computes the whole
			// prompt (an empty slot does not consult the RAM cache).
			if mode.wantR1 && (cached[ids[0]] != 0 || cached[ids[1]] != slotSysBlocks*bt) {
				t.Fatalf("predicted cached tokens %v, want r0 0 and r1 the system prompt's %d", cached, slotSysBlocks*bt)
			}
			if st := r.Replicas()[0]; st.SlotCaches != mode.wantR1 {
				t.Fatalf("ReplicaStatus.SlotCaches %v, want %v", st.SlotCaches, mode.wantR1)
			}
		})
	}
}

// TestSlotCacheBeginEndAllocs: the slot model's Begin and End allocate
// nothing once its buffers are warm.
func TestSlotCacheBeginEndAllocs(t *testing.T) {
	var c slotCache
	hs := [][]uint64{convTurn(1, 0), chainOf(0x99, 2, 4, 40), convTurn(3, 1)} // the second saves a prompt to RAM
	cycle := func() {
		var owners [3]uint64
		for i, h := range hs {
			owners[i], _, _ = c.begin(2, h) // the third waits
		}
		_ = c.predict(2, hs[0])
		for _, o := range owners {
			c.end(o)
		}
	}
	cycle()
	if a := testing.AllocsPerRun(100, cycle); a != 0 {
		t.Fatalf("%v allocations per cycle", a)
	}
}
