package tenant

// ReplicaLoad is one replica's state as the prefill guard sees it: what
// a tenant over its share may start there without slowing another
// tenant's first token.
type ReplicaLoad struct {
	// Free is the replica's free slots (its cap less its requests in
	// flight).
	Free int
	// Heavy: a request of a tenant over its share (OverShare) is waiting for its
	// first token there (a prefill that would share the engine's batch
	// steps with a newcomer's).
	Heavy bool
	// Others: a request of another tenant than the one asking is waiting
	// for its first token there.
	Others bool
}

// OverShare reports whether a tenant whose demand (requests running plus
// queued, the one being placed included) exceeds its equal share of a
// model's slots while active tenants (at least two) use the model: the
// tenant the prefill guard holds back, whatever it holds right now (a
// flood that the guard keeps below its share stays the flood). A tenant
// alone is never over its share.
func OverShare(demand, slots, active int) bool {
	if active < 2 || slots <= 0 {
		return false
	}
	return demand > max(slots/active, 1)
}

// Lighter reports whether a tenant running running requests with demand
// (running plus queued) uses the model less than one running than with
// thanDemand: fewer running, or as many and less demand. The guard never
// holds back the lightest active tenant, so a quiet tenant that fell
// behind (its demand above its share after a burst) is not throttled as
// if it were the flood, and two tenants never hold each other back.
func Lighter(running, demand, thanRunning, thanDemand int) bool {
	return running < thanRunning || running == thanRunning && demand < thanDemand
}

// Need is the free slots a tenant over its share must leave on clean
// replicas when other tenants hold others of the model's slots: headroom
// counts their slots too (they are the others' share in use), down to
// least free slots (and never fewer than one) for their next requests,
// however many they run: least > 1 lets a burst of theirs find slots at
// once (tenants.queue.headroom_min).
func Need(headroom, others, least int) int {
	return max(headroom-others, least, 1)
}

// MayStart reports whether a tenant over its share may start a request on
// replica i of loads (the model's replicas), keeping need free slots
// where no such tenant's prefill runs, so another tenant's next request
// finds a slot at once on a replica whose batch steps carry no long
// prefill:
//
//   - never where another tenant's request waits for its first token (its
//     prefill would share the batch step with the newcomer's), nor where
//     a request of a tenant over its share does (one long prefill at a
//     time per replica: a replica is clean again after one prefill, not
//     after a pile of them);
//   - with two or more replicas, only when the other replicas without a
//     heavy prefill keep need free slots between them (replica i gets
//     one: it is no longer a clean place for others);
//   - with one replica, only when the replica keeps need free slots.
func MayStart(loads []ReplicaLoad, i, need int) bool {
	r := loads[i]
	if r.Free < 1 || r.Others || r.Heavy {
		return false
	}
	if len(loads) == 1 {
		return r.Free-1 >= need
	}
	open := 0
	for j, o := range loads {
		if j != i && !o.Heavy {
			open += o.Free
		}
	}
	return open >= need
}
