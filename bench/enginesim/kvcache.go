package enginesim

// blockPool is the paged KV cache: NumGPUBlocks blocks, a map from chained
// block hash to the block holding it, and an LRU queue of free blocks. Like
// vLLM V1's KVCacheManager: a block whose reference count drops to zero keeps
// its hash (it stays a cache hit) and joins the tail of the free queue; new
// allocations pop the head, evicting the hash it held. Hit blocks sitting in
// the free queue are taken back out ("touched").
type blockPool struct {
	blk    []block // a block's fields together: one cache line per block
	head   int32
	tail   int32
	nfree  int
	cached hashIndex

	evictions uint64
}

type block struct {
	hash       uint64 // 0: no cached content
	ref        int32  // requests holding it; 0: in the free queue
	prev, next int32  // free-queue links; -1 terminates
	// succ is the block that followed this one in the last chain
	// committed through it, -1 none: a hint that lets a prefix hit follow
	// a cached chain block to block without probing the index (lookupAfter)
	succ int32
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{blk: make([]block, n), cached: newHashIndex(n)}
	p.reset()
	return p
}

// reset frees every block and forgets every cached hash (engine restart).
func (p *blockPool) reset() {
	p.cached.clear()
	n := int32(len(p.blk))
	for i := range n { // the free queue in block order
		p.blk[i] = block{prev: i - 1, next: i + 1, succ: -1}
	}
	p.blk[n-1].next = -1
	p.head, p.tail, p.nfree = 0, n-1, int(n)
}

func (p *blockPool) total() int { return len(p.blk) }

// used is the number of blocks referenced by a request.
func (p *blockPool) used() int { return len(p.blk) - p.nfree }

// free reports whether block b is in the free queue (no request holds it).
func (p *blockPool) free(b int32) bool { return p.blk[b].ref == 0 }

func (p *blockPool) pushTail(b int32) {
	k := &p.blk[b]
	k.prev, k.next = p.tail, -1
	if p.tail >= 0 {
		p.blk[p.tail].next = b
	} else {
		p.head = b
	}
	p.tail = b
	p.nfree++
}

func (p *blockPool) unlink(b int32) {
	k := &p.blk[b]
	pr, nx := k.prev, k.next
	if pr >= 0 {
		p.blk[pr].next = nx
	} else {
		p.head = nx
	}
	if nx >= 0 {
		p.blk[nx].prev = pr
	} else {
		p.tail = pr
	}
	p.nfree--
}

// lookup returns the block caching hash h, or -1.
func (p *blockPool) lookup(h uint64) int32 {
	return p.cached.get(h, p.blk)
}

// lookupAfter is lookup(h) for the block following prev (a block caching
// the chain's previous hash; -1 for a chain's first block): when prev's
// successor hint caches h, that is the answer, as only one block caches a
// hash; else the index says.
func (p *blockPool) lookupAfter(prev int32, h uint64) int32 {
	if prev >= 0 {
		if c := p.blk[prev].succ; c >= 0 && p.blk[c].hash == h {
			return c
		}
	}
	return p.cached.get(h, p.blk)
}

// link records that block b followed block prev in a committed chain.
func (p *blockPool) link(prev, b int32) { p.blk[prev].succ = b }

// touch takes a reference on a cached block, pulling it out of the free queue.
func (p *blockPool) touch(b int32) {
	if p.blk[b].ref == 0 {
		p.unlink(b)
	}
	p.blk[b].ref++
}

// alloc pops the least recently freed block, evicting its cached hash.
// The caller checks nfree first; alloc returns -1 when nothing is free.
func (p *blockPool) alloc() int32 {
	b := p.head
	if b < 0 {
		return -1
	}
	p.unlink(b)
	k := &p.blk[b]
	if k.hash != 0 {
		p.cached.del(k.hash, b)
		k.hash = 0
		p.evictions++
	}
	k.ref = 1
	k.succ = -1
	return b
}

