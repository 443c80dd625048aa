//go:build amd64 && !purego

#include "textflag.h"

// func copyPlainAVX512(dst, src *byte, n int) int
//
// Copies src[:n] to dst 64 bytes at a time up to the first '"' or '\\' and
// returns its index, or n when there is none. Bytes after the stop within
// its 64-byte chunk are copied too, never beyond dst[n-1]; the last partial
// chunk is read and written with a byte mask, never beyond src[n-1].
// Requires AVX512F and AVX512BW.
TEXT ·copyPlainAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), R8
	MOVL $0x22, AX
	VPBROADCASTB AX, Z30
	MOVL $0x5c, AX
	VPBROADCASTB AX, Z31
	XORQ BX, BX

loop:
	MOVQ R8, DX
	SUBQ BX, DX
	CMPQ DX, $64
	JB   tail
	VMOVDQU8 (SI)(BX*1), Z0
	VPCMPEQB Z30, Z0, K1
	VPCMPEQB Z31, Z0, K2
	VMOVDQU8 Z0, (DI)(BX*1)
	KORTESTQ K1, K2
	JNZ      found
	ADDQ     $64, BX
	JMP      loop

tail:
	TESTQ DX, DX
	JZ    none
	MOVQ  DX, CX
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVQ AX, K3
	VMOVDQU8.Z (SI)(BX*1), K3, Z0
	VPCMPEQB   Z30, Z0, K3, K1
	VPCMPEQB   Z31, Z0, K3, K2
	VMOVDQU8   Z0, K3, (DI)(BX*1)
	KORTESTQ   K1, K2
	JNZ        found

none:
	MOVQ R8, ret+24(FP)
	VZEROUPPER
	RET

found:
	KORQ  K1, K2, K1
	KMOVQ K1, AX
	BSFQ  AX, AX
	ADDQ  BX, AX
	MOVQ  AX, ret+24(FP)
	VZEROUPPER
	RET
