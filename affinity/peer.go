package affinity

import (
	"errors"
	"fmt"
)

// Scale-out: several Routers (one per warmpath instance, or one per router
// in the cluster simulator) share what each learns, so that affinity does
// not decay as instances are added. This file is the pure half: what a
// Router tells its peers (PeerSink) and how it applies theirs (ApplyPeer,
// ImportIndex). The transport (NATS in slowpath/cluster, a delay queue in
// bench/sim) lives elsewhere.
//
// What is shared, and why it stays correct when messages are late, lost or
// repeated:
//
//   - Index inserts (Begin): the chain of block hashes a request sent to a
//     replica. Applying one is a touch of each block, deepest first, so the
//     prefix property holds and a repeat only refreshes recency.
//   - Truncations (End of a request that failed before its first token):
//     the speculative insert is undone on every router. A truncation that
//     arrives before its insert removes nothing (blocks not held are
//     skipped); the late insert then claims blocks the engine does not hold,
//     which the receiving router's own End corrects like any misprediction.
//   - Cache resets (ResetCache: the engine restarted).
//   - Finished tails (End of a successful request, for sinks that also
//     implement PeerTailSink): the deepest block of the request's prompt on
//     its replica, so every router gives the next turn of that chat the
//     continuation credit (the engine also cached the answer), whichever
//     instance the next turn lands on. Lossy like the local table.
//   - Load: the sender's absolute router-local load per replica (requests
//     in flight, uncached prefill tokens and requests awaiting their first
//     token), not deltas, so a lost message is healed by the next and a
//     repeat changes nothing. A receiver adds its peers' latest values to
//     its own counters in every Load and cost estimate; ClearPeer withdraws
//     a peer that went quiet (the transport decides when: its staleness
//     bound). A Router's own counters stay authoritative for its own
//     requests: peers never change them, and MaxInFlight limits stay local.
//
// Not shared: the prefill-rate fit and continuation credit (each router
// measures its own), misprediction capacity (an engine that cached less
// than predicted has re-cached the whole prompt by the time End runs, so
// the chain is right again; only the sender's capacity estimate learns).

// PeerSink receives what a Router learns, for its peers. Methods are called
// with the Router's lock held (read or write), concurrently from request
// goroutines: they must be safe for concurrent use, must not block, must
// not call the Router, and must copy slices they keep. Two PeerLoad calls
// for one replica from concurrent requests may arrive in either order, so
// the latest call can carry a value one change old: a transport should
// resend LocalLoads now and then (a heartbeat) to heal that.
type PeerSink interface {
	// PeerInsert: hashes (a chain from its first block) were inserted for
	// replica id when a request was sent there.
	PeerInsert(id ReplicaID, hashes []uint64)
	// PeerTruncate: up to n blocks of replica id, walking back from block
	// tail, were removed (a failed request's speculative insert undone).
	PeerTruncate(id ReplicaID, tail uint64, n int)
	// PeerReset: replica id's cache was wiped (ResetCache).
	PeerReset(id ReplicaID)
	// PeerLoad: replica id's router-local load changed; l is its new value.
	PeerLoad(id ReplicaID, l PeerLoad)
}

// PeerTailSink is optionally implemented by a PeerSink: PeerTail(id, tail)
// reports that a request whose prompt's deepest block was tail finished
// successfully on replica id (see Router.ContinuationCredit).
type PeerTailSink interface {
	PeerTail(id ReplicaID, tail uint64)
}

// PeerLoad is one router's local load on one replica (absolute values).
type PeerLoad struct {
	InFlight             int32 // requests in flight
	PendingPrefillTokens int32 // uncached prompt tokens routed, first token not seen
	PendingRequests      int32 // requests routed, first token not seen
}

// PeerKind says what a PeerUpdate carries.
type PeerKind uint8

// Peer update kinds.
const (
	PeerKindInsert   PeerKind = iota + 1 // Hashes
	PeerKindTruncate                     // Tail, N
	PeerKindReset                        // nothing else
	PeerKindLoad                         // Load
	PeerKindTail                         // Tail: a finished request's deepest block
)

func (k PeerKind) String() string {
	switch k {
	case PeerKindInsert:
		return "insert"
	case PeerKindTruncate:
		return "truncate"
	case PeerKindReset:
		return "reset"
	case PeerKindLoad:
		return "load"
	case PeerKindTail:
		return "tail"
	}
	return fmt.Sprintf("PeerKind(%d)", uint8(k))
}

// PeerUpdate is one update from a peer, with the replica already resolved
// to this Router's ID (peers name replicas; IDs are local).
type PeerUpdate struct {
	Kind    PeerKind
	Replica ReplicaID
	Hashes  []uint64 // PeerKindInsert: the chain, first block first
	Tail    uint64   // PeerKindTruncate, PeerKindTail
	N       int      // PeerKindTruncate
	Load    PeerLoad // PeerKindLoad
}

// MaxPeers bounds the peer slots a Router keeps load for.
const MaxPeers = 256

// ErrPeerSlot: a peer slot outside [0, MaxPeers).
var ErrPeerSlot = errors.New("peer slot out of range")

// SetPeerSink makes s receive this Router's updates (nil: none). Set it
// before traffic; it is read without synchronization on the hot path.
func (r *Router) SetPeerSink(s PeerSink) {
	r.mu.Lock()
	r.sink = s
	r.tailSink, _ = s.(PeerTailSink)
	r.mu.Unlock()
}

