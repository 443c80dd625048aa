package enginesim

import "sync"

// blockPool is the paged KV cache: NumGPUBlocks blocks, a map from chained
// block hash to the block holding it, and an LRU queue of free blocks. Like
// vLLM V1's KVCacheManager: a block whose reference count drops to zero keeps
// its hash (it stays a cache hit) and joins the tail of the free queue; new
// allocations pop the head, evicting the hash it held. Hit blocks sitting in
// the free queue are taken back out ("touched").
//
// The free queue is a ring of block ids in the order they were freed (vLLM
// keeps the same order in a doubly linked list). A touched block is not
// unlinked: its entry goes stale, and popping the head skips stale
// entries. An entry is live when its block is free and carries the entry's
// stamp (block.ref). So freeing a block writes the ring's tail, not the
// links of the tail block, touching one rewrites no neighbour, and a run
// of allocations reads the ring in order and can load the blocks it will
// pop all at once: their loads are independent, where a list walk waits for
// each link before it can load the next block.
//
// The index holds only the blocks that start a run. A request commits its
// new blocks in chain order; each one the request committed right after
// the one before it is that block's successor (block.next) and gets no
// index entry. The first block of a chain, and the first new block after
// a hit or after a block that stayed anonymous, go into the index. So
// every cached block is in the index or is the successor of the block
// caching its parent hash (the run invariant); a lookup that knows the
// parent's block (a prefix walk does, a commit does) checks its successor
// and then the index, and answers what a map of every cached block would.
// When a block is evicted its successor, if still cached, loses that
// parent and goes into the index (rare: a chain is freed deepest first, so
// its successor was usually evicted before it). A long prompt's new
// blocks then cost a write into the block before each, not a probe of a
// table that is larger than the CPU's caches, and the index, an entry or
// two per request, stays small.
type blockPool struct {
	blk        []block // 16 bytes a block: four to a cache line
	fq         []int32 // the free queue's ring; entry s is fq[s&fqMask]
	fqMask     uint32
	head, tail uint32 // the oldest entry's sequence number, and the next one's
	nfree      int
	cached     hashIndex
	seqs       []*seq // a released engine's pooled sequences, for the next engine on this pool

	evictions uint64
}

type block struct {
	hash uint64 // 0: no cached content
	// ref > 0 is the number of requests holding the block. ref <= 0: the
	// block is free, and -ref is the stamp of its live free-queue entry.
	ref int32
	// next is the block the request that committed this one committed
	// right after it in its chain (its successor in that run), -1 none
	next int32
}

// stamp is the ref a free block holds while free-queue entry s is its
// live one. Sequence numbers of entries in the ring span less than its
// length (far below 2^31), so two of them never share a stamp.
func stamp(s uint32) int32 { return -int32(s & (1<<31 - 1)) }

func newBlockPool(n int) *blockPool {
	if p := spare.take(n); p != nil {
		p.reset()
		p.evictions = 0
		return p
	}
	m := 16
	for m < 2*n {
		m <<= 1
	}
	p := &blockPool{blk: make([]block, n), fq: make([]int32, m), fqMask: uint32(m - 1), cached: newHashIndex(n)}
	p.reset()
	return p
}

// reset frees every block and forgets every cached hash (engine restart).
func (p *blockPool) reset() {
	p.cached.clear()
	n := uint32(len(p.blk))
	for i := range n { // the free queue in block order
		p.fq[i] = int32(i)
		p.blk[i] = block{ref: stamp(i), next: -1}
	}
	p.head, p.tail, p.nfree = 0, n, int(n)
}

func (p *blockPool) total() int { return len(p.blk) }

// size is the pool's memory in bytes.
func (p *blockPool) size() int {
	n := 16*len(p.blk) + 4*len(p.fq) + 8*len(p.cached.slots) + 8*len(p.cached.filter) + 8*len(p.cached.seen) + 8*cap(p.cached.keep)
	for _, s := range p.seqs {
		n += 256 + 8*cap(s.hashes) + 4*cap(s.blocks) + cap(s.tail)
	}
	return n
}

// spare holds the KV caches of released engines (Engine.Release) for the
// next engines of the same size: the cluster simulator builds 4-1024
// engines a run, each cache about 1 MiB, and a suite makes thousands of
// runs, so reusing them saves allocating, zeroing and faulting in tens of
// MiB a run. At most maxSpare bytes are kept.
var spare = &poolCache{m: map[int][]*blockPool{}}

