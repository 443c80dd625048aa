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

// The AVX2 kernel's many-escapes path (escchunk2). A byte is a valid
// escape letter (\" \/ \\ \b \f \n \r \t) when eschi[its high nibble] and
// esclo[its low nibble] share a bit: one bit per high nibble (2, 5, 6, 7),
// set in esclo for that nibble's letters.
DATA eschi<>+0(SB)/8, $0x0804020000010000
DATA eschi<>+8(SB)/8, $0x0000000000000000
DATA eschi<>+16(SB)/8, $0x0804020000010000
DATA eschi<>+24(SB)/8, $0x0000000000000000
GLOBL eschi<>(SB), RODATA|NOPTR, $32
DATA esclo<>+0(SB)/8, $0x00040008000d0000
DATA esclo<>+8(SB)/8, $0x0104000200000000
DATA esclo<>+16(SB)/8, $0x00040008000d0000
DATA esclo<>+24(SB)/8, $0x0104000200000000
GLOBL esclo<>(SB), RODATA|NOPTR, $32

// escletter maps a letter escape (b f n r t, the ones with bits 0x60 both
// set) to the byte it stands for, indexed by its low nibble xor its bit 4
// moved to bit 3 (b, r share a low nibble; bit 4 tells them apart).
DATA escletter<>+0(SB)/8, $0x000c000000080000
DATA escletter<>+8(SB)/8, $0x000a0009000d0000
DATA escletter<>+16(SB)/8, $0x000c000000080000
DATA escletter<>+24(SB)/8, $0x000a0009000d0000
GLOBL escletter<>(SB), RODATA|NOPTR, $32

DATA escnib<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA escnib<>+8(SB)/8, $0x0808080808080808
DATA escnib<>+16(SB)/8, $0x6060606060606060
GLOBL escnib<>(SB), RODATA|NOPTR, $24

