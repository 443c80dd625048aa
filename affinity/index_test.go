package affinity

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// chainOf makes a synthetic chain of n blocks: blocks [0, shared) derive
// from base, the rest from tag, so chainOf(b, x, s, n) and chainOf(b, y, s, m)
// share exactly their first s blocks.
func chainOf(base, tag uint64, shared, n int) []uint64 {
	h := make([]uint64, n)
	prev := uint64(0)
	for i := range n {
		src := base
		if i >= shared {
			src = tag
		}
		prev = chain(prev^src, uint64(i)+1)
		h[i] = prev
	}
	return h
}

func matches(x *index, hashes []uint64, linear bool) map[ReplicaID]int32 {
	var s matchSet
	s.reset(len(x.lru))
	if linear {
		x.longestLinear(hashes, &s)
	} else {
		x.longest(hashes, &s)
	}
	out := map[ReplicaID]int32{}
	for _, id := range s.touched {
		out[id] = s.m[id]
	}
	return out
}

func TestIndexLongest(t *testing.T) {
	x := newIndex()
	for id := range ReplicaID(4) {
		x.setCap(id, 1000)
	}
	a := chainOf(1, 10, 40, 40)
	b := chainOf(1, 11, 25, 40) // shares 25 blocks with a
	x.insert(0, a)
	x.insert(1, b)
	x.insert(2, a[:7])
	x.insert(3, chainOf(2, 12, 40, 40))
	checkIndex(t, x)
	tests := []struct {
		name  string
		query []uint64
		want  map[ReplicaID]int32
	}{
		{"full a", a, map[ReplicaID]int32{0: 40, 1: 25, 2: 7}},
		{"full b", b, map[ReplicaID]int32{0: 25, 1: 40, 2: 7}},
		{"a extended", chainOf(1, 99, 40, 50), map[ReplicaID]int32{0: 40, 1: 25, 2: 7}},
		{"a prefix", a[:3], map[ReplicaID]int32{0: 3, 1: 3, 2: 3}},
		{"unknown", chainOf(3, 13, 0, 30), map[ReplicaID]int32{}},
		{"empty", nil, map[ReplicaID]int32{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, linear := range []bool{false, true} {
				got := matches(x, tt.query, linear)
				if len(got) != len(tt.want) {
					t.Fatalf("linear=%v got %v want %v", linear, got, tt.want)
				}
				for id, n := range tt.want {
					if got[id] != n {
						t.Fatalf("linear=%v got %v want %v", linear, got, tt.want)
					}
				}
			}
		})
	}
}

// TestIndexLongestRandom checks the binary search against the linear walk
// under random inserts, evictions, resets and removals.
func TestIndexLongestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := newIndex()
	const reps = 16
	for id := range ReplicaID(reps) {
		x.setCap(id, 50+rng.IntN(200))
	}
	var chains [][]uint64
	for i := range 64 {
		base := uint64(rng.IntN(4))
		chains = append(chains, chainOf(base, uint64(100+i), rng.IntN(30), 5+rng.IntN(60)))
	}
	for step := range 3000 {
		c := chains[rng.IntN(len(chains))]
		id := ReplicaID(rng.IntN(reps))
		switch rng.IntN(20) {
		case 0:
			x.dropReplica(id)
		case 1:
			x.setCap(id, 20+rng.IntN(200))
		default:
			x.insert(id, c[:min(len(c), int(x.lru[id].cap))])
		}
		q := chains[rng.IntN(len(chains))]
		got, want := matches(x, q, false), matches(x, q, true)
		if len(got) != len(want) {
			t.Fatalf("step %d: bsearch %v linear %v", step, got, want)
		}
		for id, n := range want {
			if got[id] != n {
				t.Fatalf("step %d: bsearch %v linear %v", step, got, want)
			}
		}
	}
	checkIndex(t, x)
}