const maxSpare = 256 << 20

type poolCache struct {
	mu    sync.Mutex
	m     map[int][]*blockPool // by block count
	bytes int
}

func (c *poolCache) take(n int) *blockPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := c.m[n]
	if len(ps) == 0 {
		return nil
	}
	p := ps[len(ps)-1]
	ps[len(ps)-1] = nil
	c.m[n] = ps[:len(ps)-1]
	c.bytes -= p.size()
	return p
}

func (c *poolCache) give(p *blockPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes+p.size() > maxSpare {
		return
	}
	c.m[len(p.blk)] = append(c.m[len(p.blk)], p)
	c.bytes += p.size()
}

// used is the number of blocks referenced by a request.
func (p *blockPool) used() int { return len(p.blk) - p.nfree }

// free reports whether block b is in the free queue (no request holds it).
func (p *blockPool) free(b int32) bool { return p.blk[b].ref <= 0 }

// live reports whether free-queue entry s is its block's live entry.
func (p *blockPool) live(s uint32) bool { return p.blk[p.fq[s&p.fqMask]].ref == stamp(s) }

// compact drops the stale entries of a full ring, keeping the live ones in
// order (renumbered from the head). The ring has twice as many entries as
// there are blocks, so at least half of a full ring is stale.
func (p *blockPool) compact() {
	w := p.head
	for s := p.head; s != p.tail; s++ {
		if p.live(s) {
			b := p.fq[s&p.fqMask]
			p.fq[w&p.fqMask] = b
			p.blk[b].ref = stamp(w)
			w++
		}
	}
	p.tail = w
}

// lookupAfter returns the block caching hash h, or -1. prev is the block
// caching h's parent (the chain's previous hash), or -1 when h starts a
// chain or its parent is cached nowhere: a cached block is either in the
// index or the successor of the block that caches its parent (the run
// invariant, see the type comment), so prev's successor and the index
// together know every cached block.
func (p *blockPool) lookupAfter(prev int32, h uint64) int32 {
	if prev >= 0 {
		if c := p.blk[prev].next; c >= 0 && p.blk[c].hash == h {
			return c
		}
	}
	return p.cached.get(h, p.blk)
}

// touch takes a reference on a cached block, taking it out of the free
// queue (its entry goes stale).
func (p *blockPool) touch(b int32) {
	k := &p.blk[b]
	if k.ref <= 0 {
		k.ref = 0
		p.nfree--
	}
	k.ref++
}

// alloc pops the least recently freed block, evicting its cached hash.
// The caller checks nfree first; alloc returns -1 when nothing is free.
func (p *blockPool) alloc() int32 {
	if p.nfree == 0 {
		return -1
	}
	for !p.live(p.head) {
		p.head++
	}
	b := p.fq[p.head&p.fqMask]
	p.head++
	p.nfree--
	p.take(b)
	return b
}

// take gives popped free block b to a request: its cached hash is evicted.
func (p *blockPool) take(b int32) {
	k := &p.blk[b]
	if k.hash != 0 { // its index entry, if any, goes stale (hashIndex)
		k.hash = 0
		p.evictions++
		// its successor loses the parent it was found through: into the
		// index with it (usually it went first: a chain is freed deepest
		// first, so its deeper blocks are evicted before it). A next that
		// was since evicted and reused for other content adds an entry
		// that is as true, only not needed.
		if c := k.next; c >= 0 && p.blk[c].hash != 0 {
			p.cached.insert(p.blk[c].hash, c, p.blk)
		}
	}
	k.ref = 1
	k.next = -1
}

// allocN appends n blocks to dst, as n calls of alloc would (the caller
// checks nfree >= n): it first reads the ring for the n live entries, with
// no write between the loads, so their misses overlap, then takes them. A
// block has one live entry, so taking one never changes which of the
// later entries are live.
func (p *blockPool) allocN(dst []int32, n int) []int32 {
	if n <= 0 {
		return dst
	}
	from := len(dst)
	s := p.head
	for i := 0; i < n; s++ {
		if b := p.fq[s&p.fqMask]; p.blk[b].ref == stamp(s) {
			dst = append(dst, b)
			i++
		}
	}
	p.head = s
	p.nfree -= n
	for _, b := range dst[from:] {
		p.take(b)
	}
	return dst
}

