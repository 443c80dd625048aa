package enginesim

// blockPool is the paged KV cache: NumGPUBlocks blocks, a map from chained
// block hash to the block holding it, and an LRU queue of free blocks. Like
// vLLM V1's KVCacheManager: a block whose reference count drops to zero keeps
// its hash (it stays a cache hit) and joins the tail of the free queue; new
// allocations pop the head, evicting the hash it held. Hit blocks sitting in
// the free queue are taken back out ("touched").
type blockPool struct {
	hash   []uint64 // 0: no cached content
	ref    []int32
	prev   []int32 // free-queue links; -1 terminates
	next   []int32
	inFree []bool
	head   int32
	tail   int32
	nfree  int
	cached hashIndex

	evictions uint64
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{
		hash:   make([]uint64, n),
		ref:    make([]int32, n),
		prev:   make([]int32, n),
		next:   make([]int32, n),
		inFree: make([]bool, n),
		cached: newHashIndex(n),
	}
	p.reset()
	return p
}

// reset frees every block and forgets every cached hash (engine restart).
func (p *blockPool) reset() {
	n := len(p.hash)
	p.cached.clear()
	p.head, p.tail, p.nfree = -1, -1, 0
	for i := range n {
		p.hash[i], p.ref[i] = 0, 0
		p.pushTail(int32(i))
	}
}

func (p *blockPool) total() int { return len(p.hash) }

// used is the number of blocks referenced by a request.
func (p *blockPool) used() int { return len(p.hash) - p.nfree }

func (p *blockPool) pushTail(b int32) {
	p.prev[b], p.next[b] = p.tail, -1
	if p.tail >= 0 {
		p.next[p.tail] = b
	} else {
		p.head = b
	}
	p.tail = b
	p.inFree[b] = true
	p.nfree++
}

func (p *blockPool) unlink(b int32) {
	pr, nx := p.prev[b], p.next[b]
	if pr >= 0 {
		p.next[pr] = nx
	} else {
		p.head = nx
	}
	if nx >= 0 {
		p.prev[nx] = pr
	} else {
		p.tail = pr
	}
	p.inFree[b] = false
	p.nfree--
}

// lookup returns the block caching hash h, or -1.
func (p *blockPool) lookup(h uint64) int32 {
	return p.cached.get(h)
}

// touch takes a reference on a cached block, pulling it out of the free queue.
func (p *blockPool) touch(b int32) {
	if p.inFree[b] {
		p.unlink(b)
	}
	p.ref[b]++
}

// alloc pops the least recently freed block, evicting its cached hash.
// The caller checks nfree first; alloc returns -1 when nothing is free.
func (p *blockPool) alloc() int32 {
	b := p.head
	if b < 0 {
		return -1
	}
	p.unlink(b)
	if h := p.hash[b]; h != 0 {
		p.cached.del(h)
		p.hash[b] = 0
		p.evictions++
	}
	p.ref[b] = 1
	return b
}

// release drops one reference; a block nobody references joins the free
// queue's tail, still cached.
func (p *blockPool) release(b int32) {
	p.ref[b]--
	if p.ref[b] == 0 {
		p.pushTail(b)
	}
}

// commit records that block b holds the content hashed h, unless another
// block already caches h (then b stays anonymous, as in vLLM).
func (p *blockPool) commit(b int32, h uint64) {
	if p.hash[b] != 0 {
		return
	}
	if p.cached.insert(h, b) {
		p.hash[b] = h
	}
}

// hashIndex maps nonzero block hashes to block ids: open addressing with
// linear probing and backward-shift deletion, at most half full (it holds
// at most one entry per block). About twice as fast as a Go map here, and
// the prefix cache is the engine's hottest path.
type hashIndex struct {
	keys []uint64 // 0: empty slot
	vals []int32
	mask uint64
}

func newHashIndex(entries int) hashIndex {
	n := 16
	for n < 2*entries {
		n <<= 1
	}
	return hashIndex{keys: make([]uint64, n), vals: make([]int32, n), mask: uint64(n - 1)}
}

func (x *hashIndex) clear() { clear(x.keys) }

// get returns h's value or -1.
func (x *hashIndex) get(h uint64) int32 {
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		switch x.keys[i] {
		case h:
			return x.vals[i]
		case 0:
			return -1
		}
	}
}

// insert adds h -> v unless h is present; it reports whether it added.
func (x *hashIndex) insert(h uint64, v int32) bool {
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		switch x.keys[i] {
		case h:
			return false
		case 0:
			x.keys[i], x.vals[i] = h, v
			return true
		}
	}
}

// del removes h if present, shifting later entries of its probe run back.
func (x *hashIndex) del(h uint64) {
	i := h & x.mask
	for ; x.keys[i] != h; i = (i + 1) & x.mask {
		if x.keys[i] == 0 {
			return
		}
	}
	for j := (i + 1) & x.mask; x.keys[j] != 0; j = (j + 1) & x.mask {
		home := x.keys[j] & x.mask
		// Move j into the hole at i if its home slot is not in (i, j].
		if (j-home)&x.mask >= (j-i)&x.mask {
			x.keys[i], x.vals[i] = x.keys[j], x.vals[j]
			i = j
		}
	}
	x.keys[i] = 0
}
