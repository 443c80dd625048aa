//go:build !amd64 || purego

package affinity

const hasBlocks256 = false

// hashBlocks256 sets dst[i] to the unseeded xxh3 of data's i-th 256-byte
// block for every i < len(dst).
func hashBlocks256(dst []uint64, data []byte) { hashBlocksGeneric(dst, data, 256) }

// hashChain256 sets dst[i] to the chained hash of data's i-th 256-byte
// block from seed for every i < len(dst).
func hashChain256(dst []uint64, data []byte, seed uint64) {
	hashBlocksGeneric(dst, data, 256)
	chainBlocks(dst, seed)
}

func blocks256Path() string { return "" }

func withBlocks256Kernels(f func(path string)) { f("generic") }
