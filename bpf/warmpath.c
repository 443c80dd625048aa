//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * warmpath XDP datapath.
 *
 * xdp_steer (edge host, client-facing interface): packets for a service
 * (VIP:port/TCP) are either passed to the local slowpath (LOCAL) or
 * encapsulated in IPIP and forwarded to the GPU host that holds the client's
 * warm KV cache. A SYN is decided once and the decision is remembered in an
 * LRU flow table, so no connection ever changes host mid-stream. An
 * established steered packet whose flow was steered in the current tick
 * takes steer_fast (its ready headers, per CPU); everything else takes
 * steer_main.
 *
 * xdp_decap (GPU hosts): strips the outer IPv4 header of IPIP packets whose
 * inner packet is for a service and passes the inner packet to the stack.
 *
 * xdp_pass: returns XDP_PASS; the benchmark floor.
 *
 * Rule: anything not understood is passed untouched (never steered, never
 * dropped). Every header access is preceded by a bounds check.
 *
 * Return codes: a helper that produces an XDP verdict returns it (enum
 * xdp_action, >= 0); one that can fail returns a success value >= 0 (0, or
 * the BPF_FIB_LKUP_RET_* it got) or a negative enum rc (defined below),
 * and a lookup returns a pointer or NULL; the contract above each helper
 * says which. (steer and steer_fast return both: a verdict, or a negative
 * rc.)
 *
 * Helper contracts used throughout (each call site repeats the relevant one):
 *   bpf_map_lookup_elem: pointer to the value, or NULL when the key is
 *     absent (hash) or out of range (array); never NULL for an in-range
 *     array or per-CPU array index.
 *   bpf_map_update_elem: 0, or < 0 (e.g. -E2BIG when a hash map is full).
 *   bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC_COARSE in ns, cannot fail.
 *   bpf_jiffies64: the tick counter, cannot fail.
 */
#include "types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_SERVICES 64
#define MAX_BACKENDS 256
#define MAX_AFFINITY 65536
#define MAX_FLOWS 131072
#define FLOW_CACHE_SLOTS 4096 /* per CPU; a power of two */
#define FLOW_CACHE_TICKS 64   /* 64 ms at HZ=1000, 640 ms at HZ=100 */
#define READY_SLOTS 1024      /* per CPU, 64 KiB; a power of two */
#define BACKEND_LOCAL 0xffffffffu
#define OUTER_TTL 64
#define IPPROTO_ICMP 1
#define ICMP_RATE_PER_SEC 1000 /* per CPU */
#define ICMP_REPLY_LEN (ETH_HLEN + 20 + 8 + 20 + 8)

