//go:build !amd64 || purego

package affinity

const hasCopyPlain = false

func copyPlain(dst, src []byte) int { panic("copyPlain without a kernel") }