// esccomp[m] is the VPSHUFB control that packs the bytes of an 8-byte
// group whose bit in m is clear to its front (m: the group's backslashes).
DATA esccomp<>+0(SB)/8, $0x0706050403020100
DATA esccomp<>+8(SB)/8, $0x8007060504030201
DATA esccomp<>+16(SB)/8, $0x8007060504030200
DATA esccomp<>+24(SB)/8, $0x8080070605040302
DATA esccomp<>+32(SB)/8, $0x8007060504030100
DATA esccomp<>+40(SB)/8, $0x8080070605040301
DATA esccomp<>+48(SB)/8, $0x8080070605040300
DATA esccomp<>+56(SB)/8, $0x8080800706050403
DATA esccomp<>+64(SB)/8, $0x8007060504020100
DATA esccomp<>+72(SB)/8, $0x8080070605040201
DATA esccomp<>+80(SB)/8, $0x8080070605040200
DATA esccomp<>+88(SB)/8, $0x8080800706050402
DATA esccomp<>+96(SB)/8, $0x8080070605040100
DATA esccomp<>+104(SB)/8, $0x8080800706050401
DATA esccomp<>+112(SB)/8, $0x8080800706050400
DATA esccomp<>+120(SB)/8, $0x8080808007060504
DATA esccomp<>+128(SB)/8, $0x8007060503020100
DATA esccomp<>+136(SB)/8, $0x8080070605030201
DATA esccomp<>+144(SB)/8, $0x8080070605030200
DATA esccomp<>+152(SB)/8, $0x8080800706050302
DATA esccomp<>+160(SB)/8, $0x8080070605030100
DATA esccomp<>+168(SB)/8, $0x8080800706050301
DATA esccomp<>+176(SB)/8, $0x8080800706050300
DATA esccomp<>+184(SB)/8, $0x8080808007060503
DATA esccomp<>+192(SB)/8, $0x8080070605020100
DATA esccomp<>+200(SB)/8, $0x8080800706050201
DATA esccomp<>+208(SB)/8, $0x8080800706050200
DATA esccomp<>+216(SB)/8, $0x8080808007060502
DATA esccomp<>+224(SB)/8, $0x8080800706050100
DATA esccomp<>+232(SB)/8, $0x8080808007060501
DATA esccomp<>+240(SB)/8, $0x8080808007060500
DATA esccomp<>+248(SB)/8, $0x8080808080070605
DATA esccomp<>+256(SB)/8, $0x8007060403020100
DATA esccomp<>+264(SB)/8, $0x8080070604030201
DATA esccomp<>+272(SB)/8, $0x8080070604030200
DATA esccomp<>+280(SB)/8, $0x8080800706040302
DATA esccomp<>+288(SB)/8, $0x8080070604030100
DATA esccomp<>+296(SB)/8, $0x8080800706040301
DATA esccomp<>+304(SB)/8, $0x8080800706040300
DATA esccomp<>+312(SB)/8, $0x8080808007060403
DATA esccomp<>+320(SB)/8, $0x8080070604020100
DATA esccomp<>+328(SB)/8, $0x8080800706040201
DATA esccomp<>+336(SB)/8, $0x8080800706040200
DATA esccomp<>+344(SB)/8, $0x8080808007060402
DATA esccomp<>+352(SB)/8, $0x8080800706040100
DATA esccomp<>+360(SB)/8, $0x8080808007060401
DATA esccomp<>+368(SB)/8, $0x8080808007060400
DATA esccomp<>+376(SB)/8, $0x8080808080070604
DATA esccomp<>+384(SB)/8, $0x8080070603020100
DATA esccomp<>+392(SB)/8, $0x8080800706030201
DATA esccomp<>+400(SB)/8, $0x8080800706030200
DATA esccomp<>+408(SB)/8, $0x8080808007060302
DATA esccomp<>+416(SB)/8, $0x8080800706030100
DATA esccomp<>+424(SB)/8, $0x8080808007060301
DATA esccomp<>+432(SB)/8, $0x8080808007060300
DATA esccomp<>+440(SB)/8, $0x8080808080070603
DATA esccomp<>+448(SB)/8, $0x8080800706020100
DATA esccomp<>+456(SB)/8, $0x8080808007060201
DATA esccomp<>+464(SB)/8, $0x8080808007060200
DATA esccomp<>+472(SB)/8, $0x8080808080070602
DATA esccomp<>+480(SB)/8, $0x8080808007060100
DATA esccomp<>+488(SB)/8, $0x8080808080070601
DATA esccomp<>+496(SB)/8, $0x8080808080070600
DATA esccomp<>+504(SB)/8, $0x8080808080800706
DATA esccomp<>+512(SB)/8, $0x8007050403020100
DATA esccomp<>+520(SB)/8, $0x8080070504030201
DATA esccomp<>+528(SB)/8, $0x8080070504030200
DATA esccomp<>+536(SB)/8, $0x8080800705040302
DATA esccomp<>+544(SB)/8, $0x8080070504030100
DATA esccomp<>+552(SB)/8, $0x8080800705040301
DATA esccomp<>+560(SB)/8, $0x8080800705040300
DATA esccomp<>+568(SB)/8, $0x8080808007050403
DATA esccomp<>+576(SB)/8, $0x8080070504020100
DATA esccomp<>+584(SB)/8, $0x8080800705040201
DATA esccomp<>+592(SB)/8, $0x8080800705040200
DATA esccomp<>+600(SB)/8, $0x8080808007050402
DATA esccomp<>+608(SB)/8, $0x8080800705040100
DATA esccomp<>+616(SB)/8, $0x8080808007050401
DATA esccomp<>+624(SB)/8, $0x8080808007050400
DATA esccomp<>+632(SB)/8, $0x8080808080070504
DATA esccomp<>+640(SB)/8, $0x8080070503020100
DATA esccomp<>+648(SB)/8, $0x8080800705030201
DATA esccomp<>+656(SB)/8, $0x8080800705030200
DATA esccomp<>+664(SB)/8, $0x8080808007050302
DATA esccomp<>+672(SB)/8, $0x8080800705030100
DATA esccomp<>+680(SB)/8, $0x8080808007050301
DATA esccomp<>+688(SB)/8, $0x8080808007050300
DATA esccomp<>+696(SB)/8, $0x8080808080070503
DATA esccomp<>+704(SB)/8, $0x8080800705020100
DATA esccomp<>+712(SB)/8, $0x8080808007050201
DATA esccomp<>+720(SB)/8, $0x8080808007050200
DATA esccomp<>+728(SB)/8, $0x8080808080070502
DATA esccomp<>+736(SB)/8, $0x8080808007050100
DATA esccomp<>+744(SB)/8, $0x8080808080070501
DATA esccomp<>+752(SB)/8, $0x8080808080070500
DATA esccomp<>+760(SB)/8, $0x8080808080800705
DATA esccomp<>+768(SB)/8, $0x8080070403020100
DATA esccomp<>+776(SB)/8, $0x8080800704030201
DATA esccomp<>+784(SB)/8, $0x8080800704030200
DATA esccomp<>+792(SB)/8, $0x8080808007040302
DATA esccomp<>+800(SB)/8, $0x8080800704030100
DATA esccomp<>+808(SB)/8, $0x8080808007040301
DATA esccomp<>+816(SB)/8, $0x8080808007040300
DATA esccomp<>+824(SB)/8, $0x8080808080070403
DATA esccomp<>+832(SB)/8, $0x8080800704020100
DATA esccomp<>+840(SB)/8, $0x8080808007040201
DATA esccomp<>+848(SB)/8, $0x8080808007040200
DATA esccomp<>+856(SB)/8, $0x8080808080070402
DATA esccomp<>+864(SB)/8, $0x8080808007040100
DATA esccomp<>+872(SB)/8, $0x8080808080070401
DATA esccomp<>+880(SB)/8, $0x8080808080070400
DATA esccomp<>+888(SB)/8, $0x8080808080800704
DATA esccomp<>+896(SB)/8, $0x8080800703020100
DATA esccomp<>+904(SB)/8, $0x8080808007030201
DATA esccomp<>+912(SB)/8, $0x8080808007030200
DATA esccomp<>+920(SB)/8, $0x8080808080070302
DATA esccomp<>+928(SB)/8, $0x8080808007030100
DATA esccomp<>+936(SB)/8, $0x8080808080070301
DATA esccomp<>+944(SB)/8, $0x8080808080070300
DATA esccomp<>+952(SB)/8, $0x8080808080800703
DATA esccomp<>+960(SB)/8, $0x8080808007020100
DATA esccomp<>+968(SB)/8, $0x8080808080070201
DATA esccomp<>+976(SB)/8, $0x8080808080070200
DATA esccomp<>+984(SB)/8, $0x8080808080800702
DATA esccomp<>+992(SB)/8, $0x8080808080070100
DATA esccomp<>+1000(SB)/8, $0x8080808080800701
DATA esccomp<>+1008(SB)/8, $0x8080808080800700
DATA esccomp<>+1016(SB)/8, $0x8080808080808007
DATA esccomp<>+1024(SB)/8, $0x8006050403020100
DATA esccomp<>+1032(SB)/8, $0x8080060504030201
DATA esccomp<>+1040(SB)/8, $0x8080060504030200
DATA esccomp<>+1048(SB)/8, $0x8080800605040302
DATA esccomp<>+1056(SB)/8, $0x8080060504030100
DATA esccomp<>+1064(SB)/8, $0x8080800605040301
DATA esccomp<>+1072(SB)/8, $0x8080800605040300
DATA esccomp<>+1080(SB)/8, $0x8080808006050403
DATA esccomp<>+1088(SB)/8, $0x8080060504020100
DATA esccomp<>+1096(SB)/8, $0x8080800605040201
DATA esccomp<>+1104(SB)/8, $0x8080800605040200
DATA esccomp<>+1112(SB)/8, $0x8080808006050402
DATA esccomp<>+1120(SB)/8, $0x8080800605040100
DATA esccomp<>+1128(SB)/8, $0x8080808006050401
DATA esccomp<>+1136(SB)/8, $0x8080808006050400
DATA esccomp<>+1144(SB)/8, $0x8080808080060504
DATA esccomp<>+1152(SB)/8, $0x8080060503020100
DATA esccomp<>+1160(SB)/8, $0x8080800605030201
DATA esccomp<>+1168(SB)/8, $0x8080800605030200
DATA esccomp<>+1176(SB)/8, $0x8080808006050302
DATA esccomp<>+1184(SB)/8, $0x8080800605030100
DATA esccomp<>+1192(SB)/8, $0x8080808006050301
DATA esccomp<>+1200(SB)/8, $0x8080808006050300
DATA esccomp<>+1208(SB)/8, $0x8080808080060503
DATA esccomp<>+1216(SB)/8, $0x8080800605020100
DATA esccomp<>+1224(SB)/8, $0x8080808006050201
DATA esccomp<>+1232(SB)/8, $0x8080808006050200
DATA esccomp<>+1240(SB)/8, $0x8080808080060502
DATA esccomp<>+1248(SB)/8, $0x8080808006050100
DATA esccomp<>+1256(SB)/8, $0x8080808080060501
DATA esccomp<>+1264(SB)/8, $0x8080808080060500
DATA esccomp<>+1272(SB)/8, $0x8080808080800605
DATA esccomp<>+1280(SB)/8, $0x8080060403020100
DATA esccomp<>+1288(SB)/8, $0x8080800604030201
DATA esccomp<>+1296(SB)/8, $0x8080800604030200
DATA esccomp<>+1304(SB)/8, $0x8080808006040302
DATA esccomp<>+1312(SB)/8, $0x8080800604030100
DATA esccomp<>+1320(SB)/8, $0x8080808006040301
DATA esccomp<>+1328(SB)/8, $0x8080808006040300
DATA esccomp<>+1336(SB)/8, $0x8080808080060403
DATA esccomp<>+1344(SB)/8, $0x8080800604020100
DATA esccomp<>+1352(SB)/8, $0x8080808006040201
DATA esccomp<>+1360(SB)/8, $0x8080808006040200
DATA esccomp<>+1368(SB)/8, $0x8080808080060402
DATA esccomp<>+1376(SB)/8, $0x8080808006040100
DATA esccomp<>+1384(SB)/8, $0x8080808080060401
DATA esccomp<>+1392(SB)/8, $0x8080808080060400
DATA esccomp<>+1400(SB)/8, $0x8080808080800604
DATA esccomp<>+1408(SB)/8, $0x8080800603020100
DATA esccomp<>+1416(SB)/8, $0x8080808006030201
DATA esccomp<>+1424(SB)/8, $0x8080808006030200
DATA esccomp<>+1432(SB)/8, $0x8080808080060302
DATA esccomp<>+1440(SB)/8, $0x8080808006030100
DATA esccomp<>+1448(SB)/8, $0x8080808080060301
DATA esccomp<>+1456(SB)/8, $0x8080808080060300
DATA esccomp<>+1464(SB)/8, $0x8080808080800603
DATA esccomp<>+1472(SB)/8, $0x8080808006020100
DATA esccomp<>+1480(SB)/8, $0x8080808080060201
DATA esccomp<>+1488(SB)/8, $0x8080808080060200
DATA esccomp<>+1496(SB)/8, $0x8080808080800602
DATA esccomp<>+1504(SB)/8, $0x8080808080060100
DATA esccomp<>+1512(SB)/8, $0x8080808080800601
DATA esccomp<>+1520(SB)/8, $0x8080808080800600
DATA esccomp<>+1528(SB)/8, $0x8080808080808006
DATA esccomp<>+1536(SB)/8, $0x8080050403020100
DATA esccomp<>+1544(SB)/8, $0x8080800504030201
DATA esccomp<>+1552(SB)/8, $0x8080800504030200
DATA esccomp<>+1560(SB)/8, $0x8080808005040302
DATA esccomp<>+1568(SB)/8, $0x8080800504030100
DATA esccomp<>+1576(SB)/8, $0x8080808005040301
DATA esccomp<>+1584(SB)/8, $0x8080808005040300
DATA esccomp<>+1592(SB)/8, $0x8080808080050403
DATA esccomp<>+1600(SB)/8, $0x8080800504020100
DATA esccomp<>+1608(SB)/8, $0x8080808005040201
DATA esccomp<>+1616(SB)/8, $0x8080808005040200
DATA esccomp<>+1624(SB)/8, $0x8080808080050402
DATA esccomp<>+1632(SB)/8, $0x8080808005040100
DATA esccomp<>+1640(SB)/8, $0x8080808080050401
DATA esccomp<>+1648(SB)/8, $0x8080808080050400
DATA esccomp<>+1656(SB)/8, $0x8080808080800504
DATA esccomp<>+1664(SB)/8, $0x8080800503020100
DATA esccomp<>+1672(SB)/8, $0x8080808005030201
DATA esccomp<>+1680(SB)/8, $0x8080808005030200
DATA esccomp<>+1688(SB)/8, $0x8080808080050302
DATA esccomp<>+1696(SB)/8, $0x8080808005030100
DATA esccomp<>+1704(SB)/8, $0x8080808080050301
DATA esccomp<>+1712(SB)/8, $0x8080808080050300
DATA esccomp<>+1720(SB)/8, $0x8080808080800503
DATA esccomp<>+1728(SB)/8, $0x8080808005020100
DATA esccomp<>+1736(SB)/8, $0x8080808080050201
DATA esccomp<>+1744(SB)/8, $0x8080808080050200
DATA esccomp<>+1752(SB)/8, $0x8080808080800502
DATA esccomp<>+1760(SB)/8, $0x8080808080050100
DATA esccomp<>+1768(SB)/8, $0x8080808080800501
DATA esccomp<>+1776(SB)/8, $0x8080808080800500
DATA esccomp<>+1784(SB)/8, $0x8080808080808005
DATA esccomp<>+1792(SB)/8, $0x8080800403020100
DATA esccomp<>+1800(SB)/8, $0x8080808004030201
DATA esccomp<>+1808(SB)/8, $0x8080808004030200
DATA esccomp<>+1816(SB)/8, $0x8080808080040302
DATA esccomp<>+1824(SB)/8, $0x8080808004030100
DATA esccomp<>+1832(SB)/8, $0x8080808080040301
DATA esccomp<>+1840(SB)/8, $0x8080808080040300
DATA esccomp<>+1848(SB)/8, $0x8080808080800403
DATA esccomp<>+1856(SB)/8, $0x8080808004020100
DATA esccomp<>+1864(SB)/8, $0x8080808080040201
DATA esccomp<>+1872(SB)/8, $0x8080808080040200
DATA esccomp<>+1880(SB)/8, $0x8080808080800402
DATA esccomp<>+1888(SB)/8, $0x8080808080040100
DATA esccomp<>+1896(SB)/8, $0x8080808080800401
DATA esccomp<>+1904(SB)/8, $0x8080808080800400
DATA esccomp<>+1912(SB)/8, $0x8080808080808004
DATA esccomp<>+1920(SB)/8, $0x8080808003020100
DATA esccomp<>+1928(SB)/8, $0x8080808080030201
DATA esccomp<>+1936(SB)/8, $0x8080808080030200
DATA esccomp<>+1944(SB)/8, $0x8080808080800302
DATA esccomp<>+1952(SB)/8, $0x8080808080030100
DATA esccomp<>+1960(SB)/8, $0x8080808080800301
DATA esccomp<>+1968(SB)/8, $0x8080808080800300
DATA esccomp<>+1976(SB)/8, $0x8080808080808003
DATA esccomp<>+1984(SB)/8, $0x8080808080020100
DATA esccomp<>+1992(SB)/8, $0x8080808080800201
DATA esccomp<>+2000(SB)/8, $0x8080808080800200
DATA esccomp<>+2008(SB)/8, $0x8080808080808002
DATA esccomp<>+2016(SB)/8, $0x8080808080800100
DATA esccomp<>+2024(SB)/8, $0x8080808080808001
DATA esccomp<>+2032(SB)/8, $0x8080808080808000
DATA esccomp<>+2040(SB)/8, $0x8080808080808080
GLOBL esccomp<>(SB), RODATA|NOPTR, $2048