// checkIndex verifies the index's internal invariants.
func checkIndex(t *testing.T, x *index) {
	t.Helper()
	pairs := 0
	for id := range x.lru {
		l := &x.lru[id]
		n := int32(0)
		for ni := l.head; ni >= 0; ni = x.nodes[ni].next {
			if x.nodes[ni].rep != ReplicaID(id) {
				t.Fatalf("node %d in list of %d belongs to %d", ni, id, x.nodes[ni].rep)
			}
			n++
		}
		if n != l.n || n > l.cap {
			t.Fatalf("replica %d: list %d, n %d, cap %d", id, n, l.n, l.cap)
		}
		pairs += int(n)
	}
	if pairs != len(x.pairs) {
		t.Fatalf("pairs map %d, lists %d", len(x.pairs), pairs)
	}
	total := 0
	if len(x.blocks) != x.blockTab.n {
		t.Fatalf("blocks %d, table %d", len(x.blocks), x.blockTab.n)
	}
	// every pair is found; pairTab holds exactly the pairs of blocks with
	// two or more holders
	shared := 0
	for id := range x.lru {
		for ni := x.lru[id].head; ni >= 0; ni = x.nodes[ni].next {
			n := x.nodes[ni]
			if got := x.pair(n.hash, n.rep); got != ni || x.recs[n.blk].hash != n.hash {
				t.Fatalf("pair %x/%d: node %d found as %d, block %x", n.hash, n.rep, ni, got, x.recs[n.blk].hash)
			}
			inTab, _, _ := x.findPair(n.hash, n.rep)
			if c := x.recs[n.blk].count; (c >= 2) != (inTab == ni) {
				t.Fatalf("pair %x/%d: %d holders, in pairTab as %d", n.hash, n.rep, c, inTab)
			}
			if x.recs[n.blk].count >= 2 {
				shared++
			}
		}
	}
	if shared != x.pairTab.n {
		t.Fatalf("%d pairs of shared blocks, table %d", shared, x.pairTab.n)
	}
	for _, ni := range x.pairTab.all() {
		n := x.nodes[ni]
		if got, _, _ := x.findPair(n.hash, n.rep); got != ni || x.recs[n.blk].hash != n.hash || x.recs[n.blk].count < 2 {
			t.Fatalf("pairTab entry %x/%d: node %d found as %d, block %+v", n.hash, n.rep, ni, got, x.recs[n.blk])
		}
	}
	for _, bi := range x.blockTab.all() {
		b := x.recs[bi]
		h := b.hash
		if got, _, _ := x.findBlock(h); got != bi {
			t.Fatalf("block %x: rec %d found as %d", h, bi, got)
		}
		if b.hash != h || b.count <= 0 {
			t.Fatalf("block %x: rec %+v", h, b)
		}
		c := int32(0)
		for ni := b.head; ni >= 0; ni = x.nodes[ni].hnext {
			c++
		}
		if c != b.count {
			t.Fatalf("block %x: %d holders, count %d", h, c, b.count)
		}
		total += int(c)
	}
	if total != pairs {
		t.Fatalf("holders %d, pairs %d", total, pairs)
	}
	if live := len(x.nodes) - len(x.freeNodes); live != pairs {
		t.Fatalf("live nodes %d, pairs %d", live, pairs)
	}
}

func TestIndexLRU(t *testing.T) {
	tests := []struct {
		name string
		run  func(x *index) // on replica 0 with cap 10
		want map[int]int32  // chain -> matched blocks on replica 0
	}{
		{
			name: "bound holds, chain longer than cap keeps its head",
			run:  func(x *index) { x.insert(0, testChains[0]) },
			want: map[int]int32{0: 10},
		},
		{
			name: "least recent chain evicted tail first",
			run: func(x *index) {
				x.insert(0, testChains[1][:6])
				x.insert(0, testChains[2][:6]) // evicts 2 tail blocks of chain 1
			},
			want: map[int]int32{1: 4, 2: 6},
		},
		{
			name: "touch protects a chain",
			run: func(x *index) {
				x.insert(0, testChains[1][:5])
				x.insert(0, testChains[2][:5])
				x.insert(0, testChains[1][:5]) // touch 1
				x.insert(0, testChains[3][:5]) // evicts chain 2
			},
			want: map[int]int32{1: 5, 2: 0, 3: 5},
		},
		{
			name: "shrinking capacity evicts",
			run: func(x *index) {
				x.insert(0, testChains[1][:8])
				x.setCap(0, 3)
			},
			want: map[int]int32{1: 3},
		},
		{
			name: "reset drops everything",
			run: func(x *index) {
				x.insert(0, testChains[1][:8])
				x.dropReplica(0)
			},
			want: map[int]int32{1: 0},
		},
		{
			name: "rollback removes the speculative tail only",
			run: func(x *index) {
				x.insert(0, testChains[1][:3])
				held := x.insert(0, testChains[1][:8])
				x.rollback(0, testChains[1][7], 8-held)
			},
			want: map[int]int32{1: 3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newIndex()
			x.setCap(0, 10)
			x.setCap(1, 10)
			x.insert(1, testChains[1][:10]) // another replica's entries are untouched
			tt.run(x)
			for c, want := range tt.want {
				if got := matches(x, testChains[c], false)[0]; got != want {
					t.Fatalf("chain %d: matched %d, want %d", c, got, want)
				}
			}
			if got := matches(x, testChains[1], false)[1]; got != 10 {
				t.Fatalf("replica 1 lost blocks: %d", got)
			}
			checkIndex(t, x)
		})
	}
}

