package affinity

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// appendHashesRef is the reference chained hash: one xxh3.Hash call per
// block, chained as it goes. AppendHashes must match it bit for bit (the
// hashes are shared between instances over the cluster codec).
func appendHashesRef(dst []uint64, seed uint64, data []byte, blockBytes int) []uint64 {
	h := seed
	for len(data) >= blockBytes {
		h = chain(h, xxh3.Hash(data[:blockBytes]))
		dst = append(dst, h)
		data = data[blockBytes:]
	}
	return dst
}

// TestHashBlocks256: the fixed-size kernel equals xxh3.Hash on every block,
// for random bytes at every alignment, block counts 1-40, and bytes whose
// xor with the secret hits the 32-bit multiply's edge cases (all zeros, all
// ones, the secret itself).
func TestHashBlocks256(t *testing.T) {
	withBlocks256Kernels(func(path string) { testHashBlocks256(t, path) })
}

func testHashBlocks256(t *testing.T, path string) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 256*41+64)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for n := 1; n <= 40; n++ {
		for _, off := range []int{0, 1, 7, 31, 63} {
			data := buf[off : off+256*n]
			got := make([]uint64, n)
			hashBlocks256(got, data)
			for i := range got {
				if want := xxh3.Hash(data[256*i : 256*(i+1)]); got[i] != want {
					t.Fatalf("n=%d off=%d block %d: %#x, xxh3 %#x (kernel %s)", n, off, i, got[i], want, path)
				}
			}
			seed := rng.Uint64()
			chained := make([]uint64, n)
			hashChain256(chained, data, seed)
			if want := appendHashesRef(nil, seed, data, 256); !slices.Equal(chained, want) {
				t.Fatalf("n=%d off=%d: chained %#x, reference %#x (kernel %s)", n, off, chained, want, path)
			}
		}
	}
	fills := [][]byte{make([]byte, 256), make([]byte, 256), make([]byte, 256)}
	for i := range 256 {
		fills[1][i] = 0xFF
	}
	secret := []byte{0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c}
	for i := range 256 {
		fills[2][i] = secret[i%len(secret)]
	}
	for _, f := range fills {
		got := make([]uint64, 1)
		hashBlocks256(got, f)
		if want := xxh3.Hash(f); got[0] != want {
			t.Fatalf("fill %x: %#x, xxh3 %#x (kernel %s)", f[:4], got[0], want, path)
		}
	}
}

// TestAppendHashesMatchesReference: AppendHashes equals the one-call-per-block
// reference for random data, lengths, seeds and block sizes, appending to a
// non-empty dst.
func TestAppendHashesMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 1<<16)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for range 500 {
		bb := []int{256, 256, 256, 64, 128, 240, 241, 512, 1024, 4096}[rng.IntN(10)]
		n := rng.IntN(len(data))
		off := rng.IntN(len(data) - n + 1)
		seed := rng.Uint64()
		pre := []uint64{7, 8}
		got := AppendHashes(append([]uint64(nil), pre...), seed, data[off:off+n], bb)
		want := appendHashesRef(append([]uint64(nil), pre...), seed, data[off:off+n], bb)
		if len(got) != len(want) {
			t.Fatalf("bb=%d n=%d: %d hashes, want %d", bb, n, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("bb=%d n=%d off=%d: hash %d %#x, want %#x", bb, n, off, i, got[i], want[i])
			}
		}
	}
}
