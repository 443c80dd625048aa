// Package bpf holds warmpath's eBPF C programs and their bpf2go-generated Go
// bindings (warmpath_bpfel.go, warmpath_bpfel.o).
//
// Programs (all XDP, in warmpath.c):
//   - xdp_steer: edge host. Services (VIP:port/TCP) are decided per
//     connection on the SYN: a valid affinity entry steers the connection to
//     its GPU host in IPIP, anything else goes LOCAL (XDP_PASS to the
//     slowpath). The decision is kept in an LRU flow table. Established
//     steered packets whose flow was steered in the current tick take
//     steer_fast: the flow's ready headers in a per-CPU array, one lookup.
//   - xdp_decap: GPU host. Strips the outer header of IPIP packets for a
//     service and passes the inner packet.
//   - xdp_pass: returns XDP_PASS; the dummy program for a veth peer in
//     tests (a native redirect into a veth needs one on the peer).
//
// Only package fastpath imports this package. The generated files are
// committed so `go build` needs no clang; `make generate` rebuilds them with
// the pinned clang-14 and CI fails on any difference.
//
// Minimum kernel: Linux 5.11, for bpf_ktime_get_coarse_ns, the newest
// helper the programs call (the others: bpf_jiffies64 5.5, bpf_fib_lookup
// and bpf_xdp_adjust_tail 4.18; XDP bpf_links 5.9; -mcpu=v3 5.1). Leaving
// the encap source to the route (BPF_FIB_LOOKUP_SRC) needs 6.8. The docs
// (docs/fastpath.md, docs/deploy.md) point here; fastpath.Probe checks every helper at
// start-up, so an older kernel selects userspace mode in auto mode.
//
// Conventions in warmpath.c, written at its top: every helper states its
// return contract above it; helpers return an XDP verdict (>= 0), or a
// success value >= 0 or a negative enum rc; packets are parsed by one
// helper (parse_ipv4_tcp) and checksummed by one (csum16), except in
// steer_fast, the established steered packet's path, which checks the same
// fields with wider loads and sums the outer header's four varying words in
// registers (FuzzSteerReady holds it to the full path's bytes). Counter indices
// are the C enums counter_idx and backend_counter_slot, generated into Go
// by bpf2go (-type, WarmpathCounterIdx, WarmpathBackendCounterSlot).
//
// Lifecycle hazard: the C structs are the map ABI. Maps are pinned by name,
// so changing a key or value layout makes a restarted warmpath fail to adopt
// the pinned maps (ErrMapIncompatible) until they are removed
// (`warmpath detach`).
package bpf

//go:generate sh gen.sh