// allocN appends n blocks to dst, as n calls of alloc would (the caller
// checks nfree >= n), with the index slots of the hashes they evict warmed
// first so their misses overlap.
func (p *blockPool) allocN(dst []int32, n int) []int32 {
	if n > 1 {
		var acc uint32
		for b, i := p.head, 0; b >= 0 && i < n; b, i = p.blk[b].next, i+1 {
			if h := p.blk[b].hash; h != 0 {
				acc += p.cached.slots[fingerprint(h)&p.cached.mask].fp
			}
		}
		p.cached.sink += acc
	}
	for range n {
		dst = append(dst, p.alloc())
	}
	return dst
}

// release drops one reference; a block nobody references joins the free
// queue's tail, still cached.
func (p *blockPool) release(b int32) {
	k := &p.blk[b]
	k.ref--
	if k.ref == 0 {
		p.pushTail(b)
	}
}

// commit records that block b holds the content hashed h, unless another
// block already caches h (then b stays anonymous, as in vLLM).
func (p *blockPool) commit(b int32, h uint64) {
	if p.blk[b].hash != 0 {
		return
	}
	if p.cached.insert(h, b, p.blk) {
		p.blk[b].hash = h
	}
}

// hashIndex maps nonzero block hashes to block ids: open addressing with
// linear probing and backward-shift deletion, at most half full (it holds
// at most one entry per block). A slot is 8 bytes: the hash's high 32 bits
// (its fingerprint; its low bits pick the home slot) and the block id. The
// full hash is the block's own (block.hash, which a hit reads next anyway),
// so a lookup compares fingerprints and checks the block only on a match:
// half the table of full keys, and the prefix cache is the engine's
// hottest path, one probe per 16-token block on a hit, a commit and an
// eviction on a miss. An entry for h at block b exists exactly when
// blk[b].hash == h (commit sets both, alloc clears both).
type hashIndex struct {
	slots []hslot
	mask  uint32
	sink  uint32 // warm's loads land here, so the compiler keeps them
}

type hslot struct {
	fp  uint32 // fingerprint: the hash's high 32 bits
	val int32  // block id + 1; 0: empty slot
}

func newHashIndex(entries int) hashIndex {
	n := 16
	for n < 2*entries {
		n <<= 1
	}
	return hashIndex{slots: make([]hslot, n), mask: uint32(n - 1)}
}

func (x *hashIndex) clear() { clear(x.slots) }

// fingerprint is h's fingerprint; its probe run starts at fp & mask.
func fingerprint(h uint64) uint32 { return uint32(h >> 32) }

// warm loads the home slot of each of hs, with no branch on what it
// reads, so the cache misses of a run of inserts overlap instead of each
// waiting behind the mispredicted probe loop of the one before: the table
// is larger than the CPU's caches once a cluster has a few engines.
func (x *hashIndex) warm(hs []uint64) {
	var acc uint32
	for _, h := range hs {
		acc += x.slots[fingerprint(h)&x.mask].fp
	}
	x.sink += acc
}

// get returns the block caching h, or -1; blk holds the blocks' hashes.
func (x *hashIndex) get(h uint64, blk []block) int32 {
	fp := fingerprint(h)
	for i := fp & x.mask; ; i = (i + 1) & x.mask {
		s := x.slots[i]
		if s.val == 0 {
			return -1
		}
		if s.fp == fp && blk[s.val-1].hash == h {
			return s.val - 1
		}
	}
}

// insert adds h -> b unless h is present; it reports whether it added.
// The caller sets blk[b].hash = h when it did.
func (x *hashIndex) insert(h uint64, b int32, blk []block) bool {
	fp := fingerprint(h)
	for i := fp & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.val == 0 {
			s.fp, s.val = fp, b+1
			return true
		}
		if s.fp == fp && blk[s.val-1].hash == h {
			return false
		}
	}
}

// del removes the entry of block b, which caches h, shifting later entries
// of its probe run back into the hole so lookups need no tombstones.
func (x *hashIndex) del(h uint64, b int32) {
	i := fingerprint(h) & x.mask
	for ; x.slots[i].val != b+1; i = (i + 1) & x.mask {
		if x.slots[i].val == 0 {
			return
		}
	}
	for j := (i + 1) & x.mask; x.slots[j].val != 0; j = (j + 1) & x.mask {
		home := x.slots[j].fp & x.mask
		// Move j into the hole at i if its home slot is not in (i, j].
		if (j-home)&x.mask >= (j-i)&x.mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = hslot{}
}