// ApplyPeer applies a batch of updates from the peer in slot peer (the
// caller maps peer instances to slots in [0, MaxPeers)). Updates for unknown
// replicas are skipped. Applied updates are not echoed to this Router's
// PeerSink. It takes the write lock once for the whole batch.
func (r *Router) ApplyPeer(peer int, ups []PeerUpdate) error {
	if peer < 0 || peer >= MaxPeers {
		return ErrPeerSlot
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range ups {
		u := &ups[i]
		p := r.rep(u.Replica)
		if p == nil {
			continue
		}
		switch u.Kind {
		case PeerKindInsert:
			hs := u.Hashes
			if len(hs) > p.capEff {
				hs = hs[:p.capEff]
			}
			r.idx.insert(u.Replica, hs)
		case PeerKindTruncate:
			r.idx.rollback(u.Replica, u.Tail, u.N)
		case PeerKindReset:
			r.idx.dropReplica(u.Replica)
		case PeerKindLoad:
			p.setPeerLoad(peer, u.Load)
		case PeerKindTail:
			if u.Tail != 0 {
				k := tailKey(u.Tail, u.Replica)
				r.tails[k%tailSlots].Store(k)
				r.noteTurn(u.Tail, u.Replica)
			}
		}
	}
	return nil
}

// ClearPeer withdraws every load value of the peer in slot peer (it went
// quiet or left). Its index inserts stay: they describe the engines, not
// the peer, and age out by LRU like any other.
func (r *Router) ClearPeer(peer int) {
	if peer < 0 || peer >= MaxPeers {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.reps {
		if p != nil {
			p.setPeerLoad(peer, PeerLoad{})
		}
	}
}

// setPeerLoad replaces peer's contribution to p's peer sums. Called with
// r.mu held for writing.
func (p *replica) setPeerLoad(peer int, l PeerLoad) {
	if peer >= len(p.peers) {
		if l == (PeerLoad{}) {
			return
		}
		p.peers = append(p.peers, make([]PeerLoad, peer+1-len(p.peers))...)
	}
	old := p.peers[peer]
	p.peers[peer] = l
	p.peerInFlight.Add(int64(l.InFlight) - int64(old.InFlight))
	p.peerPending.Add(int64(l.PendingPrefillTokens) - int64(old.PendingPrefillTokens))
	p.peerPendingReqs.Add(int64(l.PendingRequests) - int64(old.PendingRequests))
}

// localLoad is p's router-local load, as a PeerSink sees it.
func (p *replica) localLoad() PeerLoad {
	return PeerLoad{
		InFlight:             int32(p.inFlight.Load()),
		PendingPrefillTokens: int32(min(p.pending.Load(), 1<<31-1)),
		PendingRequests:      int32(p.pendingReqs.Load()),
	}
}

// LocalLoads calls fn with this router's own load on every replica (what
// PeerLoad reports), under the read lock: for a transport's periodic
// refresh. fn must not call the Router.
func (r *Router) LocalLoads(fn func(id ReplicaID, name string, l PeerLoad)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, p := range r.reps {
		if p != nil {
			fn(p.id, p.spec.Name, p.localLoad())
		}
	}
}

// Totals over this router and its peers, as policies see them.
func (p *repHot) totalInFlight() int64    { return p.inFlight.Load() + p.peerInFlight.Load() }
func (p *repHot) totalPending() int64     { return p.pending.Load() + p.peerPending.Load() }
func (p *repHot) totalPendingReqs() int64 { return p.pendingReqs.Load() + p.peerPendingReqs.Load() }

// ExportIndex walks the index for a snapshot (a peer warming up): for each
// replica, up to maxBlocks of its most recently used blocks, least recent
// first, as parallel hash and parent slices (valid during the call only).
// Cutting a replica's LRU list keeps its most recent blocks, and a block
// is never older than its chain's deeper blocks, so the snapshot keeps the
// prefix property. It holds the read lock during the walk.
func (r *Router) ExportIndex(maxBlocks int, fn func(replica string, hashes, parents []uint64)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var hs, ps []uint64
	for _, p := range r.reps {
		if p == nil || int(p.id) >= len(r.idx.lru) {
			continue
		}
		hs, ps = hs[:0], ps[:0]
		for ni := r.idx.lru[p.id].head; ni >= 0 && len(hs) < maxBlocks; ni = r.idx.nodes[ni].next {
			b := &r.idx.recs[r.idx.nodes[ni].blk]
			hs = append(hs, b.hash)
			ps = append(ps, b.parent)
		}
		if len(hs) == 0 {
			continue
		}
		for i, j := 0, len(hs)-1; i < j; i, j = i+1, j-1 {
			hs[i], hs[j] = hs[j], hs[i]
			ps[i], ps[j] = ps[j], ps[i]
		}
		fn(p.spec.Name, hs, ps)
	}
}

// ImportIndex adds a snapshot's blocks for replica id (as ExportIndex gave
// them: least recent first), each becoming the replica's most recent, so
// the snapshot's order is kept. Blocks beyond the replica's capacity evict
// its least recent ones. Not echoed to the PeerSink.
func (r *Router) ImportIndex(id ReplicaID, hashes, parents []uint64) error {
	if len(hashes) != len(parents) {
		return fmt.Errorf("import index: %d hashes, %d parents", len(hashes), len(parents))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rep(id) == nil {
		return fmt.Errorf("import index: replica %d: unknown", id)
	}
	x := r.idx
	x.ensure(id)
	l := &x.lru[id]
	for i, h := range hashes {
		if h == 0 {
			continue
		}
		x.touch(id, h, parents[i])
		for l.n > l.cap {
			x.remove(l.tail)
			x.evictions++
		}
	}
	return nil
}
