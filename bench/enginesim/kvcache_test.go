package enginesim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHashIndexMatchesMap drives the index and a Go map with the same random
// operations, with keys crowded into few home slots and sharing
// fingerprints, to exercise probing, the check of the block's own hash,
// stale entries of evicted blocks and the rebuilds that drop them.
func TestHashIndexMatchesMap(t *testing.T) {
	tests := []struct {
		name string
		keys func(r *rand.Rand) uint64
	}{
		{"random keys", func(r *rand.Rand) uint64 { return r.Uint64() | 1 }},
		{"colliding homes", func(r *rand.Rand) uint64 { return uint64(r.IntN(40)+1)<<36 | uint64(r.IntN(4)) }},
		{"one fingerprint", func(r *rand.Rand) uint64 { return 7<<32 | uint64(r.IntN(100)+1) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			const n = 64
			x := newHashIndex(n)
			blk := make([]block, n) // blk[b].hash: the key block b caches, 0 none
			ref := map[uint64]int32{}
			rebuilds := 0
			for op := range 20000 {
				k := tc.keys(r)
				switch r.IntN(3) {
				case 0:
					b := int32(r.IntN(n))
					if blk[b].hash != 0 {
						break // the pool inserts only for a block caching nothing
					}
					_, had := ref[k]
					used := x.used
					added := x.insert(k, b, blk)
					if x.used < used {
						rebuilds++
					}
					if added == had {
						t.Fatalf("op %d insert(%x) = %v, map had it: %v", op, k, added, had)
					}
					if !had {
						ref[k] = b
						blk[b].hash = k
					}
				case 1:
					// evict a block: its entry goes stale
					if b := int32(r.IntN(n)); blk[b].hash != 0 {
						delete(ref, blk[b].hash)
						blk[b].hash = 0
					}
				}
				want, ok := ref[k]
				if !ok {
					want = -1
				}
				if got := x.get(k, blk); got != want {
					t.Fatalf("op %d get(%x) = %d, want %d", op, k, got, want)
				}
				if 2*x.used > len(x.slots) {
					t.Fatalf("op %d: %d of %d slots used", op, x.used, len(x.slots))
				}
			}
			if rebuilds == 0 {
				t.Fatal("no rebuild: stale entries never dropped")
			}
			for k, v := range ref {
				if got := x.get(k, blk); got != v {
					t.Fatalf("final get(%x) = %d, want %d", k, got, v)
				}
			}
		})
	}
}

func TestBlockPoolLRUOrder(t *testing.T) {
	p := newBlockPool(4)
	a, b := p.alloc(), p.alloc()
	p.commit(a, -1, 11, false)
	p.commit(b, a, 22, true)
	p.release(b) // b freed first: evicted first
	p.release(a)
	if p.used() != 0 || p.lookupAfter(-1, 11) != a || p.lookupAfter(a, 22) != b {
		t.Fatalf("freed blocks not cached: used %d", p.used())
	}
	p.touch(a) // a back in use: not evictable
	for range 2 {
		p.alloc() // the two never-used blocks
	}
	if got := p.alloc(); got != b || p.lookupAfter(a, 22) != -1 || p.evictions != 1 {
		t.Fatalf("alloc = %d (want %d), lookup(22) = %d, evictions %d", got, b, p.lookupAfter(a, 22), p.evictions)
	}
	if p.alloc() != -1 {
		t.Fatal("alloc from an exhausted pool")
	}
	if got := p.commit(a, -1, 22, false); got != a || p.lookupAfter(-1, 11) != a || p.lookupAfter(a, 22) != -1 {
		t.Fatal("commit overwrote a cached block")
	}
}

// chainHash is the hash of symbol sym after parent in a test chain.
func chainHash(parent uint64, sym int) uint64 {
	return splitmix64(parent*31+uint64(sym)) | 1
}

