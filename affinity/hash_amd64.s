//go:build amd64 && !purego

#include "textflag.h"

// xxh3k256: the xxh3 default secret as read for a 256-byte input, eight
// qwords per row: stripe 0 (secret+0), stripe 1 (+8), stripe 2 (+16), the
// last stripe (+121), the accumulator merge (+11); then the initial
// accumulators.
DATA xxh3k256<>+0(SB)/8, $0xbe4ba423396cfeb8
DATA xxh3k256<>+8(SB)/8, $0x1cad21f72c81017c
DATA xxh3k256<>+16(SB)/8, $0xdb979083e96dd4de
DATA xxh3k256<>+24(SB)/8, $0x1f67b3b7a4a44072
DATA xxh3k256<>+32(SB)/8, $0x78e5c0cc4ee679cb
DATA xxh3k256<>+40(SB)/8, $0x2172ffcc7dd05a82
DATA xxh3k256<>+48(SB)/8, $0x8e2443f7744608b8
DATA xxh3k256<>+56(SB)/8, $0x4c263a81e69035e0
DATA xxh3k256<>+64(SB)/8, $0x1cad21f72c81017c
DATA xxh3k256<>+72(SB)/8, $0xdb979083e96dd4de
DATA xxh3k256<>+80(SB)/8, $0x1f67b3b7a4a44072
DATA xxh3k256<>+88(SB)/8, $0x78e5c0cc4ee679cb
DATA xxh3k256<>+96(SB)/8, $0x2172ffcc7dd05a82
DATA xxh3k256<>+104(SB)/8, $0x8e2443f7744608b8
DATA xxh3k256<>+112(SB)/8, $0x4c263a81e69035e0
DATA xxh3k256<>+120(SB)/8, $0xcb00c391bb52283c
DATA xxh3k256<>+128(SB)/8, $0xdb979083e96dd4de
DATA xxh3k256<>+136(SB)/8, $0x1f67b3b7a4a44072
DATA xxh3k256<>+144(SB)/8, $0x78e5c0cc4ee679cb
DATA xxh3k256<>+152(SB)/8, $0x2172ffcc7dd05a82
DATA xxh3k256<>+160(SB)/8, $0x8e2443f7744608b8
DATA xxh3k256<>+168(SB)/8, $0x4c263a81e69035e0
DATA xxh3k256<>+176(SB)/8, $0xcb00c391bb52283c
DATA xxh3k256<>+184(SB)/8, $0xa32e531b8b65d088
DATA xxh3k256<>+192(SB)/8, $0xea647378d9c97e9f
DATA xxh3k256<>+200(SB)/8, $0xc5c3ebd33483acc5
DATA xxh3k256<>+208(SB)/8, $0x17eb6313faffa081
DATA xxh3k256<>+216(SB)/8, $0xd349daf0b751dd0d
DATA xxh3k256<>+224(SB)/8, $0x2b9e68d429265516
DATA xxh3k256<>+232(SB)/8, $0x8ffca1477d58be16
DATA xxh3k256<>+240(SB)/8, $0x45ce31d07ad1b8f8
DATA xxh3k256<>+248(SB)/8, $0xaf280416958f3acb
DATA xxh3k256<>+256(SB)/8, $0x6dd4de1cad21f72c
DATA xxh3k256<>+264(SB)/8, $0xa44072db979083e9
DATA xxh3k256<>+272(SB)/8, $0xe679cb1f67b3b7a4
DATA xxh3k256<>+280(SB)/8, $0xd05a8278e5c0cc4e
DATA xxh3k256<>+288(SB)/8, $0x4608b82172ffcc7d
DATA xxh3k256<>+296(SB)/8, $0x9035e08e2443f774
DATA xxh3k256<>+304(SB)/8, $0x52283c4c263a81e6
DATA xxh3k256<>+312(SB)/8, $0x65d088cb00c391bb
DATA xxh3k256<>+320(SB)/8, $0x00000000c2b2ae3d
DATA xxh3k256<>+328(SB)/8, $0x9e3779b185ebca87
DATA xxh3k256<>+336(SB)/8, $0xc2b2ae3d27d4eb4f
DATA xxh3k256<>+344(SB)/8, $0x165667b19e3779f9
DATA xxh3k256<>+352(SB)/8, $0x85ebca77c2b2ae63
DATA xxh3k256<>+360(SB)/8, $0x0000000085ebca77
DATA xxh3k256<>+368(SB)/8, $0x27d4eb2f165667c5
DATA xxh3k256<>+376(SB)/8, $0x000000009e3779b1
GLOBL xxh3k256<>(SB), RODATA|NOPTR, $384