/* Service key: a VIP, a port and a protocol (only TCP is steered). */
struct svc_key {
	__be32 vip;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* Service value: reserved flags (none defined yet). */
struct svc_val {
	__u32 flags;
};

/* Affinity key: a client address and the service it connects to. */
struct aff_key {
	__be32 client;
	__be32 vip;
	__be16 port;
	__u16 pad;
};

/*
 * Affinity value, written by Go. last_used_ns (CLOCK_MONOTONIC, written by
 * the program with bpf_ktime_get_coarse_ns: at most a tick behind, ~35 ns
 * cheaper here, plenty for idle times of minutes) is refreshed by the
 * program each time the entry decides a connection; gen must equal the
 * backend's generation for the entry to count.
 */
struct aff_val {
	__u64 last_used_ns;
	__u32 backend;
	__u32 gen;
};

/* Backend slot, indexed by backend id. addr 0 or healthy 0: unusable. */
struct backend {
	__be32 addr;
	__u32 gen;
	/* sample_every N > 0: every Nth affinity SYN (per CPU) goes LOCAL. */
	__u32 sample_every;
	__u8 healthy;
	__u8 pad[3];
};

/*
 * Flow key: the TCP 4-tuple as seen on the client-facing interface (only TCP
 * has flows). 12 bytes: the kernel hashes them in one jhash round, ~9 ns
 * less per lookup than a 16-byte key.
 */
struct flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

/* Flow decision: backend id and host address, or backend BACKEND_LOCAL. */
struct flow_val {
	__be32 addr;
	__u32 backend;
};

/* Global configuration, a single array slot written by Go. */
struct config {
	/* Outer source address; 0 = let bpf_fib_lookup pick (BPF_FIB_LOOKUP_SRC). */
	__be32 encap_src;
	/* Decap: when non-zero only outer packets from this source are stripped. */
	__be32 decap_src;
	/* Next-hop cache lifetime; 0 = no cache, bpf_fib_lookup on every packet. */
	__u64 nh_ttl_ns;
	/* Bumped by Go when it deletes flows: every flow_cache slot filled
	 * before is stale. */
	__u32 flow_epoch;
	__u32 pad;
};

/*
 * Per-CPU flow cache slot: a copy of one flows entry (key and decision),
 * direct-mapped by a hash of the key, so an established packet usually
 * finds its decision with an array lookup (inlined) instead of a hash
 * lookup (~20 ns here). Valid while epoch equals config.flow_epoch and for
 * FLOW_CACHE_TICKS jiffies after filled. The program's own writes to flows
 * replace this CPU's slot; another CPU's copy of a re-decided flow lives on
 * for at most FLOW_CACHE_TICKS (a flow is re-decided only by its SYN, which
 * cannot follow non-SYN packets of the same 4-tuple that quickly: TCP's
 * TIME_WAIT, or tcp_tw_reuse's one second).
 */
struct flow_cache_slot {
	struct flow_key key;
	__be32 addr;
	__u32 backend;
	__u32 epoch;
	__u64 filled;
};

/*
 * Per-CPU ready-headers slot (see steer_fast), direct-mapped by the same
 * hash of the 4-tuple as flow_cache into fewer slots, so that the lookup
 * steer_fast makes for every established packet stays in the CPU's cache
 * even when the flows in turn outnumber the flow cache: the encapsulation
 * of one steered flow, from the backend's next-hop cache slot when a packet
 * of the flow was steered with it: outer source and destination (the
 * flow's host), checksum base, egress MTU, Ethernet addresses, egress
 * interface and the backend for its counter. Valid for key in the tick
 * tick only (the tick that next-hop slot was checked in), so it never
 * outlives the next-hop cache's own expiry check by more than a tick, and
 * while epoch equals config.flow_epoch; tick 0 (no tick is 0: jiffies
 * start far from it) when the slot holds none. Every write of the flow's
 * flow_cache copy on this CPU clears it. 64 bytes: one cache line.
 */
struct ready_slot {
	struct flow_key key;
	__u32 epoch;
	__be32 src;
	__be32 addr;
	__u32 backend;
	/* The next-hop checksum base folded to 16 bits. */
	__u16 csum;
	__u16 mtu;
	__u64 tick;
	/* The MACs as stored in the frame, in the pieces steer_fast writes:
	 * bytes 2-5 and 6-9, then 0-1 and 10-11. */
	__u32 eth1;
	__u32 eth2;
	__u16 eth0;
	__u16 eth3;
	__u32 ifindex;
	__u64 pad;
};
_Static_assert(sizeof(struct ready_slot) == 64, "ready_slot is one cache line");

/*
 * Per-CPU next-hop cache slot, indexed by backend id: the result of a
 * successful bpf_fib_lookup for dst, and the egress MTU, valid until
 * expires_ns (bpf_ktime_get_coarse_ns). Saves the FIB lookup on most packets.
 * The coarse clock only moves when jiffies do, so it is read once per tick
 * (seen_jiffies: the tick it was last read in, and expires_ns had not
 * passed), not per packet: bpf_jiffies64 is a load, the clock ~7 ns here.
 */
struct nexthop {
	__u64 expires_ns;
	__u64 seen_jiffies;
	__be32 dst;
	__be32 src;
	__u32 ifindex;
	__u16 mtu;
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	__u16 pad;
	/* One's complement sum of the outer header's constant words (TTL,
	 * protocol, addresses): the per-packet checksum adds four words. */
	__u32 csum_base;
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/*
 * Global counter slots. bpf2go generates the Go constants from this enum
 * (-type counter_idx, bpf.WarmpathCounterIdx); fastpath.CounterKind takes
 * its values from them and each metric name is the enumerator's name in
 * lower case without "C_" (TestCounterLayout checks it).
 */
enum counter_idx {
	C_PASS_NOT_IPV4 = 0,  /* not IPv4 (IPv6, ARP, VLAN...): passed */
	C_PASS_NOT_SERVICE,   /* IPv4 but not TCP to a service: passed */
	C_PASS_FRAGMENT,      /* IPv4 TCP fragment: passed */
	C_PASS_LOCAL,         /* service packet of a LOCAL flow: passed */
	C_PASS_NO_STATE,      /* service non-SYN with no flow, no affinity: passed */
	C_STEERED,            /* encapsulated and redirected/transmitted; not
			       * written: Go derives it as the sum of the
			       * backends' BE_STEERED minus C_STEERED_STACK, so
			       * a steered packet updates one counter */
	C_STEERED_STACK,      /* encapsulated and passed: neighbour unresolved */
	C_DROPPED,            /* steered flow that cannot be forwarded now */
	C_ERR_MALFORMED,      /* truncated or invalid header: passed */
	C_ERR_FIB,            /* bpf_fib_lookup failed (not neigh, not MTU) */
	C_ERR_FRAG_NEEDED,    /* encapsulated packet exceeds the egress MTU */
	C_ERR_HEADROOM,       /* bpf_xdp_adjust_head failed */
	C_FLOW_NEW_STEER,     /* SYN decided: backend */
	C_FLOW_NEW_LOCAL,     /* SYN decided: LOCAL */
	C_FLOW_RESTORED,      /* non-SYN without flow, steered from affinity */
	C_AFFINITY_STALE,     /* affinity ignored: unhealthy, generation, unknown */
	C_SAMPLED,            /* affinity SYN sampled to the slowpath */
	C_DECAP_OK,           /* decap: outer header stripped */
	C_DECAP_PASS,         /* decap: not IPIP for a service: passed untouched */
	C_DECAP_MALFORMED,    /* decap: truncated or invalid inner packet */
	C_DECAP_ERR_HEADROOM, /* decap: bpf_xdp_adjust_head failed */
	C_ICMP_FRAG_NEEDED,   /* ICMP "fragmentation needed" sent to a client */
	C_GLOBAL_MAX,
};

/* Per-backend slots follow the globals: C_GLOBAL_MAX + id*BE_SLOTS + slot
 * (-type backend_counter_slot for Go). */
enum backend_counter_slot {
	BE_STEERED = 0, /* packets/bytes steered to the backend */
	BE_SYN,         /* SYNs with a valid affinity to the backend */
	BE_SAMPLED,     /* of those, sampled to the slowpath */
	BE_SLOTS,
};

/*
 * Never read: these make clang emit the two counter enums into BTF, where
 * bpf2go finds them (-type). Their section is none the loader knows, so no
 * map or variable is created for them.
 */
const enum counter_idx counter_idx_btf __attribute__((section(".btf_only"), used)) = C_GLOBAL_MAX;
const enum backend_counter_slot backend_counter_slot_btf __attribute__((section(".btf_only"), used)) = BE_SLOTS;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SERVICES);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_AFFINITY);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} settings SEC(".maps");

/*
 * Service ports, a bitmap indexed by TCP destination port (bit port & 63 of
 * slot port >> 6), written by Go with the services map. A clear bit means no
 * service has this port, so the packet is not for a service: the filter that
 * lets the flow table come first without charging other traffic a hash
 * lookup. Not pinned: rebuilt from the services map by each loaded program.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} svc_ports SEC(".maps");

/* Per-CPU rate limit for ICMP replies: a one-second window. Not pinned. */
struct icmp_budget {
	__u64 window_ns;
	__u32 sent;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct icmp_budget);
} icmp_budget SEC(".maps");

/* Not pinned: a cache of flows, rebuilt by each loaded program. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct flow_cache_slot);
} flow_cache SEC(".maps");

/* Not pinned: ready headers, rebuilt by each loaded program. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, READY_SLOTS);
	__type(key, __u32);
	__type(value, struct ready_slot);
} ready SEC(".maps");

/* Not pinned: a cache, rebuilt by each loaded program. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct nexthop);
} nexthops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_GLOBAL_MAX + MAX_BACKENDS * BE_SLOTS);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counters SEC(".maps");

/* count adds one packet of len bytes to counter slot idx. No return value;
 * an out-of-range idx is ignored (array lookup returns NULL). */