// TestLookupIsMap drives the pool with requests as the engine makes them
// (a chain of hashes: the cached prefix is hit block by block, the rest
// allocated and committed, sometimes in two parts, with hits given up
// early so two requests compute the same blocks and one stays anonymous;
// blocks released in any order, evicted and reused), and checks every
// answer of lookupAfter and commit against a map of what every block
// caches: the successor links and the small index of run starts know every
// cached block.
func TestLookupIsMap(t *testing.T) {
	for _, n := range []int{6, 24, 200} {
		t.Run(fmt.Sprint("blocks=", n), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(n), 9))
			p := newBlockPool(n)
			truth := func(h uint64) int32 {
				got := int32(-1)
				for b := range p.blk {
					if p.blk[b].hash == h {
						if got >= 0 {
							t.Fatalf("blocks %d and %d both cache %x", got, b, h)
						}
						got = int32(b)
					}
				}
				return got
			}
			var held []int32
			for op := range 4000 {
				if len(held) > 0 && (p.nfree < 3 || r.IntN(3) == 0) {
					for range r.IntN(len(held)) + 1 {
						i := r.IntN(len(held))
						p.release(held[i])
						held = append(held[:i], held[i+1:]...)
					}
					continue
				}
				// a request: symbols from a small alphabet, so chains share
				// prefixes and branch
				depth := r.IntN(8) + 1
				parent, prev, run := uint64(7), int32(-1), false
				hitting := r.IntN(4) > 0
				for k := range depth {
					if prev >= 0 && p.blk[prev].hash != parent {
						prev = -1 // the block another request cached it in was evicted
					}
					h := chainHash(parent, r.IntN(3))
					parent = h
					want := truth(h)
					if got := p.lookupAfter(prev, h); got != want {
						t.Fatalf("op %d depth %d: lookupAfter(%d, %x) = %d, cached in %d", op, k, prev, h, got, want)
					}
					if hitting && want >= 0 {
						p.touch(want)
						held = append(held, want)
						prev = want
						continue
					}
					hitting = false
					if p.nfree == 0 {
						break
					}
					b := p.alloc()
					held = append(held, b)
					if want >= 0 && truth(h) != want {
						want = -1 // alloc evicted it
					}
					c := p.commit(b, prev, h, run)
					if want < 0 {
						want = b
					}
					if c != want || truth(h) != want {
						t.Fatalf("op %d depth %d: commit(%d, %d, %x) = %d, cached in %d", op, k, b, prev, h, c, truth(h))
					}
					prev, run = c, c == b
				}
				for _, s := range p.cached.slots {
					if s.val != 0 && int(s.val-1) >= n {
						t.Fatalf("op %d: entry for block %d", op, s.val-1)
					}
				}
				if 2*p.cached.used > len(p.cached.slots) {
					t.Fatalf("op %d: %d of %d slots used", op, p.cached.used, len(p.cached.slots))
				}
			}
		})
	}
}

// TestAllocNIsAllocs: allocN gives the blocks n calls of alloc give, in
// order, and leaves the pool (blocks, free queue, index, evictions) the
// same.
func TestAllocNIsAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a, b := newBlockPool(48), newBlockPool(48)
	var held []int32
	for op := range 5000 {
		if n := r.IntN(6); n <= a.nfree && r.IntN(3) > 0 {
			got := a.allocN(nil, n)
			var want []int32
			for range n {
				want = append(want, b.alloc())
			}
			if !slices.Equal(got, want) {
				t.Fatalf("op %d: allocN(%d) = %v, allocs %v", op, n, got, want)
			}
			for _, k := range got {
				h := uint64(r.IntN(200) + 1)
				a.commit(k, -1, h, false)
				b.commit(k, -1, h, false)
			}
			held = append(held, got...)
		} else if len(held) > 0 {
			i := r.IntN(len(held))
			a.release(held[i])
			b.release(held[i])
			held = append(held[:i], held[i+1:]...)
		}
		if !slices.Equal(a.blk, b.blk) || a.head != b.head || a.tail != b.tail || !slices.Equal(a.fq, b.fq) || a.nfree != b.nfree ||
			a.evictions != b.evictions || !slices.Equal(a.cached.slots, b.cached.slots) {
			t.Fatalf("op %d: pools differ", op)
		}
	}
}

