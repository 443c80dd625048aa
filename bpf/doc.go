// Package bpf holds warmpath's eBPF C programs and their bpf2go-generated Go
// bindings (warmpath_bpfel.go, warmpath_bpfel.o).
//
// Programs (all XDP, in warmpath.c):
//   - xdp_steer: edge host. Services (VIP:port/TCP) are decided per
//     connection on the SYN: a valid affinity entry steers the connection to
//     its GPU host in IPIP, anything else goes LOCAL (XDP_PASS to the
//     slowpath). The decision is kept in an LRU flow table.
//   - xdp_decap: GPU host. Strips the outer header of IPIP packets for a
//     service and passes the inner packet.
//   - xdp_pass: returns XDP_PASS; the dummy program for a veth peer in
//     tests (a native redirect into a veth needs one on the peer).
//
// Only package fastpath imports this package. The generated files are
// committed so `go build` needs no clang; `make generate` rebuilds them with
// the pinned clang-14 and CI fails on any difference.
//
// Lifecycle hazard: the C structs are the map ABI. Maps are pinned by name,
// so changing a key or value layout makes a restarted warmpath fail to adopt
// the pinned maps (ErrMapIncompatible) until they are removed
// (`warmpath --detach`).
package bpf

//go:generate sh gen.sh