// func unescapePlainAVX512(dst, src *byte, n int) (consumed, written int)
//
// Copies src[:n] to dst 64 bytes at a time, decoding the two-byte escapes
// of esctab, and stops at the first '"' (consumed is its index), at a
// backslash it does not decode (\u, an invalid escape, or a backslash
// ending src; consumed is its index), or at the end (consumed = n). written
// is the number of bytes the consumed input decoded to (written <=
// consumed). Bytes after the stop within its 64-byte chunk are stored too,
// never beyond dst[n-1]; the last partial chunk is read and written with a
// byte mask, never beyond src[n-1]. Requires AVX512F, AVX512BW,
// AVX512_VBMI and AVX512_VBMI2.
//
// A chunk whose backslashes all start two-byte escapes that end inside it
// (no two adjacent, none in its last byte, each followed by an esctab
// letter) and that holds no unescaped quote is decoded whole (escchunk):
// the letters are looked up in esctab (VPERMT2B over its first 128
// bytes), put in place of themselves, and the backslashes squeezed out
// with one VPCOMPRESSB. Text with an escape every line (prose, code) thus
// costs about what plain text does, where stopping at each escape cost a
// mispredicted branch and a reload per escape (2.7x the time on prose).
// Any other chunk takes the one-escape step (found).
TEXT ·unescapePlainAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), R8
	MOVL $0x22, AX
	VPBROADCASTB AX, Z30
	MOVL $0x5c, AX
	VPBROADCASTB AX, Z31
	LEAQ esctab<>(SB), R10
	VMOVDQU64 (R10), Z28    // esctab[0:64]
	VMOVDQU64 64(R10), Z29  // esctab[64:128]
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
	JNZ      escchunk
	ADDQ     $64, BX
	ADDQ     $64, R9
	JMP      loop

