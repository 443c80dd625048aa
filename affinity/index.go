package affinity

import (
	"math"
	"slices"
)

// The prefix index: which replica probably holds which block hash in its KV
// cache.
//
// Layout (all slabs of int32 links, no pointers, so the GC never scans it):
//
//	blockTab table hash->rec        one entry per distinct block hash tracked
//	pairTab  table hash+rep*K->node one entry per (block, replica) held, for blocks with 2+ holders
//	recs     []blockRec             24 B: hash, parent hash, holder list head, holder count
//	nodes    []holder               32 B: block hash and index, replica, LRU prev/next, holder prev/next
//	lru      []replicaLRU           per replica: most recent at head, capacity in blocks
//
// Each replica's nodes form an LRU list bounded by that replica's KV capacity
// in blocks, so the index holds at most sum(capacity) (block, replica) pairs
// whatever the traffic.
//
// A block held by one replica has no pairTab entry: its record's holder
// list is that one node, which says which replica it is. Most blocks have
// one holder (a prompt that shares nothing, the part of a conversation
// after its shared prefix), so adding and evicting them probes one table,
// not two. When a second holder comes, both holders' pairs go into
// pairTab; when one of the last two goes, the other's entry goes too.
//
// Prefix property: a chain is inserted deepest block first, so a shallower
// block is always at least as recent as any deeper block of the same chain
// and LRU eviction removes chain tails first. Hence if replica r holds block
// i of a chain it holds blocks 0..i-1, the holder sets along a chain are
// nested and shrink with depth, and the holder count along a chain is
// non-increasing. longest uses that to binary-search the chain: it probes
// O(k log n) blocks for a chain of n blocks whose holder count takes k
// distinct values, instead of one probe per block (or per block per
// replica).

const pairMul = 0x9E3779B97F4A7C15 // odd: hash + rep*pairMul is a bijection per rep

type blockRec struct {
	hash   uint64
	parent uint64 // hash of the chain predecessor, 0 for a first block
	head   int32  // first holder node, -1 if none
	count  int32  // number of holders
}

type holder struct {
	hash       uint64 // the block's hash (pairTab's key check)
	blk        int32
	rep        ReplicaID
	prev, next int32 // replica LRU list; prev is more recent
	hprev      int32 // block's holder list
	hnext      int32
}

type replicaLRU struct {
	head, tail int32 // head = most recently used
	n          int32
	cap        int32 // capacity in blocks (effective)
}

type index struct {
	blockTab table // block hash -> recs index
	pairTab  table // pairKey -> nodes index, for blocks held by two or more replicas
	// blocks and pairs are zero-size slices whose lengths are the tracked
	// blocks (blockTab's entries) and pairs (nodes in use), which Stats
	// and the tests read with len.
	blocks    []struct{}
	pairs     []struct{}
	recs      []blockRec
	freeRecs  []int32
	nodes     []holder
	freeNodes []int32
	lru       []replicaLRU
	evictions uint64
	warmed    int32 // warm's sink
	capSum    int   // sum of the replicas' capacities (lru.cap)
	presized  int   // pairs the tables are sized for (presize)
}

// presizeMax bounds presize: tables for 2^18 pairs are 8 MB.
const presizeMax = 1 << 18

// presize sizes both tables for the pairs the replicas' capacities allow
// (at most presizeMax), so that an index filling up (every router, before
// its first evictions) does not rehash its tables at each doubling on the
// way: the size growth would reach, reserved once. insert calls it when
// the capacities have grown (setCap), so a fleet being added is sized
// once. It changes where entries sit, not what any lookup answers.
func (x *index) presize() {
	n := min(x.capSum, presizeMax)
	if n <= x.presized {
		return
	}
	x.presized = n
	x.blockTab.reserveFor(n)
	x.pairTab.reserveFor(n)
}

func newIndex() *index {
	return &index{blockTab: newTable(), pairTab: newTable(),
		blocks: make([]struct{}, 0, math.MaxInt), pairs: make([]struct{}, 0, math.MaxInt)}
}

func pairKey(h uint64, r ReplicaID) uint64 { return h + uint64(r+1)*pairMul }