static __always_inline struct counter *count(__u32 idx, __u64 len)
{
	/* bpf_map_lookup_elem (per-CPU array): this CPU's slot, NULL if idx
	 * is out of range. */
	struct counter *c = bpf_map_lookup_elem(&counters, &idx);

	if (c) {
		c->packets++;
		c->bytes += len;
	}
	return c;
}

/* count_backend adds to the per-backend slot; returns the counter or NULL. */
static __always_inline struct counter *count_backend(__u32 id, __u32 slot, __u64 len)
{
	if (id >= MAX_BACKENDS)
		return 0;
	return count(C_GLOBAL_MAX + id * BE_SLOTS + slot, len);
}

/*
 * csum16 is the Internet checksum (RFC 1071) of n 16-bit words at p, with
 * base (a one's complement sum of words summed earlier) added: the words
 * are summed, the carries folded twice, the result complemented. The
 * checksum field must be zero in the words summed. The result is stored as
 * is (byte order independent). n is a compile-time constant at every call
 * (the loop unrolls).
 */
static __always_inline __u16 csum16(const void *p, int n, __u32 base)
{
	const __u16 *w = p;
	__u32 sum = base;

#pragma clang loop unroll(full)
	for (int i = 0; i < n; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/*
 * usable_backend returns the backend slot for id when it can take new
 * connections (known address, healthy), else NULL.
 */
static __always_inline struct backend *usable_backend(__u32 id)
{
	struct backend *be = bpf_map_lookup_elem(&backends, &id);

	if (!be || !be->healthy || be->addr == 0)
		return 0;
	return be;
}

/*
 * affinity_pick looks up the affinity of (client, service). It returns the
 * backend when the entry exists, its backend is usable and the generations
 * match, writing the id to *id and refreshing last_used_ns. Returns NULL
 * otherwise (a stale entry is counted in C_AFFINITY_STALE).
 */
static __always_inline struct backend *affinity_pick(__be32 client, const struct svc_key *sk,
						     __u32 *id, __u64 len)
{
	struct aff_key ak = { .client = client, .vip = sk->vip, .port = sk->port };
	/* bpf_map_lookup_elem (hash): the value, or NULL when absent. */
	struct aff_val *av = bpf_map_lookup_elem(&affinity, &ak);
	struct backend *be;

	if (!av)
		return 0;
	be = usable_backend(av->backend);
	if (!be || be->gen != av->gen) {
		count(C_AFFINITY_STALE, len);
		return 0;
	}
	/* bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC_COARSE, the tick-grained
	 * view of the clock Go compares with (never ahead of it). */
	av->last_used_ns = bpf_ktime_get_coarse_ns();
	*id = av->backend;
	return be;
}


/* Failure codes of the helpers below (see the top of this file). */
enum rc {
	RC_FAIL = -1,      /* not done, packet unmodified */
	RC_DROP = -2,      /* packet modified and unusable: drop it */
	RC_FRAG = -3,      /* too big for the egress MTU (in *mtu), unmodified */
	RC_NOT_TCP = -4,   /* parse: IPv4, not TCP */
	RC_FRAGMENT = -5,  /* parse: IPv4 TCP fragment */
	RC_MALFORMED = -6, /* parse: truncated or invalid header */
};

/*
 * parse_ipv4_tcp checks the IPv4 header at ip and the TCP header after it,
 * both below end. Returns 0 with *tcp pointing at the TCP header (its 20
 * fixed bytes in bounds), *ihl the IPv4 header length and *tot the IPv4
 * total length in bytes (ip + *tot <= end); or, with nothing written but
 * possibly *ihl and *tot, RC_MALFORMED (truncated, version not 4, header
 * length below 20, total length below it or past end, TCP header
 * truncated), RC_NOT_TCP (another protocol) or RC_FRAGMENT (a TCP
 * fragment), checked in that order. The TCP data offset is left to the
 * caller.
 */
static __always_inline int parse_ipv4_tcp(struct iphdr *ip, void *end, struct tcphdr **tcp,
					  __u32 *ihl, __u32 *tot)
{
	struct tcphdr *t;

	if ((void *)(ip + 1) > end)
		return RC_MALFORMED;
	if ((ip->ver_ihl >> 4) != 4)
		return RC_MALFORMED;
	*ihl = (ip->ver_ihl & 0x0f) * 4;
	if (*ihl < sizeof(*ip))
		return RC_MALFORMED;
	*tot = bpf_ntohs(ip->tot_len);
	if (*tot < *ihl || (void *)ip + *tot > end)
		return RC_MALFORMED;
	if (ip->protocol != IPPROTO_TCP)
		return RC_NOT_TCP;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return RC_FRAGMENT;
	t = (void *)ip + *ihl;
	if ((void *)(t + 1) > end)
		return RC_MALFORMED;
	*tcp = t;
	return 0;
}

/*
 * frag_needed_reply rewrites the packet (Ethernet + IPv4 without options +
 * at least 8 bytes of TCP) into an ICMP "fragmentation needed" (type 3,
 * code 4) from its destination to its source, advertising mtu - 20 so the
 * client's next segments still fit after encapsulation; the caller returns
 * XDP_TX. Returns 0 when rewritten, RC_FAIL with the packet unmodified when
 * it must not answer (IP options, DF clear, MTU too small, rate limit, no
 * tailroom), RC_DROP when modified but unusable.
 */
static __always_inline int frag_needed_reply(struct xdp_md *ctx, __u16 mtu)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr old, *eth = data;
	struct iphdr orig, *ip = data + sizeof(*eth);
	struct icmp_budget *b;
	__u8 l4[8], *icmp;
	__u32 key = 0;
	__u64 now;

	if ((void *)(ip + 1) + sizeof(l4) > end)
		return RC_FAIL;
	if (ip->ver_ihl != 0x45 || !(ip->frag_off & bpf_htons(IP_DF)))
		return RC_FAIL;
	if (mtu < 68 + sizeof(struct iphdr))
		return RC_FAIL;
	/* bpf_map_lookup_elem (per-CPU array, index 0): never NULL. */
	b = bpf_map_lookup_elem(&icmp_budget, &key);
	if (!b)
		return RC_FAIL;
	now = bpf_ktime_get_coarse_ns();
	if (now - b->window_ns >= 1000000000ull) {
		b->window_ns = now;
		b->sent = 0;
	}
	if (b->sent >= ICMP_RATE_PER_SEC)
		return RC_FAIL;
	b->sent++;

	old = *eth;
	orig = *ip;
	__builtin_memcpy(l4, (void *)(ip + 1), sizeof(l4));
	/* bpf_xdp_adjust_tail: 0 on success, < 0 (packet untouched) when the
	 * new length is out of bounds. Invalidates every packet pointer. */
	if (bpf_xdp_adjust_tail(ctx, ICMP_REPLY_LEN - (int)(end - data)))
		return RC_FAIL;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + ICMP_REPLY_LEN > end)
		return RC_DROP;
	eth = data;
	ip = data + sizeof(*eth);
	icmp = (__u8 *)(ip + 1);

	__builtin_memcpy(eth->h_dest, old.h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, old.h_dest, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);

	ip->ver_ihl = 0x45;
	ip->tos = 0;
	ip->tot_len = bpf_htons(ICMP_REPLY_LEN - ETH_HLEN);
	ip->id = 0;
	ip->frag_off = 0;
	ip->ttl = OUTER_TTL;
	ip->protocol = IPPROTO_ICMP;
	ip->check = 0;
	ip->saddr = orig.daddr;
	ip->daddr = orig.saddr;
	ip->check = csum16(ip, sizeof(*ip) / 2, 0);

	icmp[0] = 3; /* destination unreachable */
	icmp[1] = 4; /* fragmentation needed and DF set */
	icmp[2] = 0;
	icmp[3] = 0;
	icmp[4] = 0;
	icmp[5] = 0;
	*(__be16 *)(icmp + 6) = bpf_htons(mtu - sizeof(struct iphdr));
	__builtin_memcpy(icmp + 8, &orig, sizeof(orig));
	__builtin_memcpy(icmp + 8 + sizeof(orig), l4, sizeof(l4));
	*(__u16 *)(icmp + 2) = csum16(icmp, (8 + 20 + 8) / 2, 0);
	return 0;
}

