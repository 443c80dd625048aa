package enginesim

import (
	"slices"
	"testing"
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
