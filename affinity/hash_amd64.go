//go:build amd64 && !purego

package affinity

import "github.com/klauspost/cpuid/v2"

// hasBlocks256 reports whether hashBlocks256 has a vector kernel here.
var hasBlocks256 = cpuid.CPU.Supports(cpuid.AVX512F)

//go:noescape
func hashBlocks256AVX512(dst *uint64, data *byte, n int)

//go:noescape
func hashChain256AVX512(dst *uint64, data *byte, n int, seed uint64)

// hashChain256 sets dst[i] to the chained hash of data's i-th 256-byte
// block from seed (AppendHashes' values) for every i < len(dst).
func hashChain256(dst []uint64, data []byte, seed uint64) {
	if len(dst) == 0 {
		return
	}
	_ = data[256*len(dst)-1]
	if !hasBlocks256 {
		hashBlocksGeneric(dst, data, 256)
		chainBlocks(dst, seed)
		return
	}
	hashChain256AVX512(&dst[0], &data[0], len(dst), seed)
}

// hashBlocks256 sets dst[i] to the unseeded xxh3 of data's i-th 256-byte
// block for every i < len(dst); data holds at least 256*len(dst) bytes.
func hashBlocks256(dst []uint64, data []byte) {
	if len(dst) == 0 {
		return
	}
	_ = data[256*len(dst)-1]
	if !hasBlocks256 {
		hashBlocksGeneric(dst, data, 256)
		return
	}
	hashBlocks256AVX512(&dst[0], &data[0], len(dst))
}