// escchunk: the chunk in Z0 (quotes K1, backslashes K2) has a quote or a
// backslash; decode it whole if it qualifies (see above).
escchunk:
	KMOVQ K2, CX // backslashes
	TESTQ CX, CX
	JZ    found  // only quotes: the string ends here
	BTQ   $63, CX
	JCS   found  // an escape that ends in the next chunk
	MOVQ  CX, DX
	SHLQ  $1, DX // the escaped bytes
	TESTQ CX, DX
	JNZ   found  // adjacent backslashes (\\)
	KMOVQ K1, R11
	MOVQ  DX, R12
	NOTQ  R12
	TESTQ R11, R12
	JNZ   found  // an unescaped quote: the string ends here

	// esctab[byte & 127] for every byte; bytes from 0x80 are no letters
	VMOVDQU64 Z28, Z1
	VPERMT2B  Z29, Z0, Z1
	VPTESTMB  Z1, Z1, K3 // an esctab letter (if below 0x80)
	VPMOVB2M  Z0, K4     // 0x80 and up
	KMOVQ     K3, R11
	KMOVQ     K4, R12
	NOTQ      R11
	ORQ       R12, R11   // not a letter
	TESTQ     DX, R11
	JNZ       found      // \u or an invalid escape

	KMOVQ       DX, K5
	VMOVDQU8    Z1, K5, Z0 // the letters decoded in place
	MOVQ        CX, R12
	NOTQ        R12
	KMOVQ       R12, K6
	VPCOMPRESSB Z0, K6, Z2 // the backslashes squeezed out
	VMOVDQU8    Z2, (DI)(R9*1)
	POPCNTQ     CX, CX
	ADDQ        $64, BX
	ADDQ        $64, R9
	SUBQ        CX, R9
	JMP         loop

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

