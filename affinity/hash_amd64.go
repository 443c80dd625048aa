//go:build amd64 && !purego

package affinity

import "github.com/klauspost/cpuid/v2"

// The fixed-size 256-byte block kernels: AVX-512 (one zmm of accumulators)
// where the CPU has it, else AVX2 (two ymm), else xxh3.Hash per block.
var (
	hasBlocks256AVX512 = cpuid.CPU.Supports(cpuid.AVX512F)
	hasBlocks256AVX2   = cpuid.CPU.Supports(cpuid.AVX2)
	// hasBlocks256 reports whether hashBlocks256 has a vector kernel here.
	hasBlocks256 = hasBlocks256AVX512 || hasBlocks256AVX2
)

//go:noescape
func hashBlocks256AVX512(dst *uint64, data *byte, n int)

//go:noescape
func hashChain256AVX512(dst *uint64, data *byte, n int, seed uint64)

//go:noescape
func hashBlocks256AVX2(dst *uint64, data *byte, n int)

//go:noescape
func hashChain256AVX2(dst *uint64, data *byte, n int, seed uint64)

// hashChain256 sets dst[i] to the chained hash of data's i-th 256-byte
// block from seed (AppendHashes' values) for every i < len(dst).
func hashChain256(dst []uint64, data []byte, seed uint64) {
	if len(dst) == 0 {
		return
	}
	_ = data[256*len(dst)-1]
	switch {
	case hasBlocks256AVX512:
		hashChain256AVX512(&dst[0], &data[0], len(dst), seed)
	case hasBlocks256AVX2:
		hashChain256AVX2(&dst[0], &data[0], len(dst), seed)
	default:
		hashBlocksGeneric(dst, data, 256)
		chainBlocks(dst, seed)
	}
}

// hashBlocks256 sets dst[i] to the unseeded xxh3 of data's i-th 256-byte
// block for every i < len(dst); data holds at least 256*len(dst) bytes.
func hashBlocks256(dst []uint64, data []byte) {
	if len(dst) == 0 {
		return
	}
	_ = data[256*len(dst)-1]
	switch {
	case hasBlocks256AVX512:
		hashBlocks256AVX512(&dst[0], &data[0], len(dst))
	case hasBlocks256AVX2:
		hashBlocks256AVX2(&dst[0], &data[0], len(dst))
	default:
		hashBlocksGeneric(dst, data, 256)
	}
}

// blocks256Path names the 256-byte kernel hashBlocks256 takes ("" = none).
func blocks256Path() string {
	switch {
	case hasBlocks256AVX512:
		return "avx512-256"
	case hasBlocks256AVX2:
		return "avx2-256"
	}
	return ""
}

// withBlocks256Kernels calls f once per 256-byte kernel this CPU has, with
// that kernel selected, and restores the choice (tests).
func withBlocks256Kernels(f func(path string)) {
	a512, a2 := hasBlocks256AVX512, hasBlocks256AVX2
	defer func() { hasBlocks256AVX512, hasBlocks256AVX2 = a512, a2 }()
	if a512 {
		f("avx512-256")
		hasBlocks256AVX512 = false
	}
	if a2 {
		f("avx2-256")
		hasBlocks256AVX2 = false
	}
	f("generic")
}
