package affinity

import (
	"iter"
	"math/rand/v2"
	"testing"
)

// all yields every entry of t: slot and slab index (tests).
func (t *table) all() iter.Seq2[uint32, int32] {
	return func(yield func(uint32, int32) bool) {
		for i, s := range t.slots {
			if s.val != 0 && !yield(uint32(i), s.val-1) {
				return
			}
		}
	}
}

// keyed is a table over a slab of keys, probed as the index probes its
// tables (fingerprint, then the slab entry's key).
type keyed struct {
	t    table
	keys []uint64 // slab; 0 marks a free entry
}

func (k *keyed) find(key uint64) (v int32, slot, fp uint32) {
	fp = k.t.fp(key)
	for i := fp & k.t.mask; ; i = (i + 1) & k.t.mask {
		s := k.t.slots[i]
		if s.val == 0 {
			return -1, i, fp
		}
		if s.fp == fp && k.keys[s.val-1] == key {
			return s.val - 1, i, fp
		}
	}
}

// TestTableMatchesMap runs random inserts, lookups and deletes (keys that
// share their low bits included) against a Go map.
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	k := &keyed{t: newTable()}
	ref := map[uint64]int32{}
	var free []int32
	key := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return uint64(1 + rng.IntN(8))
		case 1:
			return uint64(1+rng.IntN(4096)) << 40 // low bits all zero
		default:
			return uint64(1+rng.IntN(20000)) * 0x9E3779B97F4A7C15
		}
	}
	for step := range 200000 {
		key := key()
		want, present := ref[key]
		switch op := rng.IntN(10); {
		case op < 5:
			k.t.reserve()
			v, i, fp := k.find(key)
			if (v >= 0) != present || present && v != want {
				t.Fatalf("step %d: find %x = %d, want %d %v", step, key, v, want, present)
			}
			if present {
				continue
			}
			if n := len(free); n > 0 {
				v, free = free[n-1], free[:n-1]
				k.keys[v] = key
			} else {
				v = int32(len(k.keys))
				k.keys = append(k.keys, key)
			}
			k.t.setAt(i, fp, v)
			ref[key] = v
		case op < 8:
			if !present {
				continue // the index deletes only what it holds
			}
			if !k.t.delVal(k.t.fp(key), want) {
				t.Fatalf("step %d: delete %x: not found", step, key)
			}
			k.keys[want] = 0
			free = append(free, want)
			delete(ref, key)
		default:
			if v, _, _ := k.find(key); (v >= 0) != present || present && v != want {
				t.Fatalf("step %d: find %x = %d, want %d %v", step, key, v, want, present)
			}
		}
		if k.t.n != len(ref) {
			t.Fatalf("step %d: %d entries, want %d", step, k.t.n, len(ref))
		}
	}
	listed := 0
	for _, v := range k.t.all() {
		if ref[k.keys[v]] != v {
			t.Fatalf("slab %d (key %x) listed, map has %d", v, k.keys[v], ref[k.keys[v]])
		}
		listed++
	}
	if listed != len(ref) {
		t.Fatalf("%d entries listed, want %d", listed, len(ref))
	}
	for key, want := range ref {
		if v, _, _ := k.find(key); v != want {
			t.Fatalf("key %x: %d, want %d", key, v, want)
		}
	}
	if 8*k.t.n > 5*len(k.t.slots) {
		t.Fatalf("%d entries in %d slots: over 5/8 full", k.t.n, len(k.t.slots))
	}
}

// TestTableSpreadsChosenKeys: keys a client could choose to share their
// low bits (hashes that would all land in one slot of an unkeyed table)
// still spread over the table, so no probe run grows long.
func TestTableSpreadsChosenKeys(t *testing.T) {
	k := &keyed{t: newTable()}
	for i := range uint64(8192) {
		k.t.reserve()
		key := (i + 1) << 24
		_, s, fp := k.find(key)
		k.t.setAt(s, fp, int32(len(k.keys)))
		k.keys = append(k.keys, key)
	}
	longest, run := 0, 0
	for _, s := range k.t.slots {
		if s.val == 0 {
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	// 8192 keys in 16384 slots: runs of a few dozen at most when spread
	if longest > 200 {
		t.Fatalf("longest probe run %d slots: keys sharing low bits cluster", longest)
	}
}

// TestTableDeleteKeepsRuns: deleting from a probe run keeps every other
// entry of it reachable from its home slot, wherever its home is.
func TestTableDeleteKeepsRuns(t *testing.T) {
	tab := newTable()
	// one run of 30 entries over slots 0..29: entry i's home is slot
	// i/3 (fingerprint low bits), its slab index i
	for i := range 30 {
		tab.slots[i] = slot{fp: uint32(i)<<8 | uint32(i/3), val: int32(i) + 1}
		tab.n++
	}
	reachable := func(v int32) bool {
		fp := uint32(v)<<8 | uint32(v/3)
		for i := fp & tab.mask; tab.slots[i].val != 0; i = (i + 1) & tab.mask {
			if tab.slots[i] == (slot{fp: fp, val: v + 1}) {
				return true
			}
		}
		return false
	}
	for d := 0; d < 30; d += 4 {
		if !tab.delVal(uint32(d)<<8|uint32(d/3), int32(d)) {
			t.Fatalf("delete %d: not found", d)
		}
		for v := range int32(30) {
			if gone := v <= int32(d) && v%4 == 0; reachable(v) == gone {
				t.Fatalf("after deleting %d: entry %d reachable %v", d, v, !gone)
			}
		}
	}
	if tab.n != 30-8 {
		t.Fatalf("%d entries, want 22", tab.n)
	}
}