/* outer_csum_base sums the outer header words that are fixed per next hop:
 * TTL and protocol, source and destination (byte order independent). */
static __always_inline __u32 outer_csum_base(__be32 src, __be32 dst)
{
	__u8 tp[2] = { OUTER_TTL, IPPROTO_IPIP };
	__u16 w;

	__builtin_memcpy(&w, tp, sizeof(w));
	return (__u32)w + (src & 0xffff) + (src >> 16) + (dst & 0xffff) + (dst >> 16);
}

/*
 * next_hop routes an encapsulated packet to dst (bpf_fib_lookup, which also
 * checks inner_len + 20 against the egress MTU) and fills hop's src,
 * ifindex, smac, dmac and mtu (0xffff: the lookup checked it). Returns
 * BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LKUP_RET_NO_NEIGH (src and ifindex
 * only: the stack resolves the neighbour), RC_FRAG with *mtu set or
 * RC_FAIL (both counted). On success with nh non-NULL it refills that
 * cache slot, learning the egress MTU with a second lookup.
 */
static __always_inline long next_hop(struct xdp_md *ctx, const struct config *cfg, __be32 dst,
				     __u8 tos, __u16 inner_len, struct nexthop *nh, __u64 jiffies,
				     struct nexthop *hop, __u16 *mtu, __u64 len)
{
	struct bpf_fib_lookup fib = {};
	__u32 flags = 0;
	long rc, rc2;

	fib.family = AF_INET;
	fib.l4_protocol = IPPROTO_IPIP;
	fib.tos = tos;
	fib.tot_len = inner_len + sizeof(struct iphdr);
	fib.ifindex = ctx->ingress_ifindex;
	fib.ipv4_src = cfg->encap_src;
	fib.ipv4_dst = dst;
	if (!cfg->encap_src)
		flags = BPF_FIB_LOOKUP_SRC;

	/*
	 * bpf_fib_lookup: < 0 on invalid arguments, 0 (SUCCESS) with ifindex,
	 * smac, dmac (and ipv4_src with BPF_FIB_LOOKUP_SRC) filled, or a
	 * BPF_FIB_LKUP_RET_* reason > 0. NO_NEIGH still fills ifindex and src;
	 * FRAG_NEEDED fills mtu_result.
	 */
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), flags);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		count(C_ERR_FRAG_NEEDED, len);
		*mtu = fib.mtu_result;
		return RC_FRAG;
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		count(C_ERR_FIB, len);
		return RC_FAIL;
	}
	hop->src = fib.ipv4_src;
	hop->ifindex = fib.ifindex;
	hop->mtu = 0xffff;
	hop->csum_base = outer_csum_base(fib.ipv4_src, dst);
	__builtin_memcpy(hop->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(hop->dmac, fib.dmac, ETH_ALEN);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && nh) {
		/* Learn the egress MTU: the largest tot_len fails with it. */
		struct bpf_fib_lookup probe = {};
		__u16 egress = 0xffff;

		probe.family = AF_INET;
		probe.l4_protocol = IPPROTO_IPIP;
		probe.tos = tos;
		probe.tot_len = 0xffff;
		probe.ifindex = ctx->ingress_ifindex;
		probe.ipv4_src = fib.ipv4_src;
		probe.ipv4_dst = dst;
		rc2 = bpf_fib_lookup(ctx, &probe, sizeof(probe), 0);
		if (rc2 == BPF_FIB_LKUP_RET_FRAG_NEEDED)
			egress = probe.mtu_result;
		if (rc2 == BPF_FIB_LKUP_RET_SUCCESS || rc2 == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
			nh->dst = dst;
			nh->src = fib.ipv4_src;
			nh->ifindex = fib.ifindex;
			nh->mtu = egress;
			nh->csum_base = hop->csum_base;
			__builtin_memcpy(nh->smac, fib.smac, ETH_ALEN);
			__builtin_memcpy(nh->dmac, fib.dmac, ETH_ALEN);
			nh->expires_ns = bpf_ktime_get_coarse_ns() + cfg->nh_ttl_ns;
			nh->seen_jiffies = jiffies;
		}
	}
	return rc;
}

/* flow_hash is the multiplicative hash of fk's 4-tuple both per-CPU
 * direct-mapped caches index with (their top bits). */
