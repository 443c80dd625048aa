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
// its RAM cache (the last ramPrompts of them). The prediction for a request
// is the prefix the slot it would get shares with it, or the best saved
// prompt's where the engine would consult that cache. Requests other
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
	// ram are the prompts the engine saved to its RAM cache, a ring of at
	// most ramPrompts; ramNext is the entry the next save overwrites once
	// full.
	ram     []slotEntry
	ramNext int
}

// ramPrompts bounds the RAM cache model. llama.cpp's cache holds what fits
// in --cache-ram (8 GiB by default): a few prompts of a large model, many
// of a small one; the router does not know the KV bytes per token, so it
// keeps the last ramPrompts saves, and the replica's confidence discounts
// hits that do not come true.
const ramPrompts = 32

type slotEntry struct {
	hashes []uint64 // the prompt's block chain (owned: copied in)
	owner  uint64   // flight running in the slot, 0 when idle (waiting: the flight)
	used   int64    // tick of the last assignment or release
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
	shared, _, _ := c.predictLocked(n, hashes)
	return shared
}

// predictLocked is predict, with the slot the request would take (-1:
// every slot busy, it waits) and whether the engine would first save that
// slot to RAM. With every slot busy the request takes the first slot to
// free: the one whose request began longest ago, past those the waiting
// requests take. Callers hold mu.
func (c *slotCache) predictLocked(n int, hashes []uint64) (shared, slot int, ram bool) {
	if len(c.slots) != n {
		c.resize(n)
	}
	slot, shared, ram = c.pick(hashes)
	pickRAM := ram
	if slot < 0 {
		e := c.freedNext(len(c.waiting))
		shared = lcp(e.hashes, hashes)
		ram = len(e.hashes) > 0 && 2*shared < len(e.hashes)
	}
	if ram {
		shared = max(shared, c.ramMatch(hashes))
	}
	return shared, slot, pickRAM
}

// ramMatch is the longest prefix of hashes a saved prompt holds. Callers
// hold mu.
func (c *slotCache) ramMatch(hashes []uint64) int {
	best := 0
	for i := range c.ram {
		best = max(best, lcp(c.ram[i].hashes, hashes))
	}
	return best
}

// save records that the engine saved prompt to its RAM cache: a saved
// prompt it extends is replaced, and one that already covers it is kept
// instead. Callers hold mu.
func (c *slotCache) save(prompt []uint64) {
	if len(prompt) == 0 {
		return
	}
	at := -1
	for i := range c.ram {
		switch k := lcp(c.ram[i].hashes, prompt); {
		case k == len(prompt):
			return
		case k == len(c.ram[i].hashes):
			at = i
		}
	}
	if at < 0 {
		if len(c.ram) < ramPrompts {
			c.ram = append(c.ram, slotEntry{})
			at = len(c.ram) - 1
		} else {
			at = c.ramNext
			c.ramNext = (c.ramNext + 1) % ramPrompts
		}
	}
	c.ram[at].hashes = append(c.ram[at].hashes[:0], prompt...)
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
// placement.
func (c *slotCache) begin(n int, hashes []uint64) (seq uint64, shared int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	shared, slot, ram := c.predictLocked(n, hashes)
	if slot >= 0 {
		c.assign(slot, c.seq, hashes, ram)
		return c.seq, shared
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
	return c.seq, shared
}

// assign runs flight owner with hashes in slot i; with ram, the engine
// first saves the slot's prompt to its RAM cache. Callers hold mu.
func (c *slotCache) assign(i int, owner uint64, hashes []uint64, ram bool) {
	c.tick++
	e := &c.slots[i]
	if ram {
		c.save(e.hashes)
	}
	e.hashes = append(e.hashes[:0], hashes...)
	e.owner, e.used = owner, c.tick
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
// restarted); flights keep their slots.
func (c *slotCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.slots {
		c.slots[i].hashes = c.slots[i].hashes[:0]
	}
	for i := range c.ram {
		c.ram[i].hashes = c.ram[i].hashes[:0]
	}
}
