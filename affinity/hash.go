package affinity

import (
	"math/bits"
	"runtime"
	"slices"

	"github.com/klauspost/cpuid/v2"
	"github.com/zeebo/xxh3"
)

// Chained block hashing.
//
// The canonical prompt is cut into fixed blocks of HashConfig.BlockBytes()
// bytes (default 64 tokens x 4 bytes = 256 bytes). Only full blocks are
// hashed: engines (vLLM, SGLang) cache full KV blocks only, so a trailing
// partial block can never be a cache hit.
//
//	h[-1] = seed                      (Seed(model, cacheSalt))
//	h[i]  = chain(h[i-1], xxh3(block[i]))
//
// chain is a 128->64 bit multiply-fold followed by the xxh3 avalanche, so
// h[i] depends on every byte of blocks 0..i and on the model and salt: two
// prompts share h[i] only if they share the first (i+1) blocks byte for byte
// under the same model and salt.
//
// Blocks are hashed with the unseeded xxh3 (zeebo/xxh3): its seeded variant
// rebuilds a 192-byte secret per call for inputs over 240 bytes. Chaining
// outside the block hash keeps the per-block work to the vector accumulate.

const (
	chainK1 = 0x9E3779B185EBCA87
	chainK2 = 0xC2B2AE3D27D4EB4F
)

// chain folds a block hash into the running chain value.
func chain(prev, block uint64) uint64 {
	hi, lo := bits.Mul64(prev^chainK1, block^chainK2)
	x := hi ^ lo ^ block
	// xxh3 avalanche
	x ^= x >> 37
	x *= 0x165667919E3779F9
	x ^= x >> 32
	return x
}

// Seed derives the chain seed from the model name and an optional cache salt
// (vLLM `cache_salt`; a LoRA adapter is addressed by its model name). Two
// models, or two salts, never share a block hash.
func Seed(model, salt []byte) uint64 {
	s := chain(0x243F6A8885A308D3, xxh3.Hash(model)^uint64(len(model)))
	if len(salt) > 0 {
		s = chain(s, xxh3.Hash(salt)^uint64(len(salt))<<32^1)
	}
	return s
}

// AppendHashes appends the chained hashes of every full block of data to dst
// and returns it. blockBytes must be positive. No allocation when dst has room.
func AppendHashes(dst []uint64, seed uint64, data []byte, blockBytes int) []uint64 {
	n := len(data) / blockBytes
	if n == 0 {
		return dst
	}
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	blocks := dst[start:]
	if blockBytes == 256 {
		hashChain256(blocks, data, seed)
		return dst
	}
	hashBlocksGeneric(blocks, data, blockBytes)
	chainBlocks(blocks, seed)
	return dst
}

// hashBlocksGeneric sets dst[i] to the unseeded xxh3 of data's i-th block
// of blockBytes bytes, one xxh3.Hash call each. 256-byte blocks (the
// default) take the fixed-size kernel (hashChain256) where the CPU has one;
// its output is xxh3's, bit for bit (TestHashBlocks256 and
// TestAppendHashesMatchesReference compare them).
func hashBlocksGeneric(dst []uint64, data []byte, blockBytes int) {
	for i := range dst {
		dst[i] = xxh3.Hash(data[i*blockBytes : (i+1)*blockBytes])
	}
}

// chainBlocks replaces the block hashes in h by their chained values from
// seed: h[i] = chain(h[i-1], h[i]), h[-1] = seed.
func chainBlocks(h []uint64, seed uint64) {
	for i, b := range h {
		seed = chain(seed, b)
		h[i] = seed
	}
}

// HashPath reports the vector path block hashing takes for the default block
// size (256 bytes): "avx512-256" | "avx2-256" (the fixed-size kernels) | "avx512" | "avx2"
// | "sse2" | "neon" | "generic". See HashConfig.HashPath for other block
// sizes.
func HashPath() string { return hashPathFor(DefaultBlockTokens * DefaultBytesPerToken) }

// hashPathFor names the kernel for 256-byte blocks when there is one, else
// mirrors zeebo/xxh3's dispatch (which itself uses cpuid): inputs up to 240
// bytes take a scalar path, longer ones the widest vector unit, AVX-512
// only from 1 KiB.
func hashPathFor(blockBytes int) string {
	if blockBytes == 256 && hasBlocks256 {
		return blocks256Path()
	}
	if blockBytes <= 240 {
		return "generic"
	}
	switch runtime.GOARCH {
	case "amd64":
		switch {
		case cpuid.CPU.Supports(cpuid.AVX512F) && blockBytes >= 1024:
			return "avx512"
		case cpuid.CPU.Supports(cpuid.AVX2):
			return "avx2"
		default:
			return "sse2"
		}
	case "arm64":
		return "neon"
	}
	return "generic"
}

// CPUFeatures lists the vector features cpuid found, for logs and /debug:
// e.g. "avx512f avx2 sse4.2".
func CPUFeatures() string {
	var b []byte
	add := func(ok bool, s string) {
		if ok {
			if len(b) > 0 {
				b = append(b, ' ')
			}
			b = append(b, s...)
		}
	}
	add(cpuid.CPU.Supports(cpuid.AVX512F), "avx512f")
	add(cpuid.CPU.Supports(cpuid.AVX2), "avx2")
	add(cpuid.CPU.Supports(cpuid.SSE42), "sse4.2")
	add(cpuid.CPU.Supports(cpuid.ASIMD), "neon")
	if len(b) == 0 {
		return "none"
	}
	return string(b)
}

// SessionKey hashes a session identifier (a session header or the OpenAI
// `user` field) into Request.SessionKey; empty means no session (0).
func SessionKey(id []byte) uint64 {
	if len(id) == 0 {
		return 0
	}
	return xxh3.Hash(id) | 1
}
