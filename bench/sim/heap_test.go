package sim

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"testing"
)

// fixHeap is engineHeap ordered by container/heap's Fix: the reference
// update must match, ties included (which engine steps first when two
// share a time decides results).
type fixHeap struct{ engineHeap }

func (h *fixHeap) update(e int, at int64) {
	h.at[e] = at
	heap.Fix(h, h.pos[e])
}

func TestEngineHeapUpdateIsFix(t *testing.T) {
	for _, n := range []int{1, 2, 3, 16, 33} {
		r := rand.New(rand.NewPCG(uint64(n), 9))
		mk := func() engineHeap {
			h := engineHeap{at: make([]int64, n), pos: make([]int, n)}
			for i := range n {
				h.items = append(h.items, i)
				h.pos[i] = i
				h.at[i] = int64(r.IntN(8))
			}
			return h
		}
		a := mk()
		b := fixHeap{engineHeap{items: slices.Clone(a.items), pos: slices.Clone(a.pos), at: slices.Clone(a.at)}}
		heap.Init(&a)
		heap.Init(&b)
		for op := range 3000 {
			e, at := r.IntN(n), int64(r.IntN(12)) // few distinct times: many ties
			a.update(e, at)
			b.update(e, at)
			if !slices.Equal(a.items, b.items) || !slices.Equal(a.pos, b.pos) {
				t.Fatalf("%d engines, op %d: update gives %v, Fix %v", n, op, a.items, b.items)
			}
		}
	}
}
