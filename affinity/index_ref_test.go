package affinity

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// lruModel is the prefix index as plain per-replica LRU lists of block
// hashes (most recent first): the reference the index's tables must agree
// with, whichever of them a pair is kept in.
type lruModel struct {
	caps      []int
	lists     [][]uint64
	parent    map[uint64]uint64 // a block's chain predecessor (rollback)
	evictions uint64
}

func newLRUModel(reps int) *lruModel {
	return &lruModel{caps: make([]int, reps), lists: make([][]uint64, reps), parent: map[uint64]uint64{}}
}

func (m *lruModel) touch(id ReplicaID, h uint64) (held bool) {
	l := m.lists[id]
	if i := slices.Index(l, h); i >= 0 {
		l = slices.Delete(l, i, i+1)
		held = true
	}
	m.lists[id] = slices.Insert(l, 0, h)
	return held
}

func (m *lruModel) evict(id ReplicaID) {
	for len(m.lists[id]) > m.caps[id] {
		m.lists[id] = m.lists[id][:len(m.lists[id])-1]
		m.evictions++
	}
}

func (m *lruModel) insert(id ReplicaID, hashes []uint64) (held int) {
	if m.caps[id] <= 0 {
		return 0
	}
	hashes = hashes[:min(len(hashes), m.caps[id])]
	held = len(hashes)
	for i := len(hashes) - 1; i >= 0; i-- {
		if !m.touch(id, hashes[i]) {
			held = i
		}
	}
	m.evict(id)
	return held
}

func (m *lruModel) holders(h uint64) int32 {
	n := int32(0)
	for _, l := range m.lists {
		if slices.Contains(l, h) {
			n++
		}
	}
	return n
}

// TestIndexIsLRUModel drives the index and the plain LRU lists with the
// same random inserts of chains that share prefixes across 4 replicas (so
// blocks gain and lose second and third holders), capacity changes,
// replica drops and rollbacks, and checks after each that every replica's
// list, every pair's lookup, every block's holder count, the evictions
// and insert's answer agree.
func TestIndexIsLRUModel(t *testing.T) {
	const reps = 4
	rng := rand.New(rand.NewPCG(5, 6))
	x, m := newIndex(), newLRUModel(reps)
	for id := range ReplicaID(reps) {
		x.setCap(id, 60)
		m.caps[id] = 60
	}
	var chains [][]uint64
	for i := range 40 {
		c := chainOf(uint64(i%5), uint64(i), rng.IntN(30), 1+rng.IntN(80))
		for k, h := range c {
			if k > 0 {
				m.parent[h] = c[k-1]
			}
		}
		chains = append(chains, c)
	}
	for step := range 4000 {
		id := ReplicaID(rng.IntN(reps))
		switch op := rng.IntN(20); {
		case op == 0:
			x.dropReplica(id)
			m.lists[id] = nil
		case op == 1:
			c := 1 + rng.IntN(120)
			x.setCap(id, c)
			m.caps[id] = c
			m.evict(id)
		case op == 2:
			c := chains[rng.IntN(len(chains))]
			k, n := rng.IntN(len(c)), 1+rng.IntN(10)
			x.rollback(id, c[k], n)
			for h := c[k]; n > 0 && h != 0 && slices.Contains(m.lists[id], h); n-- {
				m.lists[id] = slices.DeleteFunc(m.lists[id], func(v uint64) bool { return v == h })
				h = m.parent[h]
			}
		default:
			c := chains[rng.IntN(len(chains))]
			c = c[:1+rng.IntN(len(c))]
			if got, want := x.insert(id, c), m.insert(id, c); got != want {
				t.Fatalf("step %d: insert held %d, model %d", step, got, want)
			}
		}
		for r := range ReplicaID(reps) {
			if got := lruOrder(t, x, r); !slices.Equal(got, m.lists[r]) {
				t.Fatalf("step %d: replica %d holds %v, model %v", step, r, got, m.lists[r])
			}
		}
		if x.evictions != m.evictions {
			t.Fatalf("step %d: %d evictions, model %d", step, x.evictions, m.evictions)
		}
		for range 8 {
			c := chains[rng.IntN(len(chains))]
			h, r := c[rng.IntN(len(c))], ReplicaID(rng.IntN(reps))
			if got, want := x.pair(h, r) >= 0, slices.Contains(m.lists[r], h); got != want {
				t.Fatalf("step %d: pair %x/%d found %v, model %v", step, h, r, got, want)
			}
			if got, want := x.count(h), m.holders(h); got != want {
				t.Fatalf("step %d: block %x has %d holders, model %d", step, h, got, want)
			}
		}
		if step%100 == 0 {
			checkIndex(t, x)
		}
	}
	checkIndex(t, x)
}