// BLOCK256 leaves in R8 the xxh3 of the 256 bytes at (SI), with Z16-Z21
// holding xxh3k256 and R9, R10 the avalanche and length constants:
// acc[i] += lo32(d^k) * hi32(d^k) + d[i^1] for each stripe, then the merge
// len*PRIME64_1 + sum of fold(acc[2j]^k, acc[2j+1]^k), then the avalanche.
// The accumulators reach the scalar multiplies through extracts, not a
// store and eight loads: a 64-byte store does not forward to 8-byte loads,
// which then wait for it to retire (that version ran at half the speed).
// It clobbers AX, DX, X1 and Z0-Z12.
#define BLOCK256 \
	VMOVDQU64 0(SI), Z1; \
	VPXORQ    Z16, Z1, Z2; \
	VPSRLQ    $32, Z2, Z3; \
	VPMULUDQ  Z3, Z2, Z2; \
	VPSHUFD   $0x4e, Z1, Z1; \
	VPADDQ    Z21, Z1, Z0; \
	VPADDQ    Z2, Z0, Z0; \
	VMOVDQU64 64(SI), Z4; \
	VPXORQ    Z17, Z4, Z5; \
	VPSRLQ    $32, Z5, Z6; \
	VPMULUDQ  Z6, Z5, Z5; \
	VPSHUFD   $0x4e, Z4, Z4; \
	VPADDQ    Z4, Z0, Z0; \
	VPADDQ    Z5, Z0, Z0; \
	VMOVDQU64 128(SI), Z7; \
	VPXORQ    Z18, Z7, Z8; \
	VPSRLQ    $32, Z8, Z9; \
	VPMULUDQ  Z9, Z8, Z8; \
	VPSHUFD   $0x4e, Z7, Z7; \
	VPADDQ    Z7, Z0, Z0; \
	VPADDQ    Z8, Z0, Z0; \
	VMOVDQU64 192(SI), Z10; \
	VPXORQ    Z19, Z10, Z11; \
	VPSRLQ    $32, Z11, Z12; \
	VPMULUDQ  Z12, Z11, Z11; \
	VPSHUFD   $0x4e, Z10, Z10; \
	VPADDQ    Z10, Z0, Z0; \
	VPADDQ    Z11, Z0, Z0; \
	VPXORQ    Z20, Z0, Z0; \
	VMOVQ X0, AX; \
	VPEXTRQ $1, X0, DX; \
	MULQ DX; \
	XORQ DX, AX; \
	MOVQ AX, R8; \
	VEXTRACTI32X4 $1, Z0, X1; \
	VMOVQ X1, AX; \
	VPEXTRQ $1, X1, DX; \
	MULQ DX; \
	XORQ DX, AX; \
	ADDQ AX, R8; \
	VEXTRACTI32X4 $2, Z0, X1; \
	VMOVQ X1, AX; \
	VPEXTRQ $1, X1, DX; \
	MULQ DX; \
	XORQ DX, AX; \
	ADDQ AX, R8; \
	VEXTRACTI32X4 $3, Z0, X1; \
	VMOVQ X1, AX; \
	VPEXTRQ $1, X1, DX; \
	MULQ DX; \
	XORQ DX, AX; \
	ADDQ AX, R8; \
	ADDQ R10, R8; \
	MOVQ  R8, AX; \
	SHRQ  $37, AX; \
	XORQ  AX, R8; \
	IMULQ R9, R8; \
	MOVQ  R8, AX; \
	SHRQ  $32, AX; \
	XORQ  AX, R8;

