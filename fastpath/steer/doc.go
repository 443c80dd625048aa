// Package steer is the fast path's control loop: it turns the promotion
// rule (affinity.Promoter) into affinity entries in the XDP datapath
// (fastpath.Datapath). It imports only affinity and fastpath; the slowpath
// reaches it through Source and Routed, adapted in cmd/warmpath.
//
//   - ObserveRouted (called from the slowpath's Observer) feeds every
//     proxied request to Promoter.Observe and writes (promote, move) or deletes (drop) the
//     client's entry, for every configured VIP, with its backend's current
//     generation. A promoted client's requests that still reach the slowpath
//     are the datapath's sampled connections (every SampleEvery-th SYN):
//     each re-validates the entry and stands for SampleEvery requests in the
//     demand estimate, unless it arrived on a connection opened before the
//     promotion.
//   - Sync (every Options.Interval from Run) maps replicas to GPU hosts
//     (backends; ids never reused within a process), writes health and
//     bumps the generation of a host that became unhealthy or was removed,
//     so its entries stop steering at once; then it reads every entry from
//     the datapath, merges the datapath's idle time with the Promoter's
//     view, and applies Promoter.Rebalance (idle, ineligible, saturated)
//     with loads from the router plus per-backend steered-connection and
//     observed-request deltas.
//
// Lifecycle hazards:
//   - New adopts the backends already in the datapath (pinned by a previous
//     process) by host address, keeping ids and generations, so entries a
//     previous process wrote keep steering; entries it cannot map to a
//     current replica are dropped as ineligible at the first Sync.
//   - The client key is ClientKey(addr) (IPv4 only; IPv6 clients are never
//     promoted, the datapath steers IPv4 only).
//   - Controller does not own the Datapath: the caller Closes it.
package steer