// found: step to the chunk's first quote or backslash (K1 | K2) and take
// it: stop at a quote or a backslash not decoded, decode one escape.
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
//
// Text with many escapes (prose and code: a \n every line) would stop at
// each one, a mispredicted branch and a reload per escape. A chunk whose
// backslashes all start two-byte escapes that end inside it (no two
// backslashes adjacent, none in its last byte, each followed by a valid
// escape letter) and that holds no unescaped quote is decoded whole
// instead (escchunk2): the letters after backslashes are replaced by what
// they stand for, and the backslashes are squeezed out 8 bytes at a time
// with esccomp. Any other chunk takes the one-escape step (single2).
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
	VPOR      Y1, Y2, Y3
	VPMOVMSKB Y3, AX
	TESTL     AX, AX
	JNZ       escchunk2
	ADDQ      $32, BX
	ADDQ      $32, R9
	JMP       loop2

// escchunk2: the chunk in Y0 (quotes Y1, backslashes Y2) has a quote or a
// backslash (AX); decode it whole if it qualifies (see the doc above).
escchunk2:
	VPMOVMSKB Y2, CX // backslashes
	TESTL     CX, CX
	JZ        single2 // only quotes: the string ends here
	BTL       $31, CX
	JCS       single2 // an escape that ends in the next chunk
	MOVL      CX, DX
	SHLL      $1, DX  // the escaped bytes
	TESTL     CX, DX
	JNZ       single2 // adjacent backslashes (\\)
	VPMOVMSKB Y1, R11
	MOVL      DX, R12
	NOTL      R12
	TESTL     R11, R12
	JNZ       single2 // an unescaped quote: the string ends here

	// the escaped bytes must all be valid escape letters
	VMOVDQU   escnib<>(SB), X13
	VPBROADCASTB X13, Y13     // 0x0f
	VPSRLW    $4, Y0, Y4
	VPAND     Y13, Y4, Y4     // high nibbles
	VPAND     Y13, Y0, Y5     // low nibbles
	VMOVDQU   eschi<>(SB), Y6
	VPSHUFB   Y4, Y6, Y6
	VMOVDQU   esclo<>(SB), Y7
	VPSHUFB   Y5, Y7, Y7
	VPAND     Y6, Y7, Y7
	VPXOR     Y6, Y6, Y6
	VPCMPEQB  Y6, Y7, Y7      // 0xff: not an escape letter
	VPMOVMSKB Y7, R11
	TESTL     R11, DX
	JNZ       single2         // \u or an invalid escape

	// decode b f n r t where they follow a backslash
	VPBROADCASTB escnib<>+8(SB), Y8  // 0x08
	VPSRLW    $1, Y0, Y9
	VPAND     Y8, Y9, Y9
	VPXOR     Y5, Y9, Y9              // letter index
	VMOVDQU   escletter<>(SB), Y10
	VPSHUFB   Y9, Y10, Y10            // the letters' bytes
	VPBROADCASTB escnib<>+16(SB), Y8 // 0x60
	VPAND     Y8, Y0, Y11
	VPCMPEQB  Y8, Y11, Y11            // letters (bits 0x60 set)
	VPERM2I128 $0x08, Y2, Y2, Y12     // low lane 0, high lane Y2's low
	VPALIGNR  $15, Y12, Y2, Y12       // 0xff after a backslash
	VPAND     Y11, Y12, Y12
	VPBLENDVB Y12, Y10, Y0, Y0

	// squeeze out the backslashes, 8 bytes at a time
	LEAQ      esccomp<>(SB), R13
	MOVL      CX, R12
	ANDL      $0xff, R12
	VMOVQ     (R13)(R12*8), X4
	VPSHUFB   X4, X0, X5
	VMOVQ     X5, (DI)(R9*1)
	POPCNTL   R12, R12
	ADDQ      $8, R9
	SUBQ      R12, R9
	MOVL      CX, R12
	SHRL      $8, R12
	ANDL      $0xff, R12
	VPSRLDQ   $8, X0, X6
	VMOVQ     (R13)(R12*8), X4
	VPSHUFB   X4, X6, X5
	VMOVQ     X5, (DI)(R9*1)
	POPCNTL   R12, R12
	ADDQ      $8, R9
	SUBQ      R12, R9
	VEXTRACTI128 $1, Y0, X7
	MOVL      CX, R12
	SHRL      $16, R12
	ANDL      $0xff, R12
	VMOVQ     (R13)(R12*8), X4
	VPSHUFB   X4, X7, X5
	VMOVQ     X5, (DI)(R9*1)
	POPCNTL   R12, R12
	ADDQ      $8, R9
	SUBQ      R12, R9
	SHRL      $24, CX
	VPSRLDQ   $8, X7, X6
	VMOVQ     (R13)(CX*8), X4
	VPSHUFB   X4, X6, X5
	VMOVQ     X5, (DI)(R9*1)
	POPCNTL   CX, CX
	ADDQ      $8, R9
	SUBQ      CX, R9
	ADDQ      $32, BX
	JMP       loop2

// single2: step to the chunk's first quote or backslash (AX) and take it.
single2:
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