// func hashBlocks256AVX512(dst *uint64, data *byte, n int)
//
// dst[i] = xxh3.Hash(data[256*i : 256*(i+1)]) for i < n, n >= 1: the
// unseeded 64-bit xxh3 of each 256-byte block, bit for bit. A 256-byte input
// is xxh3's long path with no full 1 KiB block: three stripes of 64 bytes at
// secret offsets 0, 8 and 16, the last stripe (bytes 192-255) at offset 121,
// no scramble, then the merge of the eight accumulators at offset 11 with
// len*PRIME64_1 and the avalanche. One zmm holds the eight accumulators.
TEXT ·hashBlocks256AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ data+8(FP), SI
	MOVQ n+16(FP), CX
	VMOVDQU64 xxh3k256<>+0(SB), Z16
	VMOVDQU64 xxh3k256<>+64(SB), Z17
	VMOVDQU64 xxh3k256<>+128(SB), Z18
	VMOVDQU64 xxh3k256<>+192(SB), Z19
	VMOVDQU64 xxh3k256<>+256(SB), Z20
	VMOVDQU64 xxh3k256<>+320(SB), Z21
	MOVQ $0x165667919e3779f9, R9
	MOVQ $0x3779b185ebca8700, R10 // 256 * PRIME64_1

loop:
	BLOCK256
	MOVQ R8, 0(DI)
	ADDQ $8, DI
	ADDQ $256, SI
	DECQ CX
	JNZ  loop
	VZEROUPPER
	RET

// func hashChain256AVX512(dst *uint64, data *byte, n int, seed uint64)
//
// dst[i] = chain(dst[i-1], xxh3(block i)) with dst[-1] = seed: the blocks of
// hashBlocks256AVX512 folded into the running chain value as they are
// hashed (see chain in hash.go), so the chain's multiply overlaps the next
// block's vector work.
TEXT ·hashChain256AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ data+8(FP), SI
	MOVQ n+16(FP), CX
	VMOVDQU64 xxh3k256<>+0(SB), Z16
	VMOVDQU64 xxh3k256<>+64(SB), Z17
	VMOVDQU64 xxh3k256<>+128(SB), Z18
	VMOVDQU64 xxh3k256<>+192(SB), Z19
	VMOVDQU64 xxh3k256<>+256(SB), Z20
	VMOVDQU64 xxh3k256<>+320(SB), Z21
	MOVQ $0x165667919e3779f9, R9
	MOVQ $0x3779b185ebca8700, R10 // 256 * PRIME64_1
	MOVQ seed+24(FP), R11
	MOVQ $0x9e3779b185ebca87, R12 // chainK1
	MOVQ $0xc2b2ae3d27d4eb4f, R13 // chainK2

chainloop:
	BLOCK256
	// hi, lo = (prev^K1) * (block^K2); x = hi ^ lo ^ block; avalanche
	MOVQ  R11, AX
	XORQ  R12, AX
	MOVQ  R8, BX
	XORQ  R13, BX
	MULQ  BX
	XORQ  DX, AX
	XORQ  R8, AX
	MOVQ  AX, DX
	SHRQ  $37, DX
	XORQ  DX, AX
	IMULQ R9, AX
	MOVQ  AX, DX
	SHRQ  $32, DX
	XORQ  DX, AX
	MOVQ  AX, R11
	MOVQ  AX, 0(DI)
	ADDQ  $8, DI
	ADDQ  $256, SI
	DECQ  CX
	JNZ   chainloop
	VZEROUPPER
	RET


// BLOCK256AVX2 is BLOCK256 on AVX2: two ymm accumulators (Y0 lanes 0-3,
// Y1 lanes 4-7) for the zmm one, the secret rows in Y4-Y15 (stripe 0 in
// Y4, Y5; 1 in Y6, Y7; 2 in Y8, Y9; the last stripe in Y10, Y11; the merge
// in Y12, Y13; the initial accumulators in Y14, Y15), R9 and R10 as there.
// It clobbers AX, DX, Y0-Y3.
#define STRIPE_AVX2(off, klo, khi) \
	VMOVDQU  off(SI), Y2; \
	VPXOR    klo, Y2, Y3; \
	VPSHUFD  $0x4e, Y2, Y2; \
	VPADDQ   Y2, Y0, Y0; \
	VPSRLQ   $32, Y3, Y2; \
	VPMULUDQ Y2, Y3, Y3; \
	VPADDQ   Y3, Y0, Y0; \
	VMOVDQU  off+32(SI), Y2; \
	VPXOR    khi, Y2, Y3; \
	VPSHUFD  $0x4e, Y2, Y2; \
	VPADDQ   Y2, Y1, Y1; \
	VPSRLQ   $32, Y3, Y2; \
	VPMULUDQ Y2, Y3, Y3; \
	VPADDQ   Y3, Y1, Y1;