// ensure grows the per-replica table to hold id.
func (x *index) ensure(id ReplicaID) {
	for int(id) >= len(x.lru) {
		x.lru = append(x.lru, replicaLRU{head: -1, tail: -1})
	}
}

// setCap sets a replica's capacity in blocks and evicts down to it.
func (x *index) setCap(id ReplicaID, blocks int) {
	x.ensure(id)
	l := &x.lru[id]
	c := int32(min(max(blocks, 1), 1<<30))
	x.capSum += int(c) - int(l.cap)
	l.cap = c
	for l.n > l.cap {
		x.remove(l.tail)
		x.evictions++
	}
}

// findBlock returns h's record, or -1 and the blockTab slot where h goes,
// and h's fingerprint.
func (x *index) findBlock(h uint64) (rec int32, slot, fp uint32) {
	t := &x.blockTab
	fp = t.fp(h)
	for i := fp & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s.val == 0 {
			return -1, i, fp
		}
		if s.fp == fp && x.recs[s.val-1].hash == h {
			return s.val - 1, i, fp
		}
	}
}

// pair returns replica id's node of block h, or -1.
func (x *index) pair(h uint64, id ReplicaID) int32 {
	bi, _, _ := x.findBlock(h)
	if bi < 0 {
		return -1
	}
	return x.holderOf(bi, id)
}

// holderOf returns replica id's node of block record bi, or -1: the one
// holder's node, or pairTab's entry when the block has two or more.
func (x *index) holderOf(bi int32, id ReplicaID) int32 {
	b := &x.recs[bi]
	if b.count == 1 {
		if x.nodes[b.head].rep == id {
			return b.head
		}
		return -1
	}
	ni, _, _ := x.findPair(b.hash, id)
	return ni
}

// findPair returns replica id's node of block h from pairTab (blocks with
// two or more holders), or -1 and the pairTab slot where it goes, and the
// pair's fingerprint.
func (x *index) findPair(h uint64, id ReplicaID) (node int32, slot, fp uint32) {
	t := &x.pairTab
	fp = t.fp(pairKey(h, id))
	for i := fp & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s.val == 0 {
			return -1, i, fp
		}
		if n := &x.nodes[s.val-1]; s.fp == fp && n.hash == h && n.rep == id {
			return s.val - 1, i, fp
		}
	}
}

// count returns how many replicas hold h.
func (x *index) count(h uint64) int32 {
	if i, _, _ := x.findBlock(h); i >= 0 {
		return x.recs[i].count
	}
	return 0
}

// insert records that replica id now holds hashes (a chain from its first
// block), deepest first, evicting the replica's least recent blocks beyond
// its capacity. Only the first cap blocks are inserted. It returns how many
// leading blocks the replica held before.
func (x *index) insert(id ReplicaID, hashes []uint64) (held int) {
	x.ensure(id)
	l := &x.lru[id]
	if l.cap <= 0 {
		return 0
	}
	if x.presized < x.capSum && x.presized < presizeMax {
		x.presize()
	}
	if len(hashes) > int(l.cap) {
		hashes = hashes[:l.cap]
	}
	held = len(hashes)
	// The chain's first m blocks are often a run of the replica's LRU
	// list already, in order (the same prompt or document sent to the same
	// replica again, or a conversation growing): touching them would move
	// each to the front in turn, leaving them in this order. They are left
	// in place and, once the deeper blocks are touched, moved to the front
	// as one run, which is the order the touches would give, with one
	// lookup for the run instead of one per block.
	m, first, last := x.chainRun(id, hashes)
	x.warm(id, hashes[m:])
	for i := len(hashes) - 1; i >= m; i-- {
		var parent uint64
		if i > 0 {
			parent = hashes[i-1]
		}
		if !x.touch(id, hashes[i], parent) {
			held = i // the first block missing before the insert
		}
	}
	if m > 0 && !x.runToFront(id, first, last, m) {
		// The run was broken up by the deeper touches (a block hash
		// repeated in the chain): touch its blocks one by one instead.
		for i := m - 1; i >= 0; i-- {
			var parent uint64
			if i > 0 {
				parent = hashes[i-1]
			}
			x.touch(id, hashes[i], parent)
		}
	}
	x.warmTail(id, int(l.n-l.cap))
	for l.n > l.cap {
		x.remove(l.tail)
		x.evictions++
	}
	return held
}

