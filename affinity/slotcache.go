package affinity

import "sync"

// An engine with per-slot caches (llama.cpp's llama-server) keeps no shared
// prefix cache: each of its batch slots keeps the tokens of the last request
// it ran, and a new request reuses only the prefix it shares with the slot it
// is given. The engine picks that slot itself (server-context.cpp,
// get_available_slot, b11669):
//
//   - among the idle slots holding tokens, the one whose longest common
//     prefix with the request is the largest share of the request, above
//     the similarity threshold (-sps, 0.10), the first on ties;
//   - else the least recently used idle slot;
//   - when it took the least recently used slot, or the chosen slot keeps
//     under half of its own tokens, it saves the slot's prompt to its host
//     RAM cache (--cache-ram, on by default) and loads the cached prompt
//     that best matches the request, if any; not when the slot is empty.
//
// A request that finds no idle slot waits and takes the first slot to free.
//
// So "the replica held this prefix once" (the prefix index) is not "the
// replica will reuse it": with a shared system prompt every idle slot
// matches at least that, the engine takes one of them, keeps over half its
// tokens and recomputes the conversation's history even when another slot
// or its RAM cache holds it; and a prompt still being computed in one slot
// is in no other slot and not in the RAM cache. slotCache replays the
// engine's choices on the requests this router sent: which prompt each
// slot holds, which slots are busy, and which prompts the engine saved to
// its RAM cache (slotCache.ram: the saves as llama.cpp keeps them, the
// cache's size learned). The prediction for a request is the prefix the slot it would
// get shares with it, or the prompt it would load from that cache where
// the engine would consult it. Requests other
// routers send to the engine are not seen (their slots read as this
// router's last prompts).
type slotCache struct {
	mu    sync.Mutex
	slots []slotEntry
	// waiting are this router's requests the model found no idle slot for,
	// oldest first; each takes a slot as one frees. Entries past len keep
	// their buffers for reuse.
	waiting []slotEntry
	seq     uint64 // last flight number given out
	tick    int64  // logical clock for least-recently-used
	// ram are the last ramPrompts prompts the engine saved to its RAM
	// cache, oldest first, ramBlocks their blocks; entries past len keep
	// their buffers for reuse. ramCap is the cache's size in blocks as
	// learned from the engine's answers (learnRAM), 0 while unknown: a
	// saved prompt is predicted there while it and the newer saves fit
	// in it. Older saves stay in the model as ghosts, so an answer that
	// reuses one shows the size was set too small. ramHits are the
	// sizes the last loads the engine confirmed needed.
	ram       []slotEntry
	ramBlocks int
	ramCap    int
	ramHits   [8]int
	ramHitAt  int
	// fresh is how many slots the engine reported holding nothing when
	// the router first read its slots (EngineSignals.FreshSlots). A slot
	// this model has never given a request (slotEntry.seen) holds what
	// the engine ran before the router started: nothing on a fresh
	// engine, a prompt the router cannot know on a warm one (a router
	// restarted in front of engines that kept serving, or another
	// router's traffic). Unseen slots beyond fresh are unknown.
	fresh int
}

// ramPrompts bounds the RAM cache model's entries. llama.cpp's cache holds
// what fits in --cache-ram (8 GiB by default): a few prompts of a large
// model, many of a small one. The router does not know the KV bytes per
// token, so it starts from the last ramPrompts saves and learns the size
// from what the engine reuses (learnRAM).
const ramPrompts = 32

// ramKeepMin is llama.cpp's floor for loading a saved prompt: it must
// share at least this part of its own tokens with the request
// (server_prompt_cache::load, "don't trash large prompts").
const ramKeepMin = 0.25

// ramUse is what the slot model expects of the RAM cache for one request:
// the saved prompt it loads, how many blocks it shares with the request
// against the slot's own, and the blocks of that prompt, every newer save
// and the slot's prompt saved just before the load (what the cache must
// hold for it to be there). With ghost, the
// prompt it would load were the cache larger than learned: predicted not
// loaded. Zero when the request would not load from RAM.
type ramUse struct {
	shared, own, suffix int
	ghost               bool
}

