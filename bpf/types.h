/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Minimal, self-contained kernel ABI definitions for the warmpath XDP
 * programs. Copied from the stable UAPI (linux/bpf.h, if_ether.h, ip.h,
 * tcp.h) so the build needs no arch-specific asm/ headers and regenerates
 * byte-identically on any host with the pinned clang.
 */
#ifndef WARMPATH_TYPES_H
#define WARMPATH_TYPES_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;

enum xdp_action {
	XDP_ABORTED = 0,
	XDP_DROP,
	XDP_PASS,
	XDP_TX,
	XDP_REDIRECT,
};

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

enum bpf_map_type_min {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_FIB_LOOKUP_DIRECT = (1U << 0),
	BPF_FIB_LOOKUP_OUTPUT = (1U << 1),
	BPF_FIB_LOOKUP_SKIP_NEIGH = (1U << 2),
	BPF_FIB_LOOKUP_TBID = (1U << 3),
	BPF_FIB_LOOKUP_SRC = (1U << 4),
};

enum {
	BPF_FIB_LKUP_RET_SUCCESS,
	BPF_FIB_LKUP_RET_BLACKHOLE,
	BPF_FIB_LKUP_RET_UNREACHABLE,
	BPF_FIB_LKUP_RET_PROHIBIT,
	BPF_FIB_LKUP_RET_NOT_FWDED,
	BPF_FIB_LKUP_RET_FWD_DISABLED,
	BPF_FIB_LKUP_RET_UNSUPP_LWT,
	BPF_FIB_LKUP_RET_NO_NEIGH,
	BPF_FIB_LKUP_RET_FRAG_NEEDED,
	BPF_FIB_LKUP_RET_NO_SRC_ADDR,
};

struct bpf_fib_lookup {
	__u8 family;
	__u8 l4_protocol;
	__be16 sport;
	__be16 dport;
	union {
		__u16 tot_len;
		__u16 mtu_result;
	} __attribute__((packed, aligned(2)));
	__u32 ifindex;
	union {
		__u8 tos;
		__be32 flowinfo;
		__u32 rt_metric;
	};
	union {
		__be32 ipv4_src;
		__u32 ipv6_src[4];
	};
	union {
		__be32 ipv4_dst;
		__u32 ipv6_dst[4];
	};
	union {
		struct {
			__be16 h_vlan_proto;
			__be16 h_vlan_TCI;
		};
		__u32 tbid;
	};
	__u8 smac[6];
	__u8 dmac[6];
};

#define ETH_ALEN 6
#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define AF_INET 2
#define IPPROTO_IPIP 4
#define IPPROTO_TCP 6
#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

struct ethhdr {
	__u8 h_dest[ETH_ALEN];
	__u8 h_source[ETH_ALEN];
	__be16 h_proto;
} __attribute__((packed));

/* iphdr without bitfields: ver_ihl = version<<4 | ihl. */
struct iphdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__be32 saddr;
	__be32 daddr;
};

/* tcphdr without bitfields: doff_res = data offset<<4 | reserved. */
struct tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res;
	__u8 flags;
	__be16 window;
	__u16 check;
	__be16 urg_ptr;
};

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

#endif