// warmTail reads, for the k least recent nodes of replica id (the ones an
// insert is about to evict), their block records and the home slots of
// their block table entries, ahead of removing them one by one: as warm
// does for a new chain, so the removals' misses overlap. A second pass,
// over what the first brought into the caches, reads the pairTab home
// slots of the nodes whose blocks are shared (the only ones with an
// entry there).
func (x *index) warmTail(id ReplicaID, k int) {
	if k < warmMin {
		return
	}
	var acc int32
	for ni, j := x.lru[id].tail, k; ni >= 0 && j > 0; j-- {
		n := &x.nodes[ni]
		acc += x.blockTab.home(x.blockTab.fp(n.hash)) + x.recs[n.blk].count
		ni = n.prev
	}
	for ni, j := x.lru[id].tail, k; ni >= 0 && j > 0; j-- {
		n := &x.nodes[ni]
		if x.recs[n.blk].count >= 2 {
			acc += x.pairTab.home(x.pairTab.fp(pairKey(n.hash, id)))
		}
		ni = n.prev
	}
	x.warmed += acc
}

// chainRun returns how many leading hashes are, in order, consecutive
// nodes of replica id's LRU list (from the node of hashes[0], wherever it
// is), and the first and last of those nodes.
func (x *index) chainRun(id ReplicaID, hashes []uint64) (m int, first, last int32) {
	if len(hashes) == 0 {
		return 0, -1, -1
	}
	first, last = x.lru[id].head, -1
	if first < 0 || x.nodes[first].hash != hashes[0] {
		first = x.pair(hashes[0], id)
	}
	for ni := first; ni >= 0 && m < len(hashes); ni = x.nodes[ni].next {
		if x.nodes[ni].hash != hashes[m] {
			break
		}
		m, last = m+1, ni
	}
	return m, first, last
}

// runToFront moves the run of m nodes from first to last of replica id's
// LRU list to its front. It reports false, changing nothing, when those
// nodes are no longer such a run.
func (x *index) runToFront(id ReplicaID, first, last int32, m int) bool {
	n, ni := 1, first
	for ; ni != last && ni >= 0; ni = x.nodes[ni].next {
		n++
	}
	if ni != last || n != m {
		return false
	}
	l := &x.lru[id]
	if l.head == first {
		return true
	}
	prev, next := x.nodes[first].prev, x.nodes[last].next
	x.nodes[prev].next = next
	if next >= 0 {
		x.nodes[next].prev = prev
	} else {
		l.tail = prev
	}
	x.nodes[first].prev = -1
	x.nodes[last].next = l.head
	x.nodes[l.head].prev = last
	l.head = first
	return true
}

// warm reads the block table's home slots of every block of hashes on
// replica id, ahead of touching them one by one: a long new chain (a
// 100k-token prompt is 1,600 blocks) probes a table far larger than the
// caches, and its misses then overlap instead of following each other. A
// second pass, its block table probes now cached, reads the records and,
// for blocks held elsewhere already, the pairTab home slot of the pair
// the touch will look up. What it reads is summed into x.warmed only so
// the loads stay.
func (x *index) warm(id ReplicaID, hashes []uint64) {
	if len(hashes) < warmMin {
		return
	}
	var acc int32
	for _, h := range hashes {
		acc += x.blockTab.home(x.blockTab.fp(h))
	}
	for _, h := range hashes {
		if bi, _, _ := x.findBlock(h); bi >= 0 && x.recs[bi].count >= 2 {
			acc += x.pairTab.home(x.pairTab.fp(pairKey(h, id)))
		}
	}
	x.warmed += acc
}

// warmMin is the chain length from which insert warms the table first;
// a short chain's few probes gain nothing from it.
const warmMin = 16

