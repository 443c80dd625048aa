package slowpath

import (
	"slices"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/tenant"
)

// The prefill guard (tenants.queue.headroom). A work-conserving queue
// gives every slot to a flooding tenant, so another tenant's request
// waits for a slot to free and then shares the engine's batch steps with
// the flood's prefills. While two or more tenants are active on a model,
// the guard holds a tenant at or over its equal share of the model's
// slots back from starting a request (tenant.MayStart) where another
// tenant's request waits for its first token, and from taking the last
// headroom free slots on replicas where no such prefill runs. Other
// tenants' requests rank those clean replicas first. A replica's prefill
// is "running" from the attempt until the first token the router relays
// (a non-streamed request: until its predicted TTFT), which is what the
// router sees of the engine's prefill.

// arrived marks ex's tenant active on its model.
func (q *fairQueue) arrived(ex *exchange) {
	now := q.s.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	m := q.active[string(ex.model)]
	if m == nil {
		m = make(map[string]int64)
		q.active[string(ex.model)] = m
	}
	m[ex.ten.name] = now
}

// activeLocked counts the tenants active on model: arrived within
// tenants.queue.active_window, or with requests queued or running.
// Tenants no longer active are forgotten.
func (q *fairQueue) activeLocked(model string, now int64) int {
	n := 0
	sc := q.byModel[model]
	for t, last := range q.active[model] {
		if now-last < int64(q.cfg.ActiveWindow) || q.running[model][t] > 0 || (sc != nil && sc.QueuedAll(t) > 0) {
			n++
			continue
		}
		delete(q.active[model], t)
	}
	return n
}

// loadsLocked fills q.reps and q.loads with model's healthy replicas as
// tenant t sees them, and returns their slots; ok false when the guard
// does not apply (a replica without a cap, or none).
func (q *fairQueue) loadsLocked(model, t string, now int64) (slots int, ok bool) {
	q.reps, q.loads = q.reps[:0], q.loads[:0]
	mb := []byte(model)
	for _, r := range *q.s.table.Load() {
		if r == nil || r.removed.Load() || !r.isHealthy() || !r.serves(mb) {
			continue
		}
		c := r.maxInFlight()
		if c <= 0 {
			return 0, false
		}
		l := tenant.ReplicaLoad{Free: max(int(c-r.inFlight()), 0)}
		for _, p := range q.pending[r] {
			if p.ten.pendUntil != 0 && now >= p.ten.pendUntil {
				continue // a non-streamed request past its predicted TTFT
			}
			l.Heavy = l.Heavy || p.ten.heavy
			l.Others = l.Others || p.ten.name != t
		}
		slots += int(c)
		q.reps = append(q.reps, r)
		q.loads = append(q.loads, l)
	}
	return slots, len(q.reps) > 0
}

// overLocked reports whether the guard holds tenant t back on model: its
// demand is over its equal share and another active tenant is lighter
// (tenant.Lighter); placing: the request being placed is not queued. If
// so it returns the free slots t must leave (tenant.Need).
func (q *fairQueue) overLocked(model, t string, slots int, now int64, placing bool) (over bool, need int) {
	sc := q.byModel[model]
	demandOf := func(x string) int {
		d := q.running[model][x]
		if sc != nil {
			d += sc.QueuedAll(x)
		}
		return d
	}
	demand, running := demandOf(t), q.running[model][t]
	if placing {
		demand++
	}
	if !tenant.OverShare(demand, slots, q.activeLocked(model, now)) {
		return false, 0
	}
	lightest := true
	for o := range q.active[model] { // the active tenants (activeLocked pruned the rest)
		if o != t && tenant.Lighter(q.running[model][o], demandOf(o), running, demand) {
			lightest = false
			break
		}
	}
	if lightest {
		return false, 0
	}
	others := 0
	for o, n := range q.running[model] {
		if o != t {
			others += n
		}
	}
	return true, tenant.Need(q.cfg.Headroom, others, q.cfg.HeadroomMin)
}

// guardEligibleLocked reports whether a queued request of tenant t may be
// handed a turn (may): a replica has a free slot, and one it may start on
// when t is over its share (over).
func (q *fairQueue) guardEligibleLocked(model, t string, now int64) (may, over bool) {
	slots, ok := q.loadsLocked(model, t, now)
	if !ok {
		return true, false
	}
	over, need := q.overLocked(model, t, slots, now, false)
	for j, l := range q.loads {
		if over && tenant.MayStart(q.loads, j, need) || !over && l.Free > 0 {
			return true, over
		}
	}
	return false, over
}

// ahead reports whether ex may skip the queue of its model: the prefill
// guard is on, its tenant is within its share (not over it with ex
// placed), has nothing queued itself, and every tenant with requests
// queued in its class or a higher one is over its share. The flood's
// queued work then does not delay a quiet tenant's request by a turn of
// the queue (a wake-up per slot event); it still needs a slot where it
// may start (place), else it queues.
func (q *fairQueue) ahead(ex *exchange) bool {
	if q.cfg.Headroom <= 0 {
		return false
	}
	now := q.s.now()
	m, t := string(ex.model), ex.ten.name
	q.mu.Lock()
	defer q.mu.Unlock()
	sc := q.byModel[m]
	if sc == nil {
		return true
	}
	slots, ok := q.loadsLocked(m, t, now)
	if !ok {
		return false
	}
	if over, _ := q.overLocked(m, t, slots, now, true); over {
		return false
	}
	return !sc.AnyQueued(ex.ten.class, func(o string) bool {
		if o == t {
			return true
		}
		over, _ := q.overLocked(m, o, slots, now, false)
		return !over
	})
}

