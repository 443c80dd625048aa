//go:build !amd64 || purego

package affinity

const hasUnescapePlain = false

func unescapePlain(dst, src []byte) (int, int) { panic("unescapePlain without a kernel") }

func withUnescapeKernels(func(path string)) {}
