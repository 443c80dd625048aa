//go:build amd64 && !purego

package affinity

import "github.com/klauspost/cpuid/v2"

// The unescapePlain kernels: AVX-512 (64 bytes a step, masked tail) where
// the CPU has AVX512F, AVX512BW, AVX512_VBMI and AVX512_VBMI2 (Ice Lake and
// later, Zen 4 and later), else AVX2 (32 bytes a step, byte by byte tail).
// Both decode a chunk's escapes at once; an AVX-512 CPU without VBMI2
// (Skylake-SP, Cascade Lake) has no byte compress and takes the AVX2 one.
var (
	hasUnescapeAVX512 = cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VBMI, cpuid.AVX512VBMI2)
	hasUnescapeAVX2   = cpuid.CPU.Supports(cpuid.AVX2)
	// hasUnescapePlain reports whether unescapePlain has a vector kernel here.
	hasUnescapePlain = hasUnescapeAVX512 || hasUnescapeAVX2
)

//go:noescape
func unescapePlainAVX512(dst, src *byte, n int) (consumed, written int)

//go:noescape
func unescapePlainAVX2(dst, src *byte, n int) (consumed, written int)

// unescapePlain copies src into dst (room for len(src) bytes) up to its
// first quote or a backslash other than a two-byte escape, decoding those
// escapes; it returns the bytes of src consumed (the stop's index, or
// len(src)) and the bytes written. Only for hasUnescapePlain.
func unescapePlain(dst, src []byte) (consumed, written int) {
	if len(src) == 0 {
		return 0, 0
	}
	_ = dst[len(src)-1]
	if hasUnescapeAVX512 {
		return unescapePlainAVX512(&dst[0], &src[0], len(src))
	}
	return unescapePlainAVX2(&dst[0], &src[0], len(src))
}

// withUnescapeKernels calls f once per unescapePlain kernel this CPU has,
// with that kernel selected, and restores the choice (tests).
func withUnescapeKernels(f func(path string)) {
	a512, a2, plain := hasUnescapeAVX512, hasUnescapeAVX2, hasUnescapePlain
	defer func() { hasUnescapeAVX512, hasUnescapeAVX2, hasUnescapePlain = a512, a2, plain }()
	if a512 {
		f("avx512")
		hasUnescapeAVX512 = false
	}
	if a2 {
		f("avx2")
	}
}
