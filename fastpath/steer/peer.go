package steer

import (
	"net/netip"

	"github.com/warmpath/warmpath/affinity"
)

// EntryHook is told about the affinity entries this controller writes
// (add: client steered to replica) or drops because the promotion rule
// said so (!add; replica is NoReplica). A scale-out node publishes them to
// the other edge hosts (slowpath/cluster). It runs on the request
// goroutine and must not block.
type EntryHook func(client netip.Addr, replica affinity.ReplicaID, add bool)

// SetEntryHook sets (nil: clears) the hook. Entries applied with
// ApplyPeerEntry and rebalancing's deletions (local load, idleness and
// health: each host decides those itself) are not reported.
func (c *Controller) SetEntryHook(h EntryHook) {
	if h == nil {
		c.onEntry.Store(nil)
		return
	}
	c.onEntry.Store(&h)
}

func (c *Controller) share(a netip.Addr, r affinity.ReplicaID, add bool) {
	if h := c.onEntry.Load(); h != nil {
		(*h)(a, r, add)
	}
}

// ApplyPeerEntry writes (add) or deletes another edge host's affinity entry
// for client into this host's datapath: replica is this host's ID of the
// replica the peer steers to. A replica with no usable backend here
// (unhealthy, saturated, no fast-path host) deletes the client's entry
// instead, so no stale pin outlives the peer's move. Nothing is reported
// back to the EntryHook (no echo), and the entry then lives by this host's
// rebalancing like any adopted entry.
func (c *Controller) ApplyPeerEntry(client netip.Addr, replica affinity.ReplicaID, add bool) {
	a := client.Unmap()
	if !a.Is4() {
		return
	}
	if add && c.write(a, replica) {
		return
	}
	c.delete(a)
}
