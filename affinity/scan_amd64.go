//go:build amd64 && !purego

package affinity

import "github.com/klauspost/cpuid/v2"

// hasCopyPlain reports whether copyPlain has its vector kernel here.
var hasCopyPlain = cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW)

//go:noescape
func copyPlainAVX512(dst, src *byte, n int) int

// copyPlain copies src up to its first '"' or '\\' into dst, which has room
// for len(src) bytes, and returns that index (len(src) when there is none).
// Only for hasCopyPlain.
func copyPlain(dst, src []byte) int {
	if len(src) == 0 {
		return 0
	}
	_ = dst[len(src)-1]
	return copyPlainAVX512(&dst[0], &src[0], len(src))
}
