// Package fastpath owns warmpath's kernel plane: it loads the XDP programs
// of package bpf, attaches them, pins their maps and links, and exposes the
// small Datapath API that the slowpath and the control loop use to say
// which services exist, which GPU hosts (backends) are healthy, and which
// clients have an affinity to which backend.
//
// Implementations:
//   - Kernel (Linux, root): xdp_steer on the edge's client-facing
//     interface. New connections (SYN) of a client with a valid affinity
//     are encapsulated in IPIP and sent to the backend; all others reach the
//     local slowpath. The decision is kept per connection in an LRU table.
//   - Userspace: the fallback when BPF is unavailable. It steers nothing but
//     keeps the same state with the same semantics, so status, metrics and
//     callers behave alike.
//   - Decap (Linux, root): xdp_decap on a GPU host.
//
// Open picks the implementation: ModeAuto probes the kernel once
// (Probe; injectable via Options.Probe) and falls back to userspace with a
// single log line naming the reason; ModeKernel makes any failure an error.
// The kernel datapath comes wrapped in a Fallback: lost mid-run (program
// detached, interface gone, operations failing; found by Check), it turns
// into a userspace datapath with one ERROR line instead of failing. A gone
// program is released (only this process's own pins); a failing one is
// left attached and drained, so established steered flows keep flowing.
//
// Lifecycle hazards:
//   - State is pinned under Options.PinPath (default /sys/fs/bpf/warmpath)
//     and outlives the process on purpose: Close keeps the program attached
//     and steered flows flowing while warmpath restarts; the next Open adopts
//     the maps and atomically swaps the program in the pinned link. Only
//     Detach removes the program and the state.
//   - The pinned maps are an ABI: a version whose map layouts differ cannot
//     adopt them (ErrMapIncompatible); Uninstall(pinPath) first (it loads
//     nothing, so it works across versions).
//   - Affinity idle times use CLOCK_MONOTONIC (the program writes it with
//     bpf_ktime_get_coarse_ns: at most a tick behind). ExpireIdle
//     may race with a program refresh; the loser is a connection that goes
//     to the slowpath once.
//   - Only this package imports bpf and cilium/ebpf/link.
package fastpath