// TestFreeQueueIsLRU drives the pool and a plain ordered list of free
// blocks (vLLM's free queue: release appends, a hit removes the block
// wherever it is, alloc pops the front) with the same random operations;
// the pool must allocate the blocks the list gives, in order, through
// many compactions of its ring.
func TestFreeQueueIsLRU(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const n = 8
	p := newBlockPool(n)
	list := []int32{}
	for b := range int32(n) {
		list = append(list, b)
	}
	refs := make([]int, n)
	var held []int32
	for op := range 50000 {
		switch k := r.IntN(4); {
		case k == 0 && len(list) > 0: // alloc, one or a run
			m := r.IntN(min(len(list), 3)) + 1
			got := p.allocN(nil, m)
			if !slices.Equal(got, list[:m]) {
				t.Fatalf("op %d: allocN(%d) = %v, LRU list front %v", op, m, got, list[:m])
			}
			for _, b := range got {
				refs[b] = 1
				p.commit(b, -1, uint64(r.IntN(1000)+1), false)
			}
			list = list[m:]
			held = append(held, got...)
		case k == 1: // a hit on any block (free or held)
			b := int32(r.IntN(n))
			p.touch(b)
			if refs[b] == 0 {
				list = slices.DeleteFunc(list, func(x int32) bool { return x == b })
			}
			refs[b]++
			held = append(held, b)
		case len(held) > 0:
			i := r.IntN(len(held))
			b := held[i]
			held = append(held[:i], held[i+1:]...)
			p.release(b)
			if refs[b]--; refs[b] == 0 {
				list = append(list, b)
			}
		}
		if p.nfree != len(list) {
			t.Fatalf("op %d: nfree %d, LRU list has %d", op, p.nfree, len(list))
		}
		for b := range int32(n) {
			if p.free(b) != (refs[b] == 0) {
				t.Fatalf("op %d: block %d free %v, refs %d", op, b, p.free(b), refs[b])
			}
		}
	}
	if p.tail-p.head > uint32(len(p.fq)) {
		t.Fatalf("ring overflowed: %d entries in %d", p.tail-p.head, len(p.fq))
	}
}

// TestCommitChainIsCommits: requests whose chains share prefixes and
// branch, that hit part of their cached prefix and recompute the rest (so
// some new blocks find their hash cached elsewhere and stay anonymous),
// commit their new blocks with commitChain in one pool and one commit call
// a block in another; the answers and the pools (blocks, successor links,
// index, filter) stay the same.
func TestCommitChainIsCommits(t *testing.T) {
	for _, n := range []int{12, 64, 300} {
		t.Run(fmt.Sprint("blocks=", n), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(n), 11))
			a, b := newBlockPool(n), newBlockPool(n)
			var held []int32
			for op := range 3000 {
				if len(held) > 0 && (a.nfree < 4 || r.IntN(3) == 0) {
					for range r.IntN(len(held)) + 1 {
						i := r.IntN(len(held))
						a.release(held[i])
						b.release(held[i])
						held = append(held[:i], held[i+1:]...)
					}
					continue
				}
				depth := r.IntN(12) + 1
				hashes := make([]uint64, depth)
				parent := uint64(7)
				for k := range hashes {
					hashes[k] = chainHash(parent, r.IntN(3))
					parent = hashes[k]
				}
				// hit a prefix of the cached blocks, maybe not all of it
				prev, k := int32(-1), 0
				for stop := r.IntN(depth + 1); k < stop; k++ {
					c := a.lookupAfter(prev, hashes[k])
					if c < 0 || c != b.lookupAfter(prev, hashes[k]) {
						break
					}
					a.touch(c)
					b.touch(c)
					held = append(held, c)
					prev = c
				}
				m := min(depth-k, a.nfree)
				blocks := a.allocN(nil, m)
				if got := b.allocN(nil, m); !slices.Equal(got, blocks) {
					t.Fatalf("op %d: allocN differs", op)
				}
				held = append(held, blocks...)
				gotPrev, gotRun := a.commitChain(blocks, hashes[k:k+m], prev, false)
				wantPrev, wantRun := prev, false
				for i, blk := range blocks {
					c := b.commit(blk, wantPrev, hashes[k+i], wantRun)
					wantPrev, wantRun = c, c == blk
				}
				if gotPrev != wantPrev || gotRun != wantRun {
					t.Fatalf("op %d: commitChain = %d, %v; commits %d, %v", op, gotPrev, gotRun, wantPrev, wantRun)
				}
				if !slices.Equal(a.blk, b.blk) || a.evictions != b.evictions || !slices.Equal(a.cached.slots, b.cached.slots) ||
					!slices.Equal(a.cached.filter, b.cached.filter) {
					t.Fatalf("op %d: pools differ", op)
				}
			}
		})
	}
}