// touch makes (h, id) the replica's most recent block, adding it if needed.
// It reports whether the replica held h already.
func (x *index) touch(id ReplicaID, h, parent uint64) (held bool) {
	l := &x.lru[id]
	x.blockTab.reserve()
	bi, bs, bfp := x.findBlock(h)
	if bi >= 0 {
		if ni := x.holderOf(bi, id); ni >= 0 {
			if l.head != ni {
				x.unlinkLRU(ni)
				x.pushFront(ni)
			}
			return true
		}
	} else {
		bi = x.newRec()
		x.recs[bi] = blockRec{hash: h, parent: parent, head: -1}
		x.blockTab.setAt(bs, bfp, bi)
		x.blocks = x.blocks[:x.blockTab.n]
	}
	ni := x.newNode()
	n := &x.nodes[ni]
	*n = holder{hash: h, blk: bi, rep: id, prev: -1, next: -1, hprev: -1, hnext: x.recs[bi].head}
	if n.hnext >= 0 {
		x.nodes[n.hnext].hprev = ni
	}
	b := &x.recs[bi]
	b.head = ni
	b.count++
	switch {
	case b.count == 2: // the block's first holder gets its entry too
		x.addPair(n.hnext)
		x.addPair(ni)
	case b.count > 2:
		x.addPair(ni)
	}
	x.pairs = x.pairs[:len(x.pairs)+1]
	x.pushFront(ni)
	return false
}

// addPair puts node ni's pair into pairTab (its block has two or more
// holders now).
func (x *index) addPair(ni int32) {
	n := &x.nodes[ni]
	x.pairTab.reserve()
	_, ps, pfp := x.findPair(n.hash, n.rep)
	x.pairTab.setAt(ps, pfp, ni)
}

// delPair takes node ni's pair out of pairTab.
func (x *index) delPair(ni int32) {
	n := &x.nodes[ni]
	x.pairTab.delVal(x.pairTab.fp(pairKey(n.hash, n.rep)), ni)
}

func (x *index) newRec() int32 {
	if k := len(x.freeRecs); k > 0 {
		i := x.freeRecs[k-1]
		x.freeRecs = x.freeRecs[:k-1]
		return i
	}
	x.recs = append(growSlab(x.recs), blockRec{})
	return int32(len(x.recs) - 1)
}

// growSlab doubles a full slab's capacity. append grows a large slice by
// a quarter at a time, so a slab filling up to a few hundred thousand
// entries (every router, before its first evictions; the simulator builds
// one a run) would copy itself several times over; doubling copies it
// about once.
func growSlab[T any](s []T) []T {
	if len(s) < cap(s) {
		return s
	}
	return slices.Grow(s, max(len(s), 64))
}

func (x *index) newNode() int32 {
	if k := len(x.freeNodes); k > 0 {
		i := x.freeNodes[k-1]
		x.freeNodes = x.freeNodes[:k-1]
		return i
	}
	x.nodes = append(growSlab(x.nodes), holder{})
	return int32(len(x.nodes) - 1)
}

func (x *index) pushFront(ni int32) {
	n := &x.nodes[ni]
	l := &x.lru[n.rep]
	n.prev, n.next = -1, l.head
	if l.head >= 0 {
		x.nodes[l.head].prev = ni
	} else {
		l.tail = ni
	}
	l.head = ni
	l.n++
}