var testChains = [][]uint64{
	chainOf(1, 1, 0, 30),
	chainOf(2, 2, 0, 30),
	chainOf(3, 3, 0, 30),
	chainOf(4, 4, 0, 30),
}

// TestIndexMemoryBound checks that the index's memory stays bounded by its
// capacity, whatever the number of distinct prompts, and within the bytes
// per tracked (block, replica) pair stated in README.md.
func TestIndexMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: allocates ~100 MB of churn (runs in make test)")
	}
	const reps, capBlocks = 8, 1 << 14 // 131072 pairs
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	x := newIndex()
	for id := range ReplicaID(reps) {
		x.setCap(id, capBlocks) // the first insert sizes the tables for it (presize)
	}
	buf := make([]uint64, 64)
	fill := func(rounds int, salt uint64) {
		for i := range rounds {
			prev := salt
			for j := range buf {
				prev = chain(prev, uint64(i*64+j))
				buf[j] = prev
			}
			x.insert(ReplicaID(i%reps), buf)
		}
	}
	fill(reps*capBlocks/64, 1) // exactly full
	runtime.GC()
	runtime.ReadMemStats(&ms)
	full := ms.HeapAlloc
	fill(10*reps*capBlocks/64, 2) // 10x more distinct blocks
	runtime.GC()
	runtime.ReadMemStats(&ms)
	after := ms.HeapAlloc
	pairs := len(x.pairs)
	if pairs != reps*capBlocks {
		t.Fatalf("tracked %d pairs, want %d", pairs, reps*capBlocks)
	}
	checkIndex(t, x)
	perPair := float64(int64(after)-int64(before)) / float64(pairs)
	t.Logf("heap %d B full, %d B after 10x churn: %.0f B per tracked pair", full-before, after-before, perPair)
	if perPair > maxBytesPerPair {
		t.Fatalf("%.0f bytes per tracked pair, bound %d", perPair, maxBytesPerPair)
	}
	if growth := float64(int64(after)-int64(full)) / float64(full-before); growth > 0.25 {
		t.Fatalf("heap grew %.0f%% under churn at constant capacity", growth*100)
	}
}

// maxBytesPerPair is the stated bound (README.md) on router memory per
// tracked (block, replica) pair with unshared blocks, the worst case: a
// 24 B node, a 24 B block record, two map slots, each up to 2x for slab and
// map growth.
const maxBytesPerPair = 176

// TestIndexPresized: the first insert sizes the tables for the replicas'
// capacities, so filling the index to capacity never grows them; a huge
// capacity is sized for presizeMax pairs only.
func TestIndexPresized(t *testing.T) {
	x := newIndex()
	const reps, capBlocks = 4, 3000
	for id := range ReplicaID(reps) {
		x.setCap(id, capBlocks)
	}
	buf := make([]uint64, 50)
	fill := func(rounds int, salt uint64) {
		for i := range rounds {
			prev := salt
			for j := range buf {
				prev = chain(prev, uint64(i*64+j))
				buf[j] = prev
			}
			x.insert(ReplicaID(i%reps), buf)
		}
	}
	fill(1, 1)
	pairs, blocks := len(x.pairTab.slots), len(x.blockTab.slots)
	if 8*reps*capBlocks > 5*pairs || 8*reps*capBlocks > 5*blocks {
		t.Fatalf("tables of %d and %d slots for %d pairs", pairs, blocks, reps*capBlocks)
	}
	fill(3*reps*capBlocks/len(buf), 2)
	if len(x.pairs) != reps*capBlocks || len(x.pairTab.slots) != pairs || len(x.blockTab.slots) != blocks {
		t.Fatalf("%d pairs: tables grew from %d, %d to %d, %d slots", len(x.pairs), pairs, blocks, len(x.pairTab.slots), len(x.blockTab.slots))
	}
	checkIndex(t, x)

	y := newIndex()
	y.setCap(0, 1<<30)
	y.insert(0, buf)
	if n := len(y.pairTab.slots); 5*n > 16*presizeMax {
		t.Fatalf("a 2^30-block replica: %d slots, presizeMax %d pairs", n, presizeMax)
	}
}
