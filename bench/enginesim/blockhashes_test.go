package enginesim

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestBlockHashesAsSubmit: BlockHashes gives the chain Submit computes
// (for the base model, an adapter and a salt, prompts with a partial last
// block or token), and Submit uses given hashes as its own and recomputes
// when their count is wrong.
func TestBlockHashesAsSubmit(t *testing.T) {
	for _, tc := range []struct {
		name, adapter, salt string
		prompt              []byte
	}{
		{"base", "", "", prompt("a", 999)},
		{"adapter", "sql-lora", "", prompt("a", 999)},
		{"salt", "", "tenant-1", prompt("a", 64)},
		{"partial token", "", "", append(prompt("b", 70), 'x', 'y')},
		{"under a block", "", "", prompt("c", 9)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, nil)
			r := &Request{ID: 1, Prompt: tc.prompt, Adapter: tc.adapter, CacheSalt: tc.salt, MaxTokens: 4}
			submit(t, e, r, 0)
			want := slices.Clone(r.seq.hashes)
			got := BlockHashes(nil, tc.prompt, e.BlockSize(), tc.adapter, tc.salt)
			if !slices.Equal(got, want) || len(want) != r.PromptTokens/e.BlockSize() {
				t.Fatalf("BlockHashes = %d hashes %x, Submit hashed %d: %x", len(got), got, len(want), want)
			}
			for k := range want { // the engine's other hash path, block by block
				if h := e.hashBlock(r.seq, k); h != want[k] {
					t.Fatalf("block %d: hashBlock %x, Submit %x", k, h, want[k])
				}
			}
			if len(want) == 0 {
				return
			}
			given := slices.Clone(want)
			given[0] ^= 1 // marked: Submit must take them as they are
			r2 := &Request{ID: 2, Prompt: tc.prompt, Adapter: tc.adapter, CacheSalt: tc.salt, MaxTokens: 4, BlockHashes: given}
			submit(t, e, r2, 0)
			if !slices.Equal(r2.seq.hashes, given) {
				t.Fatal("Submit did not use the given block hashes")
			}
			r3 := &Request{ID: 3, Prompt: tc.prompt, Adapter: tc.adapter, CacheSalt: tc.salt, MaxTokens: 4, BlockHashes: given[1:]}
			submit(t, e, r3, 0)
			if !slices.Equal(r3.seq.hashes, want) {
				t.Fatal("Submit used block hashes of the wrong count")
			}
		})
	}
}

// TestPromptTailIsPrompt: a request given its block hashes, its length
// (PromptBytes) and only its tail runs exactly as one given the whole
// prompt: same cache hits, timings and outputs, and the blocks its
// generated tokens complete (which start from the tail) hash the same.
// A tail or hash count that does not match is refused.
func TestPromptTailIsPrompt(t *testing.T) {
	bs := DefaultConfig().BlockSize
	prompts := [][]byte{prompt("a", 999), append(prompt("a", 70), 'x', 'y'), prompt("a", 9), prompt("b", 64), append(prompt("a", 500), prompt("q", 77)...)}
	run := func(tailOnly bool) (string, [][]uint64) {
		e := newTestEngine(t, func(c *Config) { c.NumGPUBlocks = 200 })
		var rs []*Request
		for i, p := range prompts {
			r := &Request{ID: uint64(i), Prompt: p, MaxTokens: 40}
			if tailOnly {
				full := tokensOf(len(p)) / bs * bs * BytesPerToken
				r.BlockHashes = BlockHashes(nil, p, bs, "", "")
				r.Prompt, r.PromptBytes = p[min(full, len(p)):], len(p)
			}
			submit(t, e, r, int64(i)*int64(time.Millisecond))
			rs = append(rs, r)
		}
		obs := &hashRecorder{last: map[uint64][]uint64{}}
		drain(t, e, obs)
		var hs [][]uint64
		for _, r := range rs {
			hs = append(hs, obs.last[r.ID])
		}
		var b bytes.Buffer
		for _, r := range rs {
			fmt.Fprintf(&b, "%d %d %d %d %d %q\n", r.ID, r.PromptTokens, r.CachedTokens, r.FirstTokenAt, r.FinishedAt, r.AppendOutput(nil, 0, r.OutputTokens))
		}
		return b.String(), hs
	}
	want, wantHashes := run(false)
	got, gotHashes := run(true)
	if got != want {
		t.Fatalf("tail only:\n%s\nwhole prompt:\n%s", got, want)
	}
	for i := range wantHashes {
		if !slices.Equal(gotHashes[i], wantHashes[i]) || len(wantHashes[i]) <= tokensOf(len(prompts[i]))/bs {
			t.Fatalf("request %d: %d block hashes with generated blocks, whole prompt %d", i, len(gotHashes[i]), len(wantHashes[i]))
		}
	}
	e := newTestEngine(t, nil)
	p := prompts[1]
	hs := BlockHashes(nil, p, bs, "", "")
	full := tokensOf(len(p)) / bs * bs * BytesPerToken
	for _, r := range []*Request{
		{ID: 1, Prompt: p[full:], PromptBytes: len(p), BlockHashes: hs[1:], MaxTokens: 4}, // a hash short
		{ID: 2, Prompt: p[full-1:], PromptBytes: len(p), BlockHashes: hs, MaxTokens: 4},   // tail a byte long
		{ID: 3, Prompt: p, PromptBytes: len(p), BlockHashes: hs, MaxTokens: 4},            // the whole prompt
	} {
		if err := e.Submit(r, 0); err != ErrPromptTail {
			t.Errorf("request %d: Submit = %v, want ErrPromptTail", r.ID, err)
		}
	}
}

// hashRecorder keeps each request's block hashes as of its last token but
// one (the engine's sequence is gone once it finishes).
type hashRecorder struct{ last map[uint64][]uint64 }

func (o *hashRecorder) OnToken(r *Request, _ int64) {
	if r.seq != nil {
		o.last[r.ID] = slices.Clone(r.seq.hashes)
	}
}

func (o *hashRecorder) OnFinish(*Request, int64) {}
