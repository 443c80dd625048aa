package affinity

// ReplacePeerLoads makes ups's PeerKindLoad updates the whole load of the
// peer in slot peer: every replica's value for that peer is set to what ups
// says, and to zero for a replica ups does not name, under one write lock
// (a Decide sees the old loads or the new ones, never a mix). It is for a
// transport's periodic full-load message (a heartbeat), which heals any
// lost or reordered PeerKindLoad, a replica the peer removed while busy and
// a peer's restart. Other kinds in ups are ignored: apply them with
// ApplyPeer. Updates for unknown replicas are skipped.
func (r *Router) ReplacePeerLoads(peer int, ups []PeerUpdate) error {
	if peer < 0 || peer >= MaxPeers {
		return ErrPeerSlot
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.reps {
		if p != nil {
			p.setPeerLoad(peer, PeerLoad{})
		}
	}
	for i := range ups {
		u := &ups[i]
		if u.Kind != PeerKindLoad {
			continue
		}
		if p := r.rep(u.Replica); p != nil {
			p.setPeerLoad(peer, u.Load)
		}
	}
	return nil
}