static __always_inline __u32 flow_hash(const struct flow_key *fk)
{
	return (fk->saddr ^ fk->daddr ^ ((__u32)fk->sport << 16 | fk->dport)) * 0x9e3779b1u;
}

/* flow_slot returns this CPU's cache slot for fk, masked into range (so
 * never NULL in practice). */
static __always_inline struct flow_cache_slot *flow_slot(const struct flow_key *fk)
{
	__u32 idx = flow_hash(fk) >> 20 & (FLOW_CACHE_SLOTS - 1);

	/* bpf_map_lookup_elem (per-CPU array): NULL only out of range. */
	return bpf_map_lookup_elem(&flow_cache, &idx);
}

/* ready_slot_of returns this CPU's ready-headers slot for fk (never NULL
 * in practice: masked into range). */
static __always_inline struct ready_slot *ready_slot_of(const struct flow_key *fk)
{
	__u32 idx = flow_hash(fk) >> 22 & (READY_SLOTS - 1);

	/* bpf_map_lookup_elem (per-CPU array): NULL only out of range. */
	return bpf_map_lookup_elem(&ready, &idx);
}

/* ready_clear voids this CPU's ready headers for fk, if its slot holds
 * them: called whenever fk's flow cache copy is written, so no headers
 * outlive the decision they were built from. No return value. */
static __always_inline void ready_clear(const struct flow_key *fk)
{
	struct ready_slot *r = ready_slot_of(fk);

	if (r && r->key.saddr == fk->saddr && r->key.daddr == fk->daddr &&
	    r->key.sport == fk->sport && r->key.dport == fk->dport)
		r->tick = 0;
}

/* flow_slot_fill copies a flows entry into this CPU's cache slot. */
static __always_inline void flow_slot_fill(struct flow_cache_slot *slot, const struct flow_key *fk,
					   const struct flow_val *fv, __u32 epoch, __u64 jiffies)
{
	slot->key = *fk;
	slot->addr = fv->addr;
	slot->backend = fv->backend;
	slot->epoch = epoch;
	slot->filled = jiffies;
	ready_clear(fk);
}

/* ready_fill stores in fk's ready slot the encapsulation of the flow (cache
 * copy slot) from next-hop cache slot nh (checked in tick jiffies; nh->dst
 * is slot->addr). No return value. */
static __always_inline void ready_fill(const struct flow_key *fk, const struct flow_cache_slot *slot,
				       const struct nexthop *nh, __u64 jiffies)
{
	struct ready_slot *r = ready_slot_of(fk);
	__u32 sum = (nh->csum_base & 0xffff) + (nh->csum_base >> 16);

	if (!r)
		return;
	r->key = *fk;
	r->epoch = slot->epoch;
	r->backend = slot->backend;
	r->addr = slot->addr;
	__builtin_memcpy(&r->eth0, nh->dmac, 2);
	__builtin_memcpy(&r->eth1, nh->dmac + 2, 4);
	__builtin_memcpy(&r->eth2, nh->smac, 4);
	__builtin_memcpy(&r->eth3, nh->smac + 4, 2);
	r->ifindex = nh->ifindex;
	r->src = nh->src;
	/* Folding keeps a one's complement sum's value. */
	r->csum = (sum & 0xffff) + (sum >> 16);
	r->mtu = nh->mtu;
	r->tick = jiffies;
}

/* record_flow writes dec for fk to the flow table and to this CPU's cache
 * slot. bpf_map_update_elem: 0 or < 0; on failure the packet still follows
 * dec, only the memory of it is lost (the slot is cleared then). */
static __always_inline void record_flow(const struct flow_key *fk, const struct flow_val *dec,
					const struct config *cfg, __u64 jiffies)
{
	struct flow_cache_slot *slot = flow_slot(fk);
	long rc = bpf_map_update_elem(&flows, fk, dec, BPF_ANY);

	if (!slot)
		return;
	if (rc == 0) {
		flow_slot_fill(slot, fk, dec, cfg->flow_epoch, jiffies);
		return;
	}
	/* Not recorded: this CPU's copy must not outlive the table's. */
	slot->key.saddr = 0;
	slot->epoch = ~0u;
	ready_clear(fk);
}

/*
 * steer encapsulates the packet (Ethernet + IPv4 at data) in an outer IPv4
 * header to dst and forwards it. Returns XDP_REDIRECT or XDP_TX when the
 * neighbour is known, XDP_PASS when the neighbour is unresolved (the stack
 * forwards the encapsulated packet and resolves it), RC_FAIL when the
 * packet cannot be forwarded and is unmodified (route or headroom failure,
 * counted), RC_FRAG (unmodified, *mtu set) when the encapsulated packet
 * exceeds the egress MTU, RC_DROP when it was modified but cannot be
 * completed.
 *
 * With the next-hop cache on, a packet whose backend's slot is valid goes
 * straight to the encapsulation: no route lookup, no clock read within a
 * tick (see struct nexthop), the MACs written from the slot. A packet
 * redirected that way also leaves its flow's ready headers for steer_fast,
 * when fslot (this CPU's flow cache slot) holds the flow fk (else NULL).
 * steer_main passes it for a flow cache hit only: a flow whose copy was
 * just filled gets its headers from its next packet, so packets of flows
 * that miss the flow cache every time (more flows in turn than slots) do
 * not pay for headers nobody would use.
 */
static __always_inline int steer(struct xdp_md *ctx, const struct config *cfg, __u64 jiffies,
				 __be32 dst, __u32 id, __u64 len, __u16 *mtu,
				 const struct flow_key *fk, struct flow_cache_slot *fslot)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct nexthop *nh = 0, *hop, tmp;
	struct iphdr *outer;
	__u16 inner_len;
	__be16 df, ipid;
	__u8 tos;
	long rc = BPF_FIB_LKUP_RET_SUCCESS;

	if ((void *)(ip + 1) > end)
		return RC_FAIL;
	inner_len = bpf_ntohs(ip->tot_len);
	if (inner_len > 0xffff - sizeof(struct iphdr)) {
		count(C_ERR_FRAG_NEEDED, len);
		return RC_FAIL;
	}
	tos = ip->tos;
	ipid = ip->id;
	df = ip->frag_off & bpf_htons(IP_DF);

	if (cfg->nh_ttl_ns) {
		/* bpf_map_lookup_elem (per-CPU array): NULL only for id >=
		 * MAX_BACKENDS. */
		nh = bpf_map_lookup_elem(&nexthops, &id);
		/* bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC_COARSE, never
		 * fails; read at most once per tick per slot. */
		if (nh && nh->dst == dst && nh->seen_jiffies != jiffies &&
		    nh->expires_ns > bpf_ktime_get_coarse_ns())
			nh->seen_jiffies = jiffies;
		if (nh && nh->dst == dst && nh->seen_jiffies == jiffies) {
			hop = nh;
			goto encap;
		}
	}
	rc = next_hop(ctx, cfg, dst, tos, inner_len, nh, jiffies, &tmp, mtu, len);
	if (rc < 0)
		return rc;
	hop = &tmp;

