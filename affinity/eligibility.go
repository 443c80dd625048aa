package affinity

// Eligibility and load of one replica, for callers that route to a replica
// they chose (a pinned or fixed target) or report on it. The Router owns
// them: SetHealthy, SetDraining and the spec's MaxInFlight over the
// requests between Begin and End. Decide ranks only eligible replicas;
// TryBegin takes a slot under the limit.

// Healthy reports whether replica id is known and marked healthy.
func (r *Router) Healthy(id ReplicaID) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.rep(id)
	return p != nil && p.healthy.Load()
}

// Eligible reports whether Decide may rank replica id: known, healthy, not
// draining and below its MaxInFlight.
func (r *Router) Eligible(id ReplicaID) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.rep(id)
	return p != nil && p.eligible()
}

// AtLimit reports whether replica id has its MaxInFlight of this router's
// requests in flight (false for an unknown id or no limit).
func (r *Router) AtLimit(id ReplicaID) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.rep(id)
	return p != nil && p.atLimit()
}

// InFlight is the number of this router's requests in flight on replica id
// (begun, not ended); 0 for an unknown id.
func (r *Router) InFlight(id ReplicaID) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p := r.rep(id); p != nil {
		return int(p.inFlight.Load())
	}
	return 0
}

// MaxInFlight is replica id's limit on this router's requests in flight
// (ReplicaSpec.MaxInFlight); 0 for no limit or an unknown id.
func (r *Router) MaxInFlight(id ReplicaID) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p := r.rep(id); p != nil {
		return int(p.maxInFlight)
	}
	return 0
}
