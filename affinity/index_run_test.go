package affinity

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// insertByTouch is insert as one touch per block, deepest first: the
// behaviour insert's head-run shortcut must reproduce exactly.
func insertByTouch(x *index, id ReplicaID, hashes []uint64) (held int) {
	x.ensure(id)
	l := &x.lru[id]
	if l.cap <= 0 {
		return 0
	}
	if len(hashes) > int(l.cap) {
		hashes = hashes[:l.cap]
	}
	held = len(hashes)
	for i := len(hashes) - 1; i >= 0; i-- {
		var parent uint64
		if i > 0 {
			parent = hashes[i-1]
		}
		if !x.touch(id, hashes[i], parent) {
			held = i
		}
	}
	for l.n > l.cap {
		x.remove(l.tail)
		x.evictions++
	}
	return held
}

// lruOrder lists replica id's blocks, most recent first, and checks the
// list's back links.
func lruOrder(t *testing.T, x *index, id ReplicaID) []uint64 {
	t.Helper()
	var out []uint64
	prev := int32(-1)
	for ni := x.lru[id].head; ni >= 0; ni = x.nodes[ni].next {
		if x.nodes[ni].prev != prev {
			t.Fatalf("replica %d: node %d's prev is %d, want %d", id, ni, x.nodes[ni].prev, prev)
		}
		out = append(out, x.recs[x.nodes[ni].blk].hash)
		prev = ni
	}
	if x.lru[id].tail != prev || int(x.lru[id].n) != len(out) {
		t.Fatalf("replica %d: tail %d n %d, list ends at %d with %d nodes", id, x.lru[id].tail, x.lru[id].n, prev, len(out))
	}
	return out
}

// TestInsertHeadRun: random inserts of chains that repeat, grow (a
// conversation), share prefixes, and exceed capacity leave the same LRU
// lists, holder counts, evictions and held counts as touching every block,
// on 3 replicas.
func TestInsertHeadRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := newIndex(), newIndex()
	for id := range ReplicaID(3) {
		a.setCap(id, 40)
		b.setCap(id, 40)
	}
	bases := []uint64{11, 22, 33}
	var last []uint64
	var earlier [][]uint64
	for step := range 3000 {
		id := ReplicaID(rng.IntN(3))
		var h []uint64
		switch rng.IntN(5) {
		case 0: // the same chain again
			if last != nil {
				h = last
			}
		case 2: // an earlier chain again (a document asked about again), now
			// anywhere in the LRU list or partly evicted
			if len(earlier) > 0 {
				h = earlier[rng.IntN(len(earlier))]
			}
		case 1: // the last chain grown by a few blocks (a conversation's next turn)
			if last != nil {
				h = chainOf(0, 0, 0, 0)
				h = append(append(h, last...), chainOf(last[len(last)-1], uint64(step), 0, 1+rng.IntN(4))...)
			}
		}
		if h == nil {
			base := bases[rng.IntN(len(bases))]
			h = chainOf(base, uint64(step), rng.IntN(20), 1+rng.IntN(50))
		}
		last = h
		if len(earlier) < 8 {
			earlier = append(earlier, h)
		} else {
			earlier[rng.IntN(len(earlier))] = h
		}
		ha, hb := a.insert(id, h), insertByTouch(b, id, h)
		if ha != hb {
			t.Fatalf("step %d: held %d, by touch %d", step, ha, hb)
		}
		for r := range ReplicaID(3) {
			if oa, ob := lruOrder(t, a, r), lruOrder(t, b, r); !slices.Equal(oa, ob) {
				t.Fatalf("step %d, replica %d: LRU order differs from touching every block", step, r)
			}
		}
		if a.evictions != b.evictions || len(a.pairs) != len(b.pairs) || len(a.blocks) != len(b.blocks) {
			t.Fatalf("step %d: evictions %d/%d pairs %d/%d blocks %d/%d", step, a.evictions, b.evictions, len(a.pairs), len(b.pairs), len(a.blocks), len(b.blocks))
		}
		for _, x := range h {
			if a.count(x) != b.count(x) {
				t.Fatalf("step %d: holder count of a block %d, by touch %d", step, a.count(x), b.count(x))
			}
		}
	}
}
