package fastpath

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Test packet builder: Ethernet + IPv4 (+ options) + TCP, with valid
// checksums, so fixtures read like the wire.

type tcpPkt struct {
	srcMAC, dstMAC string
	src, dst       netip.AddrPort
	flags          uint8
	proto          uint8  // 0 = TCP
	ipOpts         []byte // multiple of 4 bytes
	fragOff        uint16 // flags+offset field as on the wire, e.g. 0x4000 (DF)
	tos            uint8
	id             uint16
	payload        []byte
}

const (
	fSYN = 0x02
	fACK = 0x10
	fPSH = 0x08
)

func mac(s string) []byte {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func csumFold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = (sum & 0xffff) + (sum >> 16)
	}
	return ^uint16(sum)
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func ethHdr(dst, src string, typ uint16) []byte {
	b := append(append([]byte{}, mac(dst)...), mac(src)...)
	return binary.BigEndian.AppendUint16(b, typ)
}

// ipv4Hdr returns an IPv4 header (with options) for a payload of n bytes.
func ipv4Hdr(src, dst netip.Addr, proto uint8, tos uint8, id, fragOff uint16, opts []byte, n int) []byte {
	ihl := 20 + len(opts)
	h := make([]byte, ihl)
	h[0] = 0x40 | byte(ihl/4)
	h[1] = tos
	binary.BigEndian.PutUint16(h[2:], uint16(ihl+n))
	binary.BigEndian.PutUint16(h[4:], id)
	binary.BigEndian.PutUint16(h[6:], fragOff)
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	copy(h[20:], opts)
	binary.BigEndian.PutUint16(h[10:], csumFold(csumAdd(0, h)))
	return h
}

func (p tcpPkt) tcp() []byte {
	t := make([]byte, 20, 20+len(p.payload))
	binary.BigEndian.PutUint16(t[0:], p.src.Port())
	binary.BigEndian.PutUint16(t[2:], p.dst.Port())
	binary.BigEndian.PutUint32(t[4:], 1000)
	if p.flags&fACK != 0 {
		binary.BigEndian.PutUint32(t[8:], 2000)
	}
	t[12] = 5 << 4
	t[13] = p.flags
	binary.BigEndian.PutUint16(t[14:], 65535)
	t = append(t, p.payload...)
	s, d := p.src.Addr().As4(), p.dst.Addr().As4()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 6, byte(len(t)>>8), byte(len(t)))
	binary.BigEndian.PutUint16(t[16:], csumFold(csumAdd(csumAdd(0, pseudo), t)))
	return t
}

// ip returns the IPv4 packet (no Ethernet header).
func (p tcpPkt) ip() []byte {
	proto := p.proto
	if proto == 0 {
		proto = 6
	}
	l4 := p.tcp()
	return append(ipv4Hdr(p.src.Addr(), p.dst.Addr(), proto, p.tos, p.id, p.fragOff, p.ipOpts, len(l4)), l4...)
}

// frame returns the Ethernet frame.
func (p tcpPkt) frame() []byte {
	return append(ethHdr(p.dstMAC, p.srcMAC, 0x0800), p.ip()...)
}

// encap returns what the edge should emit for inner IPv4 packet ip: an
// Ethernet header from srcMAC to dstMAC and an outer IPv4 header, protocol
// 4, tos and id copied, DF copied, TTL 64, valid checksum.
func encap(ip []byte, dstMAC, srcMAC string, outerSrc, outerDst netip.Addr) []byte {
	tos := ip[1]
	id := binary.BigEndian.Uint16(ip[4:])
	df := binary.BigEndian.Uint16(ip[6:]) & 0x4000
	out := ethHdr(dstMAC, srcMAC, 0x0800)
	out = append(out, ipv4Hdr(outerSrc, outerDst, 4, tos, id, df, nil, len(ip))...)
	return append(out, ip...)
}

// ipv6Frame returns an IPv6 TCP SYN frame (contents beyond the header are
// irrelevant: the program must pass it untouched).
func ipv6Frame(dstMAC, srcMAC string) []byte {
	b := ethHdr(dstMAC, srcMAC, 0x86dd)
	h := make([]byte, 40+20)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], 20)
	h[6] = 6
	h[7] = 64
	copy(h[8:], netip.MustParseAddr("fd00::1").AsSlice())
	copy(h[24:], netip.MustParseAddr("fd00::2").AsSlice())
	binary.BigEndian.PutUint16(h[40:], 40000)
	binary.BigEndian.PutUint16(h[42:], 8000)
	h[52] = 5 << 4
	h[53] = fSYN
	return append(b, h...)
}

// icmpFragNeeded returns the ICMP "fragmentation needed" the edge answers a
// too-big frame with: MACs swapped, from the frame's destination to its
// source, next-hop MTU mtu-20, quoting the IP header and 8 bytes of TCP.
func icmpFragNeeded(frame []byte, dstMAC, srcMAC string, mtu uint16) []byte {
	ip := frame[14:]
	var src, dst [4]byte
	copy(src[:], ip[16:20])
	copy(dst[:], ip[12:16])
	icmp := []byte{3, 4, 0, 0, 0, 0, byte((mtu - 20) >> 8), byte(mtu - 20)}
	icmp = append(icmp, ip[:28]...)
	binary.BigEndian.PutUint16(icmp[2:], csumFold(csumAdd(0, icmp)))
	out := ethHdr(dstMAC, srcMAC, 0x0800)
	out = append(out, ipv4Hdr(netip.AddrFrom4(src), netip.AddrFrom4(dst), 1, 0, 0, 0, nil, len(icmp))...)
	return append(out, icmp...)
}
