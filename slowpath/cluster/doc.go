// Package cluster makes several warmpath instances act as one router: each
// instance's Node publishes what its affinity.Router learns (index inserts,
// truncations, cache resets, its absolute load per replica, fast-path
// affinity entries) to NATS in compact binary batches and applies its
// peers' batches to its own Router. A starting instance warms its index up
// from its peers' snapshots. See docs/cluster.md for the design and
// README.md here for configuration, metrics and numbers.
//
// What it owns: the NATS connection, the pending batch (filled by the
// Router's PeerSink calls on request goroutines), a flusher goroutine
// (flush, full-load heartbeat, warm-up), a peer-expiry goroutine, the
// subscriptions' handlers and the wire format (codec.go).
//
// Lifecycle hazards:
//   - Start becomes the Router's PeerSink; Close removes it, publishes a
//     last batch flagged leave, stops the flusher, closes the connection
//     and withdraws every peer's load (a batch handler still running
//     applies nothing after that). On a stalled connection Close waits at
//     most about one write timeout (2 heartbeats, at least 250ms); while
//     a connection attempt hangs, at most its timeout (2s). The
//     slowpath.Server does both when cluster.nats_url is set.
//   - Nothing on the request path waits on NATS: the sink only appends under
//     a short mutex and drops (counted) when NATS is down or the batch is
//     full. Start itself does not wait for the connection: every attempt,
//     the first included, runs in nats.go's reconnect goroutine, forever
//     (rejected credentials included).
//   - PeerSink methods run with the Router's lock held: the node never calls
//     the Router from them. Replica IDs in the pending batch are named when
//     the batch is flushed (Router.ReplicaNames), so a replica removed and
//     its ID reused within one flush interval may mislabel that interval's
//     records: a misprediction the receiver's own End corrects.
//   - Staleness (max_age) compares the sender's wall clock with the
//     receiver's: instances must be NTP-synced.
//   - The EntryFunc set with SetEntryHandler runs on a NATS subscription
//     goroutine; it must not block for long.
package cluster