type slotEntry struct {
	hashes []uint64 // the prompt's block chain (owned: copied in)
	owner  uint64   // flight running in the slot, 0 when idle (waiting: the flight)
	used   int64    // tick of the last assignment or release
	// The owner's Begin time and predicted TTFT (stamp), and its first
	// token's time, 0 before it (first): when the slot frees (holdable).
	start, first int64
	pred         float64
	// reused is how many leading blocks of its prompt the slot held (or
	// loaded from RAM) when its request took it: a prefix computed
	// before, not by the request (Config.CopyComputed).
	reused int
	// seen: the model has given the slot a request, or knows it empty
	// (the engine restarted): its prompt is the model's, not unknown.
	seen bool
}

// slotSimilarity is llama.cpp's default -sps: a slot is chosen by its
// shared prefix only above this share of the request.
const slotSimilarity = 0.10

// resize keeps n slots (n > 0, the engine's batch slots as the replica
// knows them): new slots start empty, dropped ones take their requests
// back to the front of the waiting list. Callers hold mu.
func (c *slotCache) resize(n int) {
	for len(c.slots) > n {
		last := len(c.slots) - 1
		if e := c.slots[last]; e.owner != 0 {
			c.waiting = append(c.waiting, slotEntry{})
			copy(c.waiting[1:], c.waiting[:len(c.waiting)-1])
			c.waiting[0] = e
		}
		c.slots = c.slots[:last]
	}
	for len(c.slots) < n {
		c.slots = append(c.slots, slotEntry{})
	}
}

