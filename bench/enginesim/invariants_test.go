package enginesim

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// checkInvariants cross-checks the block pool against the block tables.
func (e *Engine) checkInvariants() error {
	p := e.pool
	refs := make([]int32, p.total())
	if len(e.running) > e.maxSeqs {
		return fmt.Errorf("%d running > MaxNumSeqs %d", len(e.running), e.maxSeqs)
	}
	for _, s := range e.running {
		if s.state != stRunning || s.req == nil || s.req.seq != s {
			return fmt.Errorf("running seq in state %d", s.state)
		}
		if need := e.blocksFor(s.computed); len(s.blocks) < need {
			return fmt.Errorf("seq has %d blocks for %d computed tokens", len(s.blocks), s.computed)
		}
		for _, b := range s.blocks {
			refs[b]++
		}
	}
	for i := range e.waiting.len() {
		s := e.waiting.buf[(e.waiting.head+i)%len(e.waiting.buf)]
		if s.state != stWaiting || len(s.blocks) != 0 || s.computed != 0 {
			return fmt.Errorf("waiting seq state %d with %d blocks, %d computed", s.state, len(s.blocks), s.computed)
		}
	}
	free, inFree := 0, make([]bool, p.total())
	if p.tail-p.head > uint32(len(p.fq)) {
		return fmt.Errorf("free queue holds %d entries, ring of %d", p.tail-p.head, len(p.fq))
	}
	for s := p.head; s != p.tail; s++ {
		if !p.live(s) {
			continue
		}
		b := p.fq[s&p.fqMask]
		if inFree[b] {
			return fmt.Errorf("block %d twice in the free queue", b)
		}
		free++
		inFree[b] = true
	}
	if free != p.nfree {
		return fmt.Errorf("free queue has %d blocks, nfree %d", free, p.nfree)
	}
	entries, cachedIn := 0, map[uint64]int32{}
	for _, sl := range p.cached.slots {
		if sl.val != 0 {
			entries++
			if h := p.blk[sl.val-1].hash; h != 0 && fingerprint(h) == sl.fp && !p.cached.mayHold(h) {
				return fmt.Errorf("index entry of block %d: its hash's filter bit is clear", sl.val-1)
			}
		}
	}
	for b := range p.total() {
		k := p.blk[b]
		if k.hash != 0 {
			if c, dup := cachedIn[k.hash]; dup {
				return fmt.Errorf("blocks %d and %d both cache %x", c, b, k.hash)
			}
			cachedIn[k.hash] = int32(b)
		}
		if max(k.ref, 0) != refs[b] {
			return fmt.Errorf("block %d ref %d, block tables hold %d", b, k.ref, refs[b])
		}
		if (k.ref <= 0) != inFree[b] {
			return fmt.Errorf("block %d ref %d but in the free queue: %v", b, k.ref, inFree[b])
		}
	}
	// every request's chain, looked up as a prefix walk does, finds the
	// blocks that cache it
	check := func(s *seq) error {
		prev := int32(-1)
		for k, h := range s.hashes {
			want, ok := cachedIn[h]
			if !ok {
				want = -1
			}
			if prev = p.lookupAfter(prev, h); prev != want {
				return fmt.Errorf("block %d of a request: lookup finds %d, cached in %d", k, prev, want)
			}
		}
		return nil
	}
	for _, s := range e.running {
		if err := check(s); err != nil {
			return err
		}
	}
	for i := range e.waiting.len() {
		if err := check(e.waiting.buf[(e.waiting.head+i)%len(e.waiting.buf)]); err != nil {
			return err
		}
	}
	if entries != p.cached.used || 2*entries > len(p.cached.slots) {
		return fmt.Errorf("index holds %d entries (%d counted) in %d slots", entries, p.cached.used, len(p.cached.slots))
	}
	return nil
}

// FuzzEngine runs a random workload (arrivals, aborts, resets, tiny caches
// so preemption and eviction are frequent) and checks the invariants after
// every operation, and that everything submitted finishes.
func FuzzEngine(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42, 1000} {
		f.Add(seed, uint8(12), uint8(4))
	}
	f.Fuzz(func(t *testing.T, seed uint64, blocks, seqs uint8) {
		rng := rand.New(rand.NewPCG(seed, 7))
		e := newTestEngine(t, func(c *Config) {
			c.NumGPUBlocks = int(blocks%64) + 8
			c.MaxNumSeqs = int(seqs%8) + 1
			c.MaxNumBatchedTokens = rng.IntN(200) + 1
			c.BlockSize = []int{1, 4, 16}[rng.IntN(3)]
			c.MaxModelLen = c.NumGPUBlocks * c.BlockSize
			c.OutputLen.Max = 40
		})
		var live []*Request
		now := int64(0)
		obs := &recorder{t: t, tokens: map[*Request]int{}}
		for op := range 300 {
			switch k := rng.IntN(10); {
			case k < 6:
				n := rng.IntN(e.capTokens/2) + 1
				r := &Request{ID: uint64(op), Prompt: prompt(fmt.Sprint("t", rng.IntN(4)), n)[:4*n-rng.IntN(4)],
					MaxTokens: rng.IntN(3) * rng.IntN(e.capTokens/2-n/2+1), CacheSalt: []string{"", "s"}[rng.IntN(2)]}
				if err := e.Submit(r, now); err == nil {
					live = append(live, r)
				}
			case k < 7 && len(live) > 0:
				e.Abort(live[rng.IntN(len(live))], now)
			case k < 8 && rng.IntN(20) == 0:
				e.Reset()
				live = live[:0]
			default:
				if next := e.NextEventTime(); next != NoEvent {
					now = next
					e.Advance(now, obs)
				}
			}
			if err := e.checkInvariants(); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
		}
		drain(t, e, obs)
		if err := e.checkInvariants(); err != nil {
			t.Fatalf("after drain: %v", err)
		}
		for _, r := range live {
			if r.Finish == FinishNone {
				t.Errorf("request %d never finished", r.ID)
			}
			if r.Finish != FinishAbort && r.OutputTokens != r.OutputTarget {
				t.Errorf("request %d finished %v with %d of %d tokens", r.ID, r.Finish, r.OutputTokens, r.OutputTarget)
			}
		}
		if st := e.Stats(); st.UsedBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
			t.Errorf("drained engine holds %+v", st)
		}
	})
}
