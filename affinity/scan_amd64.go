//go:build amd64 && !purego

package affinity

import "github.com/klauspost/cpuid/v2"

// hasUnescapePlain reports whether unescapePlain has its vector kernel here.
var hasUnescapePlain = cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW)

//go:noescape
func unescapePlainAVX512(dst, src *byte, n int) (consumed, written int)

// unescapePlain copies src into dst (room for len(src) bytes) up to its
// first quote or a backslash other than a two-byte escape, decoding those
// escapes; it returns the bytes of src consumed (the stop's index, or
// len(src)) and the bytes written. Only for hasUnescapePlain.
func unescapePlain(dst, src []byte) (consumed, written int) {
	if len(src) == 0 {
		return 0, 0
	}
	_ = dst[len(src)-1]
	return unescapePlainAVX512(&dst[0], &src[0], len(src))
}
