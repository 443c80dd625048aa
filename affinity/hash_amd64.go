//go:build amd64 && !purego

package affinity

import "github.com/klauspost/cpuid/v2"

// hasBlocks256 reports whether hashBlocks256 has a vector kernel here.
var hasBlocks256 = cpuid.CPU.Supports(cpuid.AVX512F)

//go:noescape
func hashBlocks256AVX512(dst *uint64, data *byte, n int)

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