func (x *index) unlinkLRU(ni int32) {
	n := &x.nodes[ni]
	l := &x.lru[n.rep]
	if n.prev >= 0 {
		x.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		x.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = -1, -1
	l.n--
}

// remove drops one (block, replica) node, and the block when it has no
// holder left.
func (x *index) remove(ni int32) {
	x.unlinkLRU(ni)
	n := &x.nodes[ni]
	b := &x.recs[n.blk]
	if b.count >= 2 {
		x.delPair(ni)
	}
	x.pairs = x.pairs[:len(x.pairs)-1]
	if n.hprev >= 0 {
		x.nodes[n.hprev].hnext = n.hnext
	} else {
		b.head = n.hnext
	}
	if n.hnext >= 0 {
		x.nodes[n.hnext].hprev = n.hprev
	}
	b.count--
	if b.count == 1 { // the last holder is its record's head: no entry
		x.delPair(b.head)
	}
	if b.count == 0 {
		x.blockTab.delVal(x.blockTab.fp(n.hash), n.blk)
		x.blocks = x.blocks[:x.blockTab.n]
		x.freeRecs = append(x.freeRecs, n.blk)
	}
	*n = holder{blk: -1, rep: NoReplica}
	x.freeNodes = append(x.freeNodes, ni)
}

// dropReplica forgets every block of replica id (restart or removal).
func (x *index) dropReplica(id ReplicaID) {
	if int(id) >= len(x.lru) {
		return
	}
	for x.lru[id].head >= 0 {
		x.remove(x.lru[id].head)
	}
}

// rollback removes up to n blocks of replica id walking a chain back from
// its deepest block tail (undo of a speculative insert).
func (x *index) rollback(id ReplicaID, tail uint64, n int) {
	h := tail
	for ; n > 0 && h != 0; n-- {
		ni := x.pair(h, id)
		if ni < 0 {
			return
		}
		parent := x.recs[x.nodes[ni].blk].parent
		x.remove(ni)
		h = parent
	}
}

// blocksOf returns how many blocks replica id holds.
func (x *index) blocksOf(id ReplicaID) int {
	if int(id) >= len(x.lru) {
		return 0
	}
	return int(x.lru[id].n)
}

// matchSet accumulates per-replica matched block counts for one request:
// m is indexed by ReplicaID, touched lists the ids set so they can be reset.
type matchSet struct {
	m       []int32
	touched []ReplicaID
}

func (s *matchSet) reset(n int) {
	for _, id := range s.touched {
		if int(id) < len(s.m) {
			s.m[id] = 0
		}
	}
	s.touched = s.touched[:0]
	if len(s.m) < n {
		if cap(s.m) >= n {
			old := len(s.m)
			s.m = s.m[:n]
			clear(s.m[old:])
		} else {
			s.m = make([]int32, n, n+n/2)
		}
	}
}

func (s *matchSet) raise(id ReplicaID, blocks int32) {
	if int(id) >= len(s.m) {
		return
	}
	if s.m[id] == 0 {
		s.touched = append(s.touched, id)
	}
	if blocks > s.m[id] {
		s.m[id] = blocks
	}
}

// set makes id's match exactly blocks (the slot model's prediction
// replacing the index's).
func (s *matchSet) set(id ReplicaID, blocks int32) {
	if int(id) >= len(s.m) {
		return
	}
	if s.m[id] == 0 && blocks != 0 {
		s.touched = append(s.touched, id)
	}
	s.m[id] = blocks
}

// longest fills s with each replica's longest held prefix of hashes, in
// blocks, by binary search over the chain (see the file comment).
func (x *index) longest(hashes []uint64, s *matchSet) {
	if len(hashes) == 0 {
		return
	}
	c0 := x.count(hashes[0])
	if c0 == 0 {
		return
	}
	x.split(hashes, s, 0, c0, len(hashes), 0)
}

// split handles blocks [lo, hi): clo = count(lo) > 0, chi = count(hi) (0 for
// hi == len(hashes)). Holder sets are nested, so equal counts mean equal sets
// and nothing ends inside the range.
func (x *index) split(hashes []uint64, s *matchSet, lo int, clo int32, hi int, chi int32) {
	for {
		if clo == chi {
			return
		}
		if hi == lo+1 {
			bi, _, _ := x.findBlock(hashes[lo])
			for ni := x.recs[bi].head; ni >= 0; ni = x.nodes[ni].hnext {
				s.raise(x.nodes[ni].rep, int32(lo+1))
			}
			return
		}
		mid := int(uint(lo+hi) >> 1)
		cm := x.count(hashes[mid])
		if cm == 0 {
			hi, chi = mid, 0
			continue
		}
		x.split(hashes, s, lo, clo, mid, cm)
		lo, clo = mid, cm
	}
}

// longestLinear is the baseline: one probe per block, walking every holder.
// It gives the same answer as longest when the prefix property holds.
func (x *index) longestLinear(hashes []uint64, s *matchSet) {
	for i, h := range hashes {
		bi, _, _ := x.findBlock(h)
		if bi < 0 {
			return
		}
		for ni := x.recs[bi].head; ni >= 0; ni = x.nodes[ni].hnext {
			s.raise(x.nodes[ni].rep, int32(i+1))
		}
	}
}
