package sim

import (
	"container/heap"
	"slices"
	"time"

	"github.com/warmpath/warmpath/affinity"
)

// Scale-out: Config.Routers router instances over the same engines, and,
// with Config.Sync, the peer updates they share (affinity.PeerSink ->
// affinity.Router.ApplyPeer) carried by a delay queue in virtual time: the
// simulator's stand-in for the NATS transport of slowpath/cluster.
//
// Modelled: which router sees which request (uniform, seeded: ECMP by
// connection), each router's own index, load and policy state, finished
// tails (continuation credit), and a fixed
// propagation delay per update. Not modelled: message loss or reordering,
// clock skew between instances, the staleness bound that withdraws a quiet
// peer's load (ClearPeer), and batching other than as extra delay.

// instance is one router of the fleet.
type instance struct {
	router *affinity.Router
	st     *simState // the baselines' router-local state (not shared)
	out    *outbox   // its PeerSink with Sync, else nil
}

// outbox is a router's PeerSink: it collects the updates of one router
// call (Begin, FirstToken or End), which cluster.post then sends. Called
// with the router's lock held; it copies hashes and never calls back.
type outbox struct{ ups []affinity.PeerUpdate }

func (o *outbox) PeerInsert(id affinity.ReplicaID, hashes []uint64) {
	o.ups = append(o.ups, affinity.PeerUpdate{Kind: affinity.PeerKindInsert, Replica: id, Hashes: slices.Clone(hashes)})
}

func (o *outbox) PeerTruncate(id affinity.ReplicaID, tail uint64, n int) {
	o.ups = append(o.ups, affinity.PeerUpdate{Kind: affinity.PeerKindTruncate, Replica: id, Tail: tail, N: n})
}

func (o *outbox) PeerReset(id affinity.ReplicaID) {
	o.ups = append(o.ups, affinity.PeerUpdate{Kind: affinity.PeerKindReset, Replica: id})
}

// PeerTail: a finished request's deepest block (continuation credit on
// every router, affinity.PeerTailSink).
func (o *outbox) PeerTail(id affinity.ReplicaID, tail uint64) {
	o.ups = append(o.ups, affinity.PeerUpdate{Kind: affinity.PeerKindTail, Replica: id, Tail: tail})
}

// PeerLoad coalesces: loads are absolute, so only a replica's latest value
// in a message matters.
func (o *outbox) PeerLoad(id affinity.ReplicaID, l affinity.PeerLoad) {
	for i := range o.ups {
		if u := &o.ups[i]; u.Kind == affinity.PeerKindLoad && u.Replica == id {
			u.Load = l
			return
		}
	}
	o.ups = append(o.ups, affinity.PeerUpdate{Kind: affinity.PeerKindLoad, Replica: id, Load: l})
}

// message is one router call's updates on their way to every other router.
type message struct {
	at   int64  // delivery time: sent + SyncDelay
	seq  uint64 // send order, for equal delivery times
	from int
	ups  []affinity.PeerUpdate
}

type mailHeap []message

func (h mailHeap) Len() int { return len(h) }
func (h mailHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].seq < h[j].seq)
}
func (h mailHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mailHeap) Push(x any)   { *h = append(*h, x.(message)) }
func (h *mailHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = message{}
	*h = old[:len(old)-1]
	return x
}

// post sends what router k's sink collected during a call made at now.
func (c *cluster) post(k int, now int64) {
	o := c.routers[k].out
	if o == nil || len(o.ups) == 0 {
		return
	}
	c.mailSeq++
	heap.Push(&c.mail, message{at: now + int64(c.cfg.SyncDelay), seq: c.mailSeq, from: k, ups: o.ups})
	o.ups = nil
}

// deliver applies the earliest message to every router but its sender, in
// the sender's peer slot (its index: every router has every other's).
func (c *cluster) deliver() {
	m := heap.Pop(&c.mail).(message)
	start := time.Now()
	for j := range c.routers {
		if j == m.from {
			continue
		}
		// ApplyPeer only fails on a slot out of range; Run bounds Routers
		_ = c.routers[j].router.ApplyPeer(m.from, m.ups)
		c.res.PeerUpdates += len(m.ups)
	}
	c.res.ApplyNanos += time.Since(start).Nanoseconds()
	c.res.PeerMessages++
}
