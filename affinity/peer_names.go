package affinity

// ReplicaNames appends to dst[:0] every replica's name indexed by its
// ReplicaID ("" for a free slot) and returns it. The transport of
// scale-out (slowpath/cluster) calls it when it flushes a batch, outside
// the PeerSink (whose methods run with the Router's lock held), to name the
// replicas its records refer to. No allocation once dst is large enough.
func (r *Router) ReplicaNames(dst []string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	dst = dst[:0]
	for _, p := range r.reps {
		if p == nil {
			dst = append(dst, "")
			continue
		}
		dst = append(dst, p.spec.Name)
	}
	return dst
}
