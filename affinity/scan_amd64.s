//go:build amd64 && !purego

#include "textflag.h"

// esctab maps the byte after a backslash to the byte the escape stands for
// (\" \\ \/ \b \f \n \r \t), 0 for every other byte (\u, invalid).
DATA esctab<>+0(SB)/8, $0x0000000000000000
DATA esctab<>+8(SB)/8, $0x0000000000000000
DATA esctab<>+16(SB)/8, $0x0000000000000000
DATA esctab<>+24(SB)/8, $0x0000000000000000
DATA esctab<>+32(SB)/8, $0x0000000000220000
DATA esctab<>+40(SB)/8, $0x2f00000000000000
DATA esctab<>+48(SB)/8, $0x0000000000000000
DATA esctab<>+56(SB)/8, $0x0000000000000000
DATA esctab<>+64(SB)/8, $0x0000000000000000
DATA esctab<>+72(SB)/8, $0x0000000000000000
DATA esctab<>+80(SB)/8, $0x0000000000000000
DATA esctab<>+88(SB)/8, $0x0000005c00000000
DATA esctab<>+96(SB)/8, $0x000c000000080000
DATA esctab<>+104(SB)/8, $0x000a000000000000
DATA esctab<>+112(SB)/8, $0x00000009000d0000
DATA esctab<>+120(SB)/8, $0x0000000000000000
DATA esctab<>+128(SB)/8, $0x0000000000000000
DATA esctab<>+136(SB)/8, $0x0000000000000000
DATA esctab<>+144(SB)/8, $0x0000000000000000
DATA esctab<>+152(SB)/8, $0x0000000000000000
DATA esctab<>+160(SB)/8, $0x0000000000000000
DATA esctab<>+168(SB)/8, $0x0000000000000000
DATA esctab<>+176(SB)/8, $0x0000000000000000
DATA esctab<>+184(SB)/8, $0x0000000000000000
DATA esctab<>+192(SB)/8, $0x0000000000000000
DATA esctab<>+200(SB)/8, $0x0000000000000000
DATA esctab<>+208(SB)/8, $0x0000000000000000
DATA esctab<>+216(SB)/8, $0x0000000000000000
DATA esctab<>+224(SB)/8, $0x0000000000000000
DATA esctab<>+232(SB)/8, $0x0000000000000000
DATA esctab<>+240(SB)/8, $0x0000000000000000
DATA esctab<>+248(SB)/8, $0x0000000000000000
GLOBL esctab<>(SB), RODATA|NOPTR, $256

// func unescapePlainAVX512(dst, src *byte, n int) (consumed, written int)
//
// Copies src[:n] to dst 64 bytes at a time, decoding the two-byte escapes
// of esctab in place, and stops at the first '"' (consumed is its index),
// at a backslash it does not decode (\u, an invalid escape, or a backslash
// ending src; consumed is its index), or at the end (consumed = n). written
// is the number of bytes the consumed input decoded to (written <=
// consumed). Bytes after the stop within its 64-byte chunk are stored too,
// never beyond dst[n-1]; the last partial chunk is read and written with a
// byte mask, never beyond src[n-1]. Requires AVX512F and AVX512BW.
TEXT ·unescapePlainAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), R8
	MOVL $0x22, AX
	VPBROADCASTB AX, Z30
	MOVL $0x5c, AX
	VPBROADCASTB AX, Z31
	LEAQ esctab<>(SB), R10
	XORQ BX, BX // consumed
	XORQ R9, R9 // written

loop:
	MOVQ R8, DX
	SUBQ BX, DX
	CMPQ DX, $64
	JB   tail
	VMOVDQU8 (SI)(BX*1), Z0
	VPCMPEQB Z30, Z0, K1
	VPCMPEQB Z31, Z0, K2
	VMOVDQU8 Z0, (DI)(R9*1)
	KORTESTQ K1, K2
	JNZ      found
	ADDQ     $64, BX
	ADDQ     $64, R9
	JMP      loop