#define FOLD_AVX2(x) \
	VMOVQ   x, AX; \
	VPEXTRQ $1, x, DX; \
	MULQ    DX; \
	XORQ    DX, AX;

#define BLOCK256AVX2 \
	VMOVDQA Y14, Y0; \
	VMOVDQA Y15, Y1; \
	STRIPE_AVX2(0, Y4, Y5) \
	STRIPE_AVX2(64, Y6, Y7) \
	STRIPE_AVX2(128, Y8, Y9) \
	STRIPE_AVX2(192, Y10, Y11) \
	VPXOR Y12, Y0, Y0; \
	VPXOR Y13, Y1, Y1; \
	FOLD_AVX2(X0) \
	MOVQ AX, R8; \
	VEXTRACTI128 $1, Y0, X2; \
	FOLD_AVX2(X2) \
	ADDQ AX, R8; \
	FOLD_AVX2(X1) \
	ADDQ AX, R8; \
	VEXTRACTI128 $1, Y1, X2; \
	FOLD_AVX2(X2) \
	ADDQ AX, R8; \
	ADDQ R10, R8; \
	MOVQ  R8, AX; \
	SHRQ  $37, AX; \
	XORQ  AX, R8; \
	IMULQ R9, R8; \
	MOVQ  R8, AX; \
	SHRQ  $32, AX; \
	XORQ  AX, R8;

#define LOADK_AVX2 \
	VMOVDQU xxh3k256<>+0(SB), Y4; \
	VMOVDQU xxh3k256<>+32(SB), Y5; \
	VMOVDQU xxh3k256<>+64(SB), Y6; \
	VMOVDQU xxh3k256<>+96(SB), Y7; \
	VMOVDQU xxh3k256<>+128(SB), Y8; \
	VMOVDQU xxh3k256<>+160(SB), Y9; \
	VMOVDQU xxh3k256<>+192(SB), Y10; \
	VMOVDQU xxh3k256<>+224(SB), Y11; \
	VMOVDQU xxh3k256<>+256(SB), Y12; \
	VMOVDQU xxh3k256<>+288(SB), Y13; \
	VMOVDQU xxh3k256<>+320(SB), Y14; \
	VMOVDQU xxh3k256<>+352(SB), Y15; \
	MOVQ $0x165667919e3779f9, R9; \
	MOVQ $0x3779b185ebca8700, R10

// func hashBlocks256AVX2(dst *uint64, data *byte, n int)
//
// hashBlocks256AVX512 on AVX2 (same output, bit for bit).
TEXT ·hashBlocks256AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ data+8(FP), SI
	MOVQ n+16(FP), CX
	LOADK_AVX2

loop2:
	BLOCK256AVX2
	MOVQ R8, 0(DI)
	ADDQ $8, DI
	ADDQ $256, SI
	DECQ CX
	JNZ  loop2
	VZEROUPPER
	RET

// func hashChain256AVX2(dst *uint64, data *byte, n int, seed uint64)
//
// hashChain256AVX512 on AVX2 (same output, bit for bit).
TEXT ·hashChain256AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ data+8(FP), SI
	MOVQ n+16(FP), CX
	LOADK_AVX2
	MOVQ seed+24(FP), R11
	MOVQ $0x9e3779b185ebca87, R12 // chainK1
	MOVQ $0xc2b2ae3d27d4eb4f, R13 // chainK2

chainloop2:
	BLOCK256AVX2
	MOVQ  R11, AX
	XORQ  R12, AX
	MOVQ  R8, BX
	XORQ  R13, BX
	MULQ  BX
	XORQ  DX, AX
	XORQ  R8, AX
	MOVQ  AX, DX
	SHRQ  $37, DX
	XORQ  DX, AX
	IMULQ R9, AX
	MOVQ  AX, DX
	SHRQ  $32, DX
	XORQ  DX, AX
	MOVQ  AX, R11
	MOVQ  AX, 0(DI)
	ADDQ  $8, DI
	ADDQ  $256, SI
	DECQ  CX
	JNZ   chainloop2
	VZEROUPPER
	RET