// release drops one reference; a block nobody references joins the free
// queue's tail, still cached.
func (p *blockPool) release(b int32) { p.releaseAll([]int32{b}) }

// releaseAll releases blocks last first, as that many release calls
// would: the ring has room for all of them once (compacted first if
// not), so the loop only reads each block and writes it and the ring.
func (p *blockPool) releaseAll(blocks []int32) {
	if p.tail-p.head+uint32(len(blocks)) > uint32(len(p.fq)) {
		p.compact()
	}
	blk, fq, mask, t := p.blk, p.fq, p.fqMask, p.tail
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		k := &blk[b]
		if k.ref--; k.ref == 0 {
			fq[t&mask] = b
			k.ref = stamp(t)
			t++
		}
	}
	p.nfree += int(t - p.tail)
	p.tail = t
}

// commit records that block b holds the content hashed h, unless a block
// already caches h (then b stays anonymous, as in vLLM), and returns the
// block caching h. prev is the block caching h's parent, as for
// lookupAfter. run says prev is the block the same request committed just
// before b, in this chain: b becomes prev's successor and needs no index
// entry. Otherwise (a chain's first block, or the first after a hit or an
// anonymous block) b goes into the index.
func (p *blockPool) commit(b, prev int32, h uint64, run bool) int32 {
	if p.blk[b].hash != 0 {
		return b
	}
	if c := p.lookupAfter(prev, h); c >= 0 {
		return c
	}
	p.blk[b].hash = h
	if run {
		p.blk[prev].next = b
	} else {
		p.cached.insert(h, b, p.blk)
	}
	return b
}

// commitChain commits blocks[i] as holding hashes[i], in order, as that
// many commit calls would, each one's prev and run the last one's answer:
// a request's new blocks after prev (run: prev is the request's own block
// just before them). It returns the last commit's block and run. Most of a
// long prompt's blocks take the inline path: prev is the request's own
// block with no successor yet and the index has no entry for the hash, so
// no block caches it and the block becomes prev's successor.
func (p *blockPool) commitChain(blocks []int32, hashes []uint64, prev int32, run bool) (int32, bool) {
	blk := p.blk
	hashes = hashes[:len(blocks)]
	for i, b := range blocks {
		h := hashes[i]
		if run && blk[b].hash == 0 && blk[prev].next < 0 && !p.cached.mayHold(h) {
			blk[b].hash = h
			blk[prev].next = b
			prev = b
			continue
		}
		c := p.commit(b, prev, h, run)
		prev, run = c, c == b
	}
	return prev, run
}

// hashIndex maps nonzero block hashes to block ids: open addressing with
// linear probing. A slot is 8 bytes: the hash's high 32 bits (its
// fingerprint; its low bits pick the home slot) and the block id. The full
// hash is the block's own (block.hash, which a hit reads next anyway), so a
// lookup compares fingerprints and checks the block only on a match. The
// pool keeps only the blocks that start a run in it (blockPool).
//
// An evicted block's entry is not deleted: the block's hash is cleared,
// and an entry whose block no longer holds its hash is stale, which the
// block check every match makes already skips. So an eviction writes only
// the block, not a slot somewhere in the table (a probe run to shift
// back); stale entries take slots until the table is rebuilt, when used
// slots pass half of it. A rebuild keeps the live entries (an entry whose
// block's hash has the entry's fingerprint), one per block, and doubles
// the table while they would fill more than a quarter of it, so the next
// rebuild is at least as many inserts away as there are live entries.
// Every block inserted keeps a live entry while it holds its hash, and the
// pool keeps one block per hash, so get's answer is the one block holding
// h if it is in the index.
//
// Most gets miss: a commit checks that no other block caches its hash,
// and the prefix walk ends on a miss. A bit filter answers those first:
// bit filterBit(h) is set for the hash of every entry, live or stale, so
// a get whose bit is clear misses without reading the table. It has four
// bits a slot (at most an eighth of them set, as at most half the slots
// are used), a sixteenth of the table's bytes: the filters of a fleet's
// engines stay in the CPU's caches, where their tables, touched at random
// once a step, do not.
type hashIndex struct {
	slots  []hslot
	mask   uint32
	used   int      // nonempty slots, live or stale
	filter []uint64 // bit filterBit(h) set for every entry's hash
	fmask  uint32   // filter bits - 1
	seen   []uint64 // rebuild's scratch: one bit a block
	keep   []hslot  // rebuild's scratch: the live entries
}