tail:
	TESTQ DX, DX
	JZ    done
	MOVQ  DX, CX
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVQ AX, K3
	VMOVDQU8.Z (SI)(BX*1), K3, Z0
	VPCMPEQB   Z30, Z0, K3, K1
	VPCMPEQB   Z31, Z0, K3, K2
	VMOVDQU8   Z0, K3, (DI)(R9*1)
	KORTESTQ   K1, K2
	JNZ        found
	ADDQ       DX, BX
	ADDQ       DX, R9
	JMP        done

found:
	KORQ    K1, K2, K1
	KMOVQ   K1, AX
	BSFQ    AX, AX
	ADDQ    AX, BX
	ADDQ    AX, R9
	MOVBLZX (SI)(BX*1), CX
	CMPL    CX, $0x22
	JEQ     done
	LEAQ    1(BX), DX
	CMPQ    DX, R8
	JAE     done
	MOVBLZX 1(SI)(BX*1), CX
	MOVBLZX (R10)(CX*1), CX
	TESTL   CX, CX
	JZ      done
	MOVB    CX, (DI)(R9*1)
	ADDQ    $2, BX
	INCQ    R9
	JMP     loop

done:
	MOVQ BX, consumed+24(FP)
	MOVQ R9, written+32(FP)
	VZEROUPPER
	RET

// func unescapePlainAVX2(dst, src *byte, n int) (consumed, written int)
//
// unescapePlainAVX512 on AVX2: 32 bytes at a time, and the last 31 or
// fewer byte by byte (AVX2 has no byte masks). Same contract: every full
// 32-byte store lies within dst[:n] (written <= consumed, and a chunk is
// loaded only when 32 bytes of src are left).
TEXT ·unescapePlainAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), R8
	MOVL $0x22, AX
	MOVQ AX, X14
	VPBROADCASTB X14, Y14
	MOVL $0x5c, AX
	MOVQ AX, X15
	VPBROADCASTB X15, Y15
	LEAQ esctab<>(SB), R10
	XORQ BX, BX // consumed
	XORQ R9, R9 // written

loop2:
	MOVQ R8, DX
	SUBQ BX, DX
	CMPQ DX, $32
	JB   tail2
	VMOVDQU   (SI)(BX*1), Y0
	VPCMPEQB  Y14, Y0, Y1
	VPCMPEQB  Y15, Y0, Y2
	VMOVDQU   Y0, (DI)(R9*1)
	VPOR      Y1, Y2, Y1
	VPMOVMSKB Y1, AX
	TESTL     AX, AX
	JNZ       found2
	ADDQ      $32, BX
	ADDQ      $32, R9
	JMP       loop2

found2:
	BSFL AX, AX
	ADDQ AX, BX
	ADDQ AX, R9
	JMP  stop2

tail2:
	CMPQ    BX, R8
	JAE     done2
	MOVBLZX (SI)(BX*1), CX
	CMPL    CX, $0x22
	JEQ     done2
	CMPL    CX, $0x5c
	JEQ     stop2
	MOVB    CX, (DI)(R9*1)
	INCQ    BX
	INCQ    R9
	JMP     tail2

// stop2: src[BX] is a quote or a backslash.
stop2:
	MOVBLZX (SI)(BX*1), CX
	CMPL    CX, $0x22
	JEQ     done2
	LEAQ    1(BX), DX
	CMPQ    DX, R8
	JAE     done2
	MOVBLZX 1(SI)(BX*1), CX
	MOVBLZX (R10)(CX*1), CX
	TESTL   CX, CX
	JZ      done2
	MOVB    CX, (DI)(R9*1)
	ADDQ    $2, BX
	INCQ    R9
	JMP     loop2

done2:
	MOVQ BX, consumed+24(FP)
	MOVQ R9, written+32(FP)
	VZEROUPPER
	RET