// lcp is the number of leading blocks a and b share. The hashes are
// chained (each covers every block before it), so equality at block k
// implies equality before it: a binary search finds the boundary.
func lcp(a, b []uint64) int {
	lo, hi := 0, min(len(a), len(b)) // a[:lo] == b[:lo]; differs at or before hi
	if hi > 0 && a[hi-1] == b[hi-1] {
		return hi
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if a[mid-1] == b[mid-1] {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// pick replays the engine's slot choice for a request with hashes among
// the idle slots: the slot's index, the blocks it shares with the request,
// and whether the engine would consult its RAM cache. -1 when every slot
// is busy. Callers hold mu.
func (c *slotCache) pick(hashes []uint64) (slot, shared int, ram bool) {
	best, bestShared := -1, 0
	lru, lruUsed := -1, int64(0)
	thr := slotSimilarity * float64(len(hashes))
	for i := range c.slots {
		e := &c.slots[i]
		if e.owner != 0 {
			continue
		}
		if lru < 0 || e.used < lruUsed {
			lru, lruUsed = i, e.used
		}
		if len(e.hashes) == 0 {
			continue
		}
		if k := lcp(e.hashes, hashes); k > bestShared && float64(k) > thr {
			best, bestShared = i, k
		}
	}
	switch {
	case best >= 0:
		return best, bestShared, 2*bestShared < len(c.slots[best].hashes)
	case lru >= 0:
		// An empty slot has nothing to save, and the engine then skips
		// the RAM cache too.
		e := &c.slots[lru]
		return lru, lcp(e.hashes, hashes), len(e.hashes) > 0
	}
	return -1, 0, false
}

// predict is the number of leading blocks of hashes the engine would reuse
// on an engine with n > 0 slots.
func (c *slotCache) predict(n int, hashes []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	shared, _, _, _ := c.predictLocked(n, hashes)
	return shared
}

// predictLocked is predict, with the slot the request would take (-1:
// every slot busy, it waits), whether the engine would first save that
// slot to RAM, and what it would load from RAM. With every slot busy the
// request takes the first slot to free: the one whose request began
// longest ago, past those the waiting requests take. Callers hold mu.
func (c *slotCache) predictLocked(n int, hashes []uint64) (shared, slot int, ram bool, use ramUse) {
	if len(c.slots) != n {
		c.resize(n)
	}
	slot, shared, ram = c.pick(hashes)
	pickRAM := ram
	var own []uint64
	if slot >= 0 {
		own = c.slots[slot].hashes
	} else {
		e := c.freedNext(len(c.waiting))
		own = e.hashes
		shared = lcp(own, hashes)
		ram = len(own) > 0 && 2*shared < len(own)
	}
	if ram {
		// The engine saves the slot's prompt first, making room for it.
		extra := c.saveBlocks(own)
		if at, k, suffix := c.ramBest(hashes, own, c.ramCap, extra); at >= 0 {
			use = ramUse{shared: k, own: shared, suffix: suffix}
			shared = k
		} else if c.ramCap > 0 {
			if at, k, suffix := c.ramBest(hashes, own, 0, extra); at >= 0 {
				use = ramUse{shared: k, own: shared, suffix: suffix, ghost: true}
			}
		}
	}
	return shared, slot, pickRAM, use
}

// ramBest is the saved prompt llama.cpp would load for a request with
// hashes into a slot holding own (server_prompt_cache::load): from the
// oldest save, each one sharing at least ramKeepMin of its own blocks with
// the request that beats the best so far (the slot's own prompt first) on
// both the part of itself it keeps and the part of the request it covers.
// A save's suffix is its blocks, every newer save's, and extra (blocks
// saved before the load); one whose suffix is over size blocks is not
// there (size 0: no bound). It returns the entry's index (-1: none), the
// blocks it shares, and its suffix. Callers hold mu.
func (c *slotCache) ramBest(hashes, own []uint64, size, extra int) (at, shared, suffix int) {
	at, shared = -1, lcp(own, hashes)
	keep := -1.0
	if len(own) > 0 {
		keep = float64(shared) / float64(len(own))
	}
	rest := c.ramBlocks + extra // entry i's suffix
	for i := range c.ram {
		h := c.ram[i].hashes
		s := rest
		rest -= len(h)
		if size > 0 && s > size {
			continue
		}
		k := lcp(h, hashes)
		f := float64(k) / float64(len(h))
		if f < ramKeepMin {
			continue
		}
		if keep < f && shared < k {
			at, shared, keep, suffix = i, k, f, s
		}
	}
	return at, shared, suffix
}

// saveBlocks is how many blocks saving prompt adds to the RAM cache: none
// when it is empty, over the learned size (the engine refuses a prompt
// larger than its whole cache), or covered by a save that is there.
// Callers hold mu.
func (c *slotCache) saveBlocks(prompt []uint64) int {
	if len(prompt) == 0 || c.ramCap > 0 && len(prompt) > c.ramCap {
		return 0
	}
	rest := c.ramBlocks
	for i := range c.ram {
		h := c.ram[i].hashes
		ghost := c.ramCap > 0 && rest > c.ramCap
		rest -= len(h)
		if !ghost && lcp(h, prompt) == len(prompt) {
			return 0
		}
	}
	return len(prompt)
}

// save records that the engine saved prompt to its RAM cache
// (server_prompt_cache::alloc): nothing when saveBlocks says it adds
// nothing, else saved prompts it covers, and ghosts (past the learned
// size: not there) that cover it, are dropped and it is added as the
// newest. The engine also evicts its oldest to make room; the model keeps
// them as ghosts (ramBest applies the size). Callers hold mu.
func (c *slotCache) save(prompt []uint64) {
	if c.saveBlocks(prompt) == 0 {
		return
	}
	for i := 0; i < len(c.ram); {
		h := c.ram[i].hashes
		if k := lcp(h, prompt); k == len(h) || k == len(prompt) {
			c.dropRAM(i)
			continue
		}
		i++
	}
	k := len(c.ram)
	if k < cap(c.ram) {
		c.ram = c.ram[:k+1]
	} else {
		c.ram = append(c.ram, slotEntry{})
	}
	c.ram[k].hashes = append(c.ram[k].hashes[:0], prompt...)
	c.ramBlocks += len(prompt)
}

// dropRAM removes saved prompt i, keeping its buffer past len for reuse.
// Callers hold mu.
func (c *slotCache) dropRAM(i int) {
	e := c.ram[i]
	c.ramBlocks -= len(e.hashes)
	copy(c.ram[i:], c.ram[i+1:])
	n := len(c.ram) - 1
	c.ram[n] = slotEntry{hashes: e.hashes[:0]}
	c.ram = c.ram[:n]
}

// evictRAM drops the oldest saves past ramPrompts, the model's own bound.
// The engine's, its byte size, is ramCap as learned, which ramBest
// applies: the saves past it stay in the model as ghosts. Callers hold mu.
func (c *slotCache) evictRAM() {
	for len(c.ram) > ramPrompts {
		c.dropRAM(0)
	}
}

// learnRAM takes the engine's answer to a request whose slot-model
// prediction loaded a saved prompt, or would have with a larger cache
// (use): cachedTokens reused, blocks of bt tokens. Reuse nearer the saved
// prompt's share than the slot's own says the cache held use.suffix
// blocks: a smaller learned size rises to it. Reuse nearer the slot's own
// where the model predicted the load says the prompt had been evicted:
// the size is set just below use.suffix, unless one of the last loads
// the engine confirmed needed as much (then the model's slot choice was
// off, not its size: the engine chose its slot later, or another router's
// request took it). Answers where the two differ by under two blocks say
// nothing.
func (c *slotCache) learnRAM(use ramUse, cachedTokens, bt int) {
	if use.suffix <= 0 || use.shared-use.own < 2 || cachedTokens < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if 2*cachedTokens >= (use.shared+use.own)*bt {
		c.ramHits[c.ramHitAt%len(c.ramHits)] = use.suffix
		c.ramHitAt++
		if c.ramCap > 0 && c.ramCap < use.suffix {
			c.ramCap = use.suffix
		}
		return
	}
	if use.ghost {
		return
	}
	for _, h := range c.ramHits {
		if h >= use.suffix {
			return
		}
	}
	if c.ramCap == 0 || c.ramCap >= use.suffix {
		c.ramCap = max(use.suffix-1, 1)
	}
}

// ramSize is the learned RAM cache size in blocks (0: unknown).
func (c *slotCache) ramSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ramCap
}

// freedNext is the busy slot the k-th request from now to need one gets:
// slots free in the order their requests began (owners are flight numbers,
// given in Begin order). Callers hold mu; every slot is busy.
func (c *slotCache) freedNext(k int) *slotEntry {
	k %= len(c.slots)
	// Small n (a llama.cpp server's slots): select the k-th smallest owner
	// by repeated minimum, no allocation.
	var prev uint64
	var e *slotEntry
	for range k + 1 {
		e = nil
		for i := range c.slots {
			s := &c.slots[i]
			if s.owner > prev && (e == nil || s.owner < e.owner) {
				e = s
			}
		}
		if e == nil {
			break
		}
		prev = e.owner
	}
	if e == nil {
		e = &c.slots[0]
	}
	return e
}

// begin places a new flight's request on an engine with n > 0 slots: in
// the slot the engine would pick, or at the back of the waiting list. It
// returns the flight's number and predict's answer, taken before the
// placement, with what it expects the engine to load from RAM.
func (c *slotCache) begin(n int, hashes []uint64) (seq uint64, shared int, use ramUse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	shared, slot, ram, use := c.predictLocked(n, hashes)
	if slot >= 0 {
		c.assign(slot, c.seq, hashes, ram)
		return c.seq, shared, use
	}
	k := len(c.waiting)
	if k < cap(c.waiting) {
		c.waiting = c.waiting[:k+1]
	} else {
		c.waiting = append(c.waiting, slotEntry{})
	}
	w := &c.waiting[k]
	w.hashes = append(w.hashes[:0], hashes...)
	w.owner = c.seq
	return c.seq, shared, use
}

// assign runs flight owner with hashes in slot i; with ram, the engine
// first saves the slot's prompt to its RAM cache (making room for it),
// then loads the saved prompt that suits the request best, taking it out
// of the cache. Callers hold mu.
func (c *slotCache) assign(i int, owner uint64, hashes []uint64, ram bool) {
	c.tick++
	e := &c.slots[i]
	reused := lcp(e.hashes, hashes)
	if ram {
		c.save(e.hashes)
		if at, sh, _ := c.ramBest(hashes, e.hashes, c.ramCap, 0); at >= 0 {
			reused = max(reused, sh)
			c.dropRAM(at)
		}
		c.evictRAM()
	}
	e.hashes = append(e.hashes[:0], hashes...)
	e.owner, e.used, e.seen, e.reused = owner, c.tick, true, reused
	e.start, e.pred, e.first = 0, 0, 0
}

// stamp records flight owner's Begin time and predicted TTFT, in its
// slot or in the waiting list.
func (c *slotCache) stamp(owner uint64, start int64, pred float64) {
	if owner == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.find(owner); e != nil {
		e.start, e.pred, e.first = start, pred, 0
	}
}

// firstToken records flight owner's first token at now.
func (c *slotCache) firstToken(owner uint64, now int64) {
	if owner == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.find(owner); e != nil {
		e.first = now
	}
}

// find is flight owner's slot or waiting entry, nil if none. Callers hold
// mu.
func (c *slotCache) find(owner uint64) *slotEntry {
	for i := range c.slots {
		if c.slots[i].owner == owner {
			return &c.slots[i]
		}
	}
	for i := range c.waiting {
		if c.waiting[i].owner == owner {
			return &c.waiting[i]
		}
	}
	return nil
}

// slotHold is a busy slot a request could wait for (holdable).
type slotHold struct {
	shared       int    // blocks its prompt shares with the request
	reused       int    // blocks of its prompt the slot held when its request took it
	owner        uint64 // the flight running there
	start, first int64  // the owner's Begin and first token (0: none yet)
	pred         float64
}

// holdable finds, on an engine with n > 0 slots, the busy slot whose
// prompt shares the most blocks with hashes, more than over (what the
// request would reuse now): the slot a request could wait for to reuse
// them. A prompt still being computed is in no other slot, and the engine
// does not wait for it: it gives the request an idle slot and computes
// the prompt again. None while this router has requests waiting for a
// slot there: they take the slots that free first.
func (c *slotCache) holdable(n int, hashes []uint64, over int) (h slotHold, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.slots) != n {
		c.resize(n)
	}
	if len(c.waiting) > 0 {
		return h, false
	}
	best := over
	for i := range c.slots {
		e := &c.slots[i]
		if e.owner == 0 || len(e.hashes) <= best {
			continue
		}
		if k := lcp(e.hashes, hashes); k > best {
			best = k
			h = slotHold{shared: k, reused: e.reused, owner: e.owner, start: e.start, first: e.first, pred: e.pred}
			ok = true
		}
	}
	return h, ok
}

// unknownIdle says whether, on an engine with n > 0 slots, an idle slot
// may hold a prompt the model does not know: one it never gave a
// request, past the slots the engine reported fresh. The engine gives a
// request such a slot when its prompt matches best, so a prediction that
// the request's prefix is in busy slots alone is unproven there.
func (c *slotCache) unknownIdle(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.slots) != n {
		c.resize(n)
	}
	unseen, idle := 0, false
	for i := range c.slots {
		if e := &c.slots[i]; !e.seen {
			unseen++
			idle = idle || e.owner == 0
		}
	}
	return idle && unseen > c.fresh
}