// place applies the guard to ex's ranking (after Decide): a tenant over
// its share keeps the replicas it may start on (false: none, it waits);
// any other tenant's ranking puts the replicas with a free slot and no
// heavy prefill first, in their order.
func (q *fairQueue) place(ex *exchange) bool {
	if q.cfg.Headroom <= 0 {
		return true
	}
	if ex.ten.held != nil {
		q.unhold(ex) // placed before, its slot unused: placed anew
	}
	now := q.s.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	m, t := string(ex.model), ex.ten.name
	slots, ok := q.loadsLocked(m, t, now)
	ex.ten.heavy = false
	if !ok {
		return true
	}
	over, need := q.overLocked(m, t, slots, now, true)
	ex.ten.heavy = over
	d := &ex.dec
	table := *q.s.table.Load()
	index := func(id affinity.ReplicaID) int {
		if int(id) < 0 || int(id) >= len(table) {
			return -1
		}
		for j, r := range q.reps {
			if r == table[id] {
				return j
			}
		}
		return -1
	}
	q.rk, q.ct = q.rk[:0], q.ct[:0]
	add := func(i int) {
		q.rk = append(q.rk, d.Ranked[i])
		if i < len(d.CachedTokens) {
			q.ct = append(q.ct, d.CachedTokens[i])
		}
	}
	if over {
		for i, id := range d.Ranked {
			if j := index(id); j >= 0 && tenant.MayStart(q.loads, j, need) {
				add(i)
			}
		}
	} else {
		clean := func(id affinity.ReplicaID) bool {
			j := index(id)
			return j >= 0 && q.loads[j].Free > 0 && !q.loads[j].Heavy
		}
		for i, id := range d.Ranked {
			if clean(id) {
				add(i)
			}
		}
		for i, id := range d.Ranked {
			if !clean(id) {
				add(i)
			}
		}
	}
	d.Ranked = append(d.Ranked[:0], q.rk...)
	if len(q.ct) == len(q.rk) {
		d.CachedTokens = append(d.CachedTokens[:0], q.ct...)
	} else {
		d.CachedTokens = d.CachedTokens[:0] // forward reads it only where present
	}
	// The slot is taken here, under the queue's lock, in the count the
	// guard reads (affinity's in-flight, TryBegin): the next request
	// placed sees it taken, this one's prefill pending and its tenant's
	// running count up. Taken at the attempt instead, two requests placed
	// at once would see the same free slots and the flood fill the
	// headroom.
	for i, id := range d.Ranked {
		j := index(id)
		if j < 0 || !ex.beginFlight(q.reps[j], false) {
			continue
		}
		ex.ten.held = q.reps[j]
		q.pendLocked(ex, q.reps[j], now)
		if !ex.ten.dispatched {
			q.dispatchedLocked(ex) // its tenant's running count, in the same step
		}
		if i > 0 { // forward's first attempt is the held replica
			copy(d.Ranked[1:i+1], d.Ranked[:i])
			d.Ranked[0] = id
			if i < len(d.CachedTokens) {
				c := d.CachedTokens[i]
				copy(d.CachedTokens[1:i+1], d.CachedTokens[:i])
				d.CachedTokens[0] = c
			}
		}
		return true
	}
	return false // no slot free where it may start: it waits its turn
}

// unhold gives back the slot place took for ex, unused by an attempt:
// its flight ends as failed before its first token (affinity rolls back
// its speculative index entries), the replica's slot and the guard's
// pending entry go, and the next queued request gets its turn.
func (q *fairQueue) unhold(ex *exchange) {
	r := ex.ten.held
	if r == nil {
		return
	}
	ex.ten.held = nil
	ex.endFlight(q.s.now(), affinity.Outcome{CachedTokens: -1})
	r.release()
	q.mu.Lock()
	q.unpendLocked(ex)
	q.mu.Unlock()
	q.s.freed.signal() // kicks the queue too
}

// pendLocked records ex as waiting for its first token on r.
func (q *fairQueue) pendLocked(ex *exchange, r *replica, now int64) {
	q.unpendLocked(ex)
	ex.ten.pendOn, ex.ten.pendUntil = r, 0
	if !ex.prompt.Stream {
		ex.ten.pendUntil = now + max(int64(ex.flight.PredictedTTFT()*1e9), 1)
	}
	q.pending[r] = append(q.pending[r], ex)
}

// guardStarted records that ex's attempt on r waits for its first token,
// and hands the next queued request its turn (the guard's state changed;
// no release would come for it).
func (s *Server) guardStarted(ex *exchange, r *replica) {
	q := s.fq
	if q == nil || q.cfg.Headroom <= 0 {
		return
	}
	now := s.now()
	q.mu.Lock()
	q.pendLocked(ex, r, now)
	q.mu.Unlock()
	q.kick()
}

// prefilled ends ex's wait for its first token (it came, or the exchange
// ended) and hands the next queued request its turn.
func (q *fairQueue) prefilled(ex *exchange) {
	q.mu.Lock()
	q.unpendLocked(ex)
	q.mu.Unlock()
	q.kick()
}

func (q *fairQueue) unpendLocked(ex *exchange) {
	r := ex.ten.pendOn
	if r == nil {
		return
	}
	ex.ten.pendOn = nil
	l := q.pending[r]
	if i := slices.Index(l, ex); i >= 0 {
		l = slices.Delete(l, i, i+1)
	}
	if len(l) == 0 {
		delete(q.pending, r)
	} else {
		q.pending[r] = l
	}
}