encap:
	if (inner_len + sizeof(struct iphdr) > hop->mtu) {
		count(C_ERR_FRAG_NEEDED, len);
		*mtu = hop->mtu;
		return RC_FRAG;
	}
	/* bpf_xdp_adjust_head: 0 on success, < 0 (packet untouched) when the
	 * headroom is too small. Invalidates every packet pointer. */
	if (bpf_xdp_adjust_head(ctx, -(int)sizeof(struct iphdr))) {
		count(C_ERR_HEADROOM, len);
		return RC_FAIL;
	}
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	outer = data + sizeof(*eth);
	if ((void *)(outer + 1) > end)
		return RC_DROP;

	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		__builtin_memcpy(eth->h_dest, hop->dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, hop->smac, ETH_ALEN);
	} else {
		/* Keep the frame addressed to us so the stack accepts it: the
		 * original Ethernet header now starts at data + 20, read
		 * before the outer header overwrites it. */
		__builtin_memcpy(eth->h_dest, data + sizeof(struct iphdr), ETH_ALEN);
		__builtin_memcpy(eth->h_source, data + sizeof(struct iphdr) + ETH_ALEN, ETH_ALEN);
	}
	eth->h_proto = bpf_htons(ETH_P_IP);

	outer->ver_ihl = 0x45;
	outer->tos = tos;
	outer->tot_len = bpf_htons(inner_len + sizeof(struct iphdr));
	outer->id = ipid;
	outer->frag_off = df;
	outer->ttl = OUTER_TTL;
	outer->protocol = IPPROTO_IPIP;
	outer->check = 0;
	outer->saddr = hop->src;
	outer->daddr = dst;
	/* The first four words vary per packet (version, tos, length, id,
	 * DF); csum_base holds the rest. */
	outer->check = csum16(outer, 4, hop->csum_base);

	count_backend(id, BE_STEERED, len);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		count(C_STEERED_STACK, len);
		return XDP_PASS;
	}
	if (hop->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	if (fslot && hop == nh)
		ready_fill(fk, fslot, nh, jiffies);
	/* bpf_redirect: XDP_REDIRECT on success, XDP_ABORTED on bad flags. */
	return bpf_redirect(hop->ifindex, 0);
}

/* Views of packet bytes: one load or store each. Each access is aligned to
 * its size as the verifier's strict mode counts it (the frame starting 2
 * bytes past an 8-byte boundary, NET_IP_ALIGN, so the IPv4 header is
 * aligned): the program loads on architectures without efficient unaligned
 * access too (TestLoad loads it with BPF_F_STRICT_ALIGNMENT). */
typedef __u64 __attribute__((may_alias)) pkt64;
typedef __u32 __attribute__((may_alias)) pkt32;
typedef __u16 __attribute__((may_alias)) pkt16;

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "steer_fast assembles header words in little-endian order"
#endif

/*
 * Profiling builds only: BenchmarkXDPStages compiles this file with
 * -DWARMPATH_BENCH_STOP=n so that steer_fast returns XDP_REDIRECT right
 * after stage n (1 parse, 2 ready slot, 3 epoch/tick/MTU checks,
 * 4 adjust_head, with the packet marked IPIP for the benchmark's undo,
 * 5 headers, 6 counter) and times each stage. make generate never sets it.
 */
#ifdef WARMPATH_BENCH_STOP
#define BENCH_STOP(n)                                    \
	do {                                             \
		if (WARMPATH_BENCH_STOP == (n))          \
			return XDP_REDIRECT;             \
	} while (0)
#else
#define BENCH_STOP(n) \
	do {          \
	} while (0)
#endif

/*
 * steer_fast is the path of a steered established packet whose flow has
 * ready headers in this CPU's ready slot (struct ready_slot): one array
 * lookup, then the encapsulation from the slot, the backend's
 * counter and the redirect. It returns XDP_REDIRECT (or XDP_DROP, counted,
 * for a packet it modified and cannot complete), or RC_FAIL with the packet
 * untouched for anything else, which steer_main then decides in full:
 * a SYN, IP options, a truncated or fragmented packet, a slot of another
 * flow, another epoch, headers from an earlier tick, a packet over the MTU,
 * no headroom. For the packets it takes the result is byte for byte and
 * counter for counter what steer_main does: the same checks of the
 * headers, the outer header built from the same fields (TOS, identification,
 * DF and length from the inner header), the same counter. It skips the
 * service-port filter steer_main applies first: headers are only built for
 * a flow steer_main steered, so past that filter, and SetServices moves the
 * epoch before it narrows the filter.
 */