// setFresh records how many slots the engine reported holding nothing
// when the router first read them (EngineSignals.FreshSlots).
func (c *slotCache) setFresh(k int) {
	c.mu.Lock()
	c.fresh = k
	c.mu.Unlock()
}

// end releases flight owner's slot (it keeps the prompt, as the engine
// does) and gives the slot to the oldest waiting request, or drops the
// flight from the waiting list if it never had a slot.
func (c *slotCache) end(owner uint64) {
	if owner == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.slots {
		if c.slots[i].owner != owner {
			continue
		}
		c.tick++
		c.slots[i].owner, c.slots[i].used = 0, c.tick
		if len(c.waiting) > 0 {
			w := c.waiting[0]
			c.dropWaiting(0)
			if slot, _, ram := c.pick(w.hashes); slot >= 0 {
				c.assign(slot, w.owner, w.hashes, ram)
				e := &c.slots[slot]
				e.start, e.pred, e.first = w.start, w.pred, w.first
			}
		}
		return
	}
	for i := range c.waiting {
		if c.waiting[i].owner == owner {
			c.dropWaiting(i)
			return
		}
	}
}

// dropWaiting removes waiting[i], keeping its buffer past len for reuse.
func (c *slotCache) dropWaiting(i int) {
	w := c.waiting[i]
	copy(c.waiting[i:], c.waiting[i+1:])
	n := len(c.waiting) - 1
	c.waiting[n] = slotEntry{hashes: w.hashes[:0]}
	c.waiting = c.waiting[:n]
}

// reset forgets every slot's prompt and the RAM cache (the engine
// restarted); flights keep their slots, and the cache's learned size
// stays (a restart keeps the engine's flags).
func (c *slotCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.slots {
		c.slots[i].hashes = c.slots[i].hashes[:0]
		c.slots[i].seen = true // empty, as the restarted engine's
	}
	for len(c.ram) > 0 {
		c.dropRAM(len(c.ram) - 1)
	}
}
