package affinity

import "math/rand/v2"

// table is one of the prefix index's hash tables: block hash -> recs index
// (blockTab) and (block, replica) pair -> nodes index (pairTab). Open
// addressing with linear probing and backward-shift deletion, at most 5/8
// full, 8-byte slots: a 32-bit fingerprint of the key and the slab index.
// The key itself is in the slab entry the slot points to (blockRec.hash,
// holder.hash and rep), which a lookup reads anyway, so a lookup checks
// the fingerprint and then that entry: usually one cache line of table and
// one of slab, where a Go map reads a control word, a slot and then the
// slab. A miss returns the slot where the key would go, so adding a block
// costs one probe, not two; a removal finds its slot by the slab index.
//
// Block hashes come from client prompts and are not keyed, so a client could
// choose prompts whose hashes share their low bits. Fingerprints are
// therefore a keyed mix of the key with a random per-table seed (as Go maps
// seed theirs), and the slot a key starts probing at is its fingerprint's
// low bits: keys that collide there cannot be chosen without the seed. The
// seed changes where entries sit, never what a lookup answers.
type table struct {
	slots []slot
	mask  uint32
	n     int // entries
	seed  uint64
}

type slot struct {
	fp  uint32 // fingerprint (table.fp)
	val int32  // slab index + 1; 0 marks an empty slot
}

const minTableSlots = 64

func newTable() table {
	return table{slots: make([]slot, minTableSlots), mask: minTableSlots - 1, seed: rand.Uint64()}
}

// fp is key k's fingerprint; k's probe run starts at fp & mask.
func (t *table) fp(k uint64) uint32 {
	x := k ^ t.seed
	x ^= x >> 32
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	return uint32(x)
}

// reserve grows the table if one more entry would make it more than 5/8
// full (short probe runs; and an index exactly at capacity, which an insert
// overshoots by its new blocks until it evicts, does not double its tables).
// An insert calls it before probing, so the slot its probe ends at stays
// valid until it stores there.
func (t *table) reserve() {
	if 8*(t.n+1) > 5*len(t.slots) {
		t.grow()
	}
}

// setAt stores slab index v with fingerprint fp in empty slot i (the end of
// fp's probe, after reserve).
func (t *table) setAt(i, fp uint32, v int32) {
	t.slots[i] = slot{fp: fp, val: v + 1}
	t.n++
}

// delVal removes the entry with fingerprint fp and slab index v, shifting
// the later entries of its probe run back into the hole so lookups need no
// tombstones. It reports whether the entry was there.
func (t *table) delVal(fp uint32, v int32) bool {
	i := fp & t.mask
	for ; t.slots[i].val != v+1; i = (i + 1) & t.mask {
		if t.slots[i].val == 0 {
			return false
		}
	}
	for j := (i + 1) & t.mask; t.slots[j].val != 0; j = (j + 1) & t.mask {
		// move j into the hole at i unless its home is in (i, j]
		if (j-t.slots[j].fp)&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
	return true
}

// home is the slot value at the start of fp's probe run. Reading the home
// slots of many keys before probing any lets their cache misses overlap:
// a probe's branch on what it loaded keeps the CPU from running ahead of
// it, a plain load of each home does not (index.warm).
func (t *table) home(fp uint32) int32 { return t.slots[fp&t.mask].val }

// grow doubles the table.
func (t *table) grow() { t.resize(2 * len(t.slots)) }

// reserveFor grows the table so that n entries fill at most 5/8 of it, as
// reserve would by the time it held them.
func (t *table) reserveFor(n int) {
	size := len(t.slots)
	for 8*n > 5*size {
		size <<= 1
	}
	if size > len(t.slots) {
		t.resize(size)
	}
}

// resize moves the entries into a table of size slots (a power of two, at
// least the current size).
func (t *table) resize(size int) {
	old := t.slots
	t.slots = make([]slot, size)
	t.mask = uint32(len(t.slots) - 1)
	for _, s := range old {
		if s.val == 0 {
			continue
		}
		i := s.fp & t.mask
		for t.slots[i].val != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = s
	}
}