static __always_inline int steer_fast(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	struct tcphdr *tcp = (void *)(ip + 1);
	struct ready_slot *slot;
	struct flow_key fk;
	struct config *cfg;
	__u64 w, o, sum, now;
	__u32 tot, doff, word2, key = 0;

	/* bpf_jiffies64: the tick counter (a load), never fails. Read first:
	 * to the compiler it is a call, which would spill what is live. */
	now = bpf_jiffies64();
	if ((void *)(tcp + 1) > end)
		return RC_FAIL;
	if (*(pkt16 *)(data + 12) != bpf_htons(ETH_P_IP))
		return RC_FAIL;
	/* Version and IHL, TOS, total length, identification, flags and
	 * fragment offset: the first eight bytes, in one load. */
	w = *(pkt64 *)ip;
	if ((__u8)w != 0x45 || ip->protocol != IPPROTO_TCP)
		return RC_FAIL;
	if ((__u16)(w >> 48) & bpf_htons(IP_MF | IP_OFFSET))
		return RC_FAIL;
	tot = bpf_ntohs((__u16)(w >> 16));
	doff = (tcp->doff_res >> 4) * 4;
	if ((void *)ip + tot > end || doff < sizeof(*tcp) || sizeof(*ip) + doff > tot)
		return RC_FAIL;
	if ((tcp->flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
		return RC_FAIL;
	BENCH_STOP(1);

	fk.saddr = ip->saddr;
	fk.daddr = ip->daddr;
	fk.sport = tcp->source;
	fk.dport = tcp->dest;
	slot = ready_slot_of(&fk);
	if (!slot)
		return RC_FAIL;
	if (slot->key.saddr != fk.saddr || slot->key.daddr != fk.daddr ||
	    *(pkt32 *)&slot->key.sport != *(pkt32 *)tcp)
		return RC_FAIL;
	BENCH_STOP(2);
	/* bpf_map_lookup_elem (array, index 0): never NULL. */
	cfg = bpf_map_lookup_elem(&settings, &key);
	if (!cfg || slot->epoch != cfg->flow_epoch || slot->tick != now)
		return RC_FAIL;
	if (tot + sizeof(struct iphdr) > slot->mtu)
		return RC_FAIL;
	BENCH_STOP(3);

	/* The outer header's first eight bytes: the inner's with the length
	 * grown by 20 and of the flags only DF kept. */
	o = (w & 0x0040ffff0000ffffull) | (__u64)bpf_htons(tot + sizeof(struct iphdr)) << 16;
	sum = slot->csum + (o & 0xffff) + (o >> 16 & 0xffff) + (o >> 32 & 0xffff) + (o >> 48);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	/* TTL, protocol, checksum: the outer header's bytes 8-11. */
	word2 = OUTER_TTL | IPPROTO_IPIP << 8 | (__u32)(__u16)~sum << 16;

	/* bpf_xdp_adjust_head: 0 on success, < 0 (packet untouched) when the
	 * headroom is too small. Invalidates every packet pointer. */
	if (bpf_xdp_adjust_head(ctx, -(int)sizeof(struct iphdr)))
		return RC_FAIL;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + ETH_HLEN + sizeof(struct iphdr) > end) {
		count(C_DROPPED, end - data - sizeof(struct iphdr));
		return XDP_DROP;
	}
#ifdef WARMPATH_BENCH_STOP
	if (WARMPATH_BENCH_STOP == 4) {
		*(__u8 *)(data + ETH_HLEN + 9) = IPPROTO_IPIP;
		return XDP_REDIRECT;
	}
#endif
	*(pkt16 *)data = slot->eth0;
	*(pkt32 *)(data + 2) = slot->eth1;
	*(pkt32 *)(data + 6) = slot->eth2;
	/* Source MAC bytes 4-5 and the EtherType. */
	*(pkt32 *)(data + 10) = slot->eth3 | (__u32)bpf_htons(ETH_P_IP) << 16;
	*(pkt64 *)(data + ETH_HLEN) = o;
	*(pkt32 *)(data + ETH_HLEN + 8) = word2;
	*(pkt32 *)(data + ETH_HLEN + 12) = slot->src;
	*(pkt32 *)(data + ETH_HLEN + 16) = slot->addr;
	BENCH_STOP(5);

	/* Counted as received: the frame before the outer header. */
	count_backend(slot->backend, BE_STEERED, end - data - sizeof(struct iphdr));
	BENCH_STOP(6);
	/* bpf_redirect: XDP_REDIRECT on success, XDP_ABORTED on bad flags. */
	return bpf_redirect(slot->ifindex, 0);
}

/* service_port reports whether some service listens on TCP port (network
 * order). An array lookup: inlined by the verifier, no hash. */
static __always_inline int service_port(__be16 port)
{
	__u32 p = bpf_ntohs(port), slot = p >> 6;
	/* bpf_map_lookup_elem (array): never NULL for slot < 1024. */
	__u64 *bits = bpf_map_lookup_elem(&svc_ports, &slot);

	return bits && (*bits >> (p & 63)) & 1;
}

/*
 * steer_main is the whole edge decision. Returns an XDP action. Every path
 * that does not steer leaves the packet untouched.
 *
 * Runs for what steer_fast did not take. Order: parse, then the
 * service-port filter (an array lookup). A non-SYN packet looks up this
 * CPU's flow cache (an array lookup), then the flow table, and on a hit
 * follows it without the services or affinity maps: a flow entry exists
 * only for a service (Go deletes a removed service's flows and voids the
 * caches). Everything else (SYNs, flow misses) checks the services map and
 * decides. A packet steered with a valid next-hop cache slot leaves its
 * flow's ready headers for steer_fast.
 */
static __always_inline int steer_main(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u64 len = end - data;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct tcphdr *tcp;
	struct svc_key sk = {};
	struct flow_key fk = {};
	struct flow_val dec = {}, *fv;
	struct flow_cache_slot *slot, *hit = 0;
	struct backend *be;
	struct config *cfg;
	__u32 ihl, doff, tot, id = 0, key = 0;
	__u64 jiffies;
	int syn, act, fresh = 0;
	__u16 mtu = 0;

	if ((void *)(eth + 1) > end)
		goto malformed;
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		count(C_PASS_NOT_IPV4, len);
		return XDP_PASS;
	}
	ip = (void *)(eth + 1);
	act = parse_ipv4_tcp(ip, end, &tcp, &ihl, &tot);
	if (act == RC_NOT_TCP) {
		count(C_PASS_NOT_SERVICE, len);
		return XDP_PASS;
	}
	if (act == RC_FRAGMENT) {
		count(C_PASS_FRAGMENT, len);
		return XDP_PASS;
	}
	if (act < 0)
		goto malformed;
	doff = (tcp->doff_res >> 4) * 4;
	if (doff < sizeof(*tcp) || ihl + doff > tot)
		goto malformed;
	if (!service_port(tcp->dest)) {
		count(C_PASS_NOT_SERVICE, len);
		return XDP_PASS;
	}
	/* bpf_map_lookup_elem (array, index 0): never NULL. */
	cfg = bpf_map_lookup_elem(&settings, &key);
	if (!cfg)
		return XDP_PASS;
	/* bpf_jiffies64: the tick counter, never fails. */
	jiffies = bpf_jiffies64();

	syn = (tcp->flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	fk.saddr = ip->saddr;
	fk.daddr = ip->daddr;
	fk.sport = tcp->source;
	fk.dport = tcp->dest;

	if (!syn) {
		slot = flow_slot(&fk);
		if (slot && slot->key.saddr == fk.saddr && slot->key.daddr == fk.daddr &&
		    slot->key.sport == fk.sport && slot->key.dport == fk.dport &&
		    slot->epoch == cfg->flow_epoch && jiffies - slot->filled < FLOW_CACHE_TICKS) {
			dec.addr = slot->addr;
			dec.backend = slot->backend;
			hit = slot;
			goto follow;
		}
		/* bpf_map_lookup_elem (LRU hash): the value, or NULL. */
		fv = bpf_map_lookup_elem(&flows, &fk);
		if (fv) {
			dec = *fv;
			if (slot)
				flow_slot_fill(slot, &fk, &dec, cfg->flow_epoch, jiffies);
			goto follow;
		}
	}

	sk.vip = ip->daddr;
	sk.port = tcp->dest;
	sk.proto = IPPROTO_TCP;
	if (!bpf_map_lookup_elem(&services, &sk)) {
		count(C_PASS_NOT_SERVICE, len);
		return XDP_PASS;
	}

	fv = 0;
	if (syn) {
		fv = bpf_map_lookup_elem(&flows, &fk);
		if (fv) {
			dec = *fv;
			/* A retransmitted SYN follows its decision unless its
			 * backend went away; then the connection is decided
			 * again. */
			if (dec.backend != BACKEND_LOCAL) {
				be = usable_backend(dec.backend);
				if (!be || be->addr != dec.addr)
					fv = 0;
			}
		}
	}
	if (!fv) {
		be = affinity_pick(ip->saddr, &sk, &id, len);
		if (syn) {
			if (be) {
				struct counter *c = count_backend(id, BE_SYN, len);

				if (c && be->sample_every && c->packets % be->sample_every == 0) {
					count_backend(id, BE_SAMPLED, len);
					count(C_SAMPLED, len);
					be = 0;
				}
			}
			count(be ? C_FLOW_NEW_STEER : C_FLOW_NEW_LOCAL, len);
		} else if (be) {
			count(C_FLOW_RESTORED, len);
		}
		if (be) {
			dec.addr = be->addr;
			dec.backend = id;
		} else {
			dec.addr = 0;
			dec.backend = BACKEND_LOCAL;
		}
		record_flow(&fk, &dec, cfg, jiffies);
		fresh = 1;
		if (!syn && !be) {
			count(C_PASS_NO_STATE, len);
			return XDP_PASS;
		}
	}

follow:
	if (dec.backend == BACKEND_LOCAL) {
		count(C_PASS_LOCAL, len);
		return XDP_PASS;
	}

	act = steer(ctx, cfg, jiffies, dec.addr, dec.backend, len, &mtu, &fk, hit);
	if (act >= 0)
		return act;
	if ((act == RC_FAIL || act == RC_FRAG) && fresh && syn) {
		/* A new connection that cannot reach its backend starts local. */
		dec.addr = 0;
		dec.backend = BACKEND_LOCAL;
		record_flow(&fk, &dec, cfg, jiffies);
		count(C_PASS_LOCAL, len);
		return XDP_PASS;
	}
	/* Too big: tell the client the path MTU (as a router would), so TCP
	 * sends smaller segments instead of blackholing. */
	if (act == RC_FRAG) {
		int r = frag_needed_reply(ctx, mtu);

		if (r == 0) {
			count(C_ICMP_FRAG_NEEDED, len);
			return XDP_TX;
		}
		if (r == RC_DROP) {
			count(C_DROPPED, len);
			return XDP_DROP;
		}
	}
	/* An established steered flow must not reach the local stack (it would
	 * be reset): drop, TCP retransmits once the route is back. */
	count(C_DROPPED, len);
	return XDP_DROP;

malformed:
	count(C_ERR_MALFORMED, len);
	return XDP_PASS;
}

SEC("xdp")
int xdp_steer(struct xdp_md *ctx)
{
	int act = steer_fast(ctx);

	if (act >= 0)
		return act;
	return steer_main(ctx);
}

/*
 * xdp_decap strips the outer IPv4 header of an IPIP packet whose inner
 * packet is TCP to a service (and, if configured, whose outer source is the
 * edge), then passes the inner packet to the stack. Anything else is passed
 * untouched.
 */
SEC("xdp")
int xdp_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u64 len = end - data;
	struct ethhdr saved, *eth = data;
	struct iphdr *outer, *ip;
	struct tcphdr *tcp;
	struct svc_key sk = {};
	struct config *cfg;
	__u32 key = 0, ihl, tot;
	int rc;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		goto pass;
	outer = (void *)(eth + 1);
	if ((void *)(outer + 1) > end)
		goto pass;
	if (outer->ver_ihl != 0x45 || outer->protocol != IPPROTO_IPIP)
		goto pass;
	if (outer->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		goto pass;
	cfg = bpf_map_lookup_elem(&settings, &key);
	if (cfg && cfg->decap_src && cfg->decap_src != outer->saddr)
		goto pass;

	ip = (void *)(outer + 1);
	rc = parse_ipv4_tcp(ip, end, &tcp, &ihl, &tot);
	if (rc == RC_MALFORMED)
		goto malformed;
	if (rc)
		goto pass; /* RC_NOT_TCP, RC_FRAGMENT */
	sk.vip = ip->daddr;
	sk.port = tcp->dest;
	sk.proto = IPPROTO_TCP;
	if (!bpf_map_lookup_elem(&services, &sk))
		goto pass;

	saved = *eth;
	/* bpf_xdp_adjust_head: 0 on success, < 0 with the packet untouched. */
	if (bpf_xdp_adjust_head(ctx, (int)sizeof(struct iphdr))) {
		count(C_DECAP_ERR_HEADROOM, len);
		return XDP_PASS;
	}
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	*eth = saved;
	count(C_DECAP_OK, len);
	return XDP_PASS;

malformed:
	count(C_DECAP_MALFORMED, len);
	return XDP_PASS;
pass:
	count(C_DECAP_PASS, len);
	return XDP_PASS;
}

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