type hslot struct {
	fp  uint32 // fingerprint: the hash's high 32 bits
	val int32  // block id + 1; 0: empty slot
}

// newHashIndex is an empty index for a pool of the given number of
// blocks: a few slots, as it holds an entry or two per cached request.
func newHashIndex(blocks int) hashIndex {
	n := 16
	for n < 4*min(blocks, 256) {
		n <<= 1
	}
	x := hashIndex{slots: make([]hslot, n), mask: uint32(n - 1)}
	x.sizeFilter()
	return x
}

func (x *hashIndex) clear() {
	clear(x.slots)
	clear(x.filter)
	x.used = 0
}

// sizeFilter gives the filter four bits per slot, all clear.
func (x *hashIndex) sizeFilter() {
	bits := 4 * len(x.slots)
	if w := bits / 64; len(x.filter) != w {
		x.filter = make([]uint64, w)
	} else {
		clear(x.filter)
	}
	x.fmask = uint32(bits - 1)
}

// filterBit is h's bit in the filter: the hash's low bits, which the
// fingerprint (the high 32) and so the home slot do not use.
func (x *hashIndex) filterBit(h uint64) uint32 { return uint32(h) & x.fmask }

// mayHold reports whether an entry's hash has h's filter bit: false means
// no entry holds h.
func (x *hashIndex) mayHold(h uint64) bool {
	i := x.filterBit(h)
	return x.filter[i>>6]&(1<<(i&63)) != 0
}

func (x *hashIndex) addFilter(h uint64) {
	i := x.filterBit(h)
	x.filter[i>>6] |= 1 << (i & 63)
}

// fingerprint is h's fingerprint; its probe run starts at fp & mask.
func fingerprint(h uint64) uint32 { return uint32(h >> 32) }

// get returns the block caching h, or -1; blk holds the blocks' hashes.
func (x *hashIndex) get(h uint64, blk []block) int32 {
	if !x.mayHold(h) {
		return -1
	}
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

// insert adds h -> b unless the index has a block holding h already; it
// reports whether it added. blk[b].hash is h, or set to h by the caller
// when insert added.
func (x *hashIndex) insert(h uint64, b int32, blk []block) bool {
	if 2*(x.used+1) > len(x.slots) {
		x.rebuild(blk)
	}
	fp := fingerprint(h)
	for i := fp & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.val == 0 {
			s.fp, s.val = fp, b+1
			x.used++
			x.addFilter(h)
			return true
		}
		if s.fp == fp && blk[s.val-1].hash == h {
			return false
		}
	}
}

// rebuild drops the stale entries, keeping one live entry per block, in a
// table at most a quarter full.
func (x *hashIndex) rebuild(blk []block) {
	if w := (len(blk) + 63) / 64; len(x.seen) < w {
		x.seen = make([]uint64, w)
	}
	keep := x.keep[:0]
	for _, s := range x.slots {
		if s.val == 0 {
			continue
		}
		b := s.val - 1
		if h := blk[b].hash; h == 0 || fingerprint(h) != s.fp || x.seen[b>>6]&(1<<(b&63)) != 0 {
			continue
		}
		x.seen[b>>6] |= 1 << (b & 63)
		keep = append(keep, s)
	}
	for _, s := range keep {
		b := s.val - 1
		x.seen[b>>6] &^= 1 << (b & 63)
	}
	size := len(x.slots)
	for size < 4*len(keep) {
		size <<= 1
	}
	if size != len(x.slots) {
		x.slots, x.mask = make([]hslot, size), uint32(size-1)
	} else {
		clear(x.slots)
	}
	x.sizeFilter()
	x.used = 0
	for _, s := range keep {
		x.place(s)
		x.addFilter(blk[s.val-1].hash)
	}
	x.keep = keep
}

// place stores s at the end of its fingerprint's probe run.
func (x *hashIndex) place(s hslot) {
	i := s.fp & x.mask
	for x.slots[i].val != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = s
	x.used++
}
