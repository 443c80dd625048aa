package slowpath

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/tenant"
)

// fairQueue holds the requests that found every replica for their model
// at its in-flight cap (tenants.queue). Each model has its own
// tenant.Scheduler; every freed replica slot (the gate's signal) pops one
// waiter per model with any queued, which then retries the routing
// decision; a waiter that still finds no room goes back to the head.
type fairQueue struct {
	s      *Server
	cfg    FairQueueConfig
	queued atomic.Int64 // requests queued over all models: kick's fast path
	kicks  atomic.Int64 // kicks so far (poll kicks only when there was none)

	mu      sync.Mutex
	byModel map[string]*tenant.Scheduler[*waiter]
	lens    []int                     // queued per class over all models
	running map[string]map[string]int // model -> tenant -> dispatched from here (reserve, headroom)
	granted map[string]int            // model -> turns given whose waiters have not taken them (waiter.granted)

	// The prefill guard (tenants.queue.headroom; guard.go).
	active  map[string]map[string]int64 // model -> tenant -> last arrival
	pending map[*replica][]*exchange    // requests waiting for their first token
	reps    []*replica                  // scratch: the model's replicas,
	loads   []tenant.ReplicaLoad        // and their loads
	rk      []affinity.ReplicaID        // scratch: a reordered ranking
	ct      []int
}

// waiter is one queued request.
type waiter struct {
	it    tenant.Item[*waiter]
	ch    chan struct{} // one token: popped (granted) or shed
	shed  atomic.Bool   // evicted for a tenant over its share
	model string
	// granted: popped by kick and its token not yet taken (q.mu): the
	// turn is outstanding (fairQueue.granted).
	granted bool
}

// queuePoll: when no slot was released for this long while requests are
// queued, the queue is kicked anyway, so capacity that frees without a
// release here (a replica's cap raised by a reload, a replica
// re-admitted) is found. Under load releases kick it and the poll adds no
// competing grant.
const queuePoll = 250 * time.Millisecond

func newFairQueue(s *Server, cfg FairQueueConfig) *fairQueue {
	q := &fairQueue{s: s, cfg: cfg, byModel: make(map[string]*tenant.Scheduler[*waiter]), lens: make([]int, len(tenant.Classes)),
		running: make(map[string]map[string]int), granted: make(map[string]int), active: make(map[string]map[string]int64), pending: make(map[*replica][]*exchange)}
	s.wg.Add(1)
	go q.poll()
	return q
}

func (q *fairQueue) poll() {
	defer q.s.wg.Done()
	t := time.NewTicker(queuePoll)
	defer t.Stop()
	last := int64(-1)
	for {
		select {
		case <-q.s.closing:
			return
		case <-t.C:
			if k := q.kicks.Load(); k == last {
				q.kick()
			} else {
				last = k
			}
		}
	}
}

// busy reports whether requests for model are queued (a newcomer then
// queues behind them instead of taking a freed slot first).
func (q *fairQueue) busy(model []byte) bool {
	if q.queued.Load() == 0 {
		return false
	}
	q.mu.Lock()
	sc := q.byModel[string(model)]
	q.mu.Unlock()
	return sc != nil && sc.Total() > 0
}

// length returns the requests queued in class over all models.
func (q *fairQueue) length(class int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lens[class]
}

func (q *fairQueue) setLen(class, d int) {
	q.lens[class] += d
	q.s.tm.queueLen.WithLabelValues(tenant.Classes[class]).Set(float64(q.lens[class]))
	q.queued.Add(int64(d))
}

// push queues ex; ok false when its class is full (and it is not owed a
// place: see tenant.Scheduler.Push). An evicted waiter is told.
func newWaiter(ex *exchange) *waiter {
	w := &waiter{ch: make(chan struct{}, 1), model: string(ex.model)}
	w.it = tenant.Item[*waiter]{V: w, Tenant: ex.ten.name, Class: ex.ten.class, Cost: max(ex.ten.est, 1)}
	return w
}

func (q *fairQueue) push(ex *exchange) (*waiter, bool) {
	w := newWaiter(ex)
	q.mu.Lock()
	defer q.mu.Unlock()
	sc := q.byModel[w.model]
	if sc == nil {
		sc = tenant.NewScheduler[*waiter](len(tenant.Classes), int64(q.cfg.Quantum), q.cfg.MaxLength)
		q.byModel[w.model] = sc
	}
	ev, ok := sc.Push(&w.it)
	if !ok {
		return nil, false
	}
	q.setLen(w.it.Class, 1)
	if ev != nil {
		q.setLen(ev.Class, -1)
		ev.V.shed.Store(true)
		ev.V.ch <- struct{}{}
	}
	return w, true
}

// kick pops the next waiter of every model with any queued (a slot
// freed somewhere).
func (q *fairQueue) kick() {
	if q.queued.Load() == 0 {
		return
	}
	q.kicks.Add(1)
	q.mu.Lock()
	defer q.mu.Unlock()
	for m, sc := range q.byModel {
		if sc.Total() == 0 {
			delete(q.byModel, m)
			continue
		}
		if _, free := q.s.modelCaps(m); free >= 0 && q.granted[m] >= free {
			// Every free slot has a turn outstanding: another grant would
			// let a later waiter take the slot before an earlier one whose
			// goroutine has not run yet, serving them out of order.
			continue
		}
		var eligible func(string) bool
		reserve := 0
		if q.cfg.Reserve > 0 {
			if slots := q.s.modelSlots(m); slots > 0 {
				reserve = slots - q.cfg.Reserve
			}
		}
		var it *tenant.Item[*waiter]
		if reserve > 0 || q.cfg.Headroom > 0 {
			now := q.s.now()
			eligible = func(t string) bool {
				if reserve > 0 && q.running[m][t] >= reserve {
					return false
				}
				if q.cfg.Headroom <= 0 {
					return true
				}
				may, _ := q.guardEligibleLocked(m, t, now)
				return may
			}
			if q.cfg.Headroom > 0 {
				// The prefill guard: a tenant within its share first, so
				// a quiet tenant's queued request takes the next slot
				// ahead of the flood's queued work.
				it = sc.PopEligible(func(t string) bool {
					may, over := q.guardEligibleLocked(m, t, now)
					return may && !over && (reserve <= 0 || q.running[m][t] < reserve)
				})
			}
		}
		if it == nil {
			it = sc.PopEligible(eligible)
		}
		if it == nil {
			continue
		}
		q.setLen(it.Class, -1)
		it.V.granted = true
		q.granted[m]++
		select {
		case it.V.ch <- struct{}{}:
		default:
		}
	}
}

// atShare reports whether ex's tenant holds its most of the model's
// slots (tenants.queue.reserve): it then waits its turn in the queue.
func (q *fairQueue) atShare(ex *exchange) bool {
	if q.cfg.Reserve <= 0 {
		return false
	}
	slots := q.s.modelSlots(string(ex.model))
	if slots <= 0 {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running[string(ex.model)][ex.ten.name] >= slots-q.cfg.Reserve
}

// dispatched counts ex as running for its tenant (reserve, headroom).
func (q *fairQueue) dispatched(ex *exchange) {
	if (q.cfg.Reserve <= 0 && q.cfg.Headroom <= 0) || ex.ten.dispatched {
		return
	}
	q.mu.Lock()
	q.dispatchedLocked(ex)
	q.mu.Unlock()
}

func (q *fairQueue) dispatchedLocked(ex *exchange) {
	ex.ten.dispatched = true
	m := q.running[string(ex.model)]
	if m == nil {
		m = make(map[string]int)
		q.running[string(ex.model)] = m
	}
	m[ex.ten.name]++
}

// finished undoes dispatched and lets the next eligible request go.
func (q *fairQueue) finished(ex *exchange) {
	ex.ten.dispatched = false
	q.mu.Lock()
	m := q.running[string(ex.model)]
	if m[ex.ten.name]--; m[ex.ten.name] <= 0 {
		delete(m, ex.ten.name)
	}
	q.mu.Unlock()
	q.kick()
}

// taken ends w's outstanding turn, if it has one (its token was taken).
func (q *fairQueue) taken(w *waiter) {
	q.mu.Lock()
	if w.granted {
		w.granted = false
		if q.granted[w.model]--; q.granted[w.model] <= 0 {
			delete(q.granted, w.model)
		}
	}
	q.mu.Unlock()
}

// modelCaps is the sum of the caps of model's healthy replicas (slots)
// and how many more requests they take before them, this router's in
// flight counted (free); 0 and -1 when one of them has no cap (unlimited).
func (s *Server) modelCaps(model string) (slots, free int) {
	mb := []byte(model)
	for _, r := range *s.table.Load() {
		if r == nil || !r.isHealthy() || !r.serves(mb) {
			continue
		}
		l := r.maxInFlight()
		if l <= 0 {
			return 0, -1
		}
		slots += int(l)
		free += int(max(l-r.inFlight(), 0))
	}
	return slots, free
}

// modelSlots is modelCaps' slots.
func (s *Server) modelSlots(model string) int {
	slots, _ := s.modelCaps(model)
	return slots
}

// requeue puts a popped waiter that found no room back at its head.
func (q *fairQueue) requeue(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sc := q.byModel[w.model]
	if sc == nil {
		sc = tenant.NewScheduler[*waiter](len(tenant.Classes), int64(q.cfg.Quantum), q.cfg.MaxLength)
		q.byModel[w.model] = sc
	}
	sc.Requeue(&w.it)
	q.setLen(w.it.Class, 1)
}

// remove takes a waiter out (its deadline passed); false when it was
// popped or shed meanwhile (its token is in ch).
func (q *fairQueue) remove(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	sc := q.byModel[w.model]
	if sc == nil || !sc.Remove(&w.it) {
		return false
	}
	q.setLen(w.it.Class, -1)
	return true
}

// decideFair is decide with the fair queue: a request that finds every
// replica for its model at its cap, or others of its model queued,
// waits its turn up to tenants.queue.timeout.
func (s *Server) decideFair(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	q := s.fq
	class := tenant.Classes[ex.ten.class]
	deadline := ex.start + int64(q.cfg.Timeout)
	var w *waiter
	var enq int64
	shed := func(status int, reason, msg, typ, code string) bool {
		s.tm.shed.WithLabelValues(class, ex.ten.name, reason).Inc()
		s.reject(ctx, apiError{status, "queue_" + reason, typ, code}, msg, "")
		return false
	}
	if q.cfg.Headroom > 0 {
		q.arrived(ex)
	}
	// The tenant queue orders requests by its own rules: no slot holds
	// beside it (routing.slot_hold).
	ex.req.NoHold = true
	for {
		if (w != nil || !q.busy(ex.model) || q.ahead(ex)) && !q.atShare(ex) {
			err := ex.decide()
			if err == nil && len(ex.dec.Ranked) > 0 {
				if q.place(ex) {
					if w != nil {
						s.tm.queueWait.WithLabelValues(class).Observe(seconds(ex.decided - enq))
					}
					q.dispatched(ex)
					return true
				}
				// Held back by the prefill guard: it waits its turn.
			} else if full := err == nil || errors.Is(err, affinity.ErrNoReplica); !full || !s.anyFull(ex.model) {
				s.rejectUndecided(ctx, ex, err, full)
				return false
			}
			if w != nil && s.now() >= deadline {
				return shed(fasthttp.StatusServiceUnavailable, "timeout", "The request waited the router's queue timeout for a replica of model `"+string(ex.model)+"`; retry later.", errTypeUnavailable, "queue_timeout")
			}
		}
		if w == nil && ex.ten.front {
			// Its turn came but the slot went to another request between
			// the decision and forward: back at the head, not the tail.
			ex.ten.front = false
			w, enq = newWaiter(ex), s.now()
			q.requeue(w)
		} else if w == nil {
			var ok bool
			if w, ok = q.push(ex); !ok {
				return shed(fasthttp.StatusTooManyRequests, "queue_full", "The router's queue for priority class `"+class+"` is full; retry later.", errTypeRateLimit, "rate_limit_exceeded")
			}
			enq = s.now()
			if q.cfg.Reserve > 0 || q.cfg.Headroom > 0 {
				q.kick() // a reserved slot may be free: no release would come for it
			}
		} else {
			q.requeue(w)
		}
		switch q.wait(ctx, w, deadline) {
		case waitShed:
			return shed(fasthttp.StatusTooManyRequests, "tenant_share", "Tenant `"+ex.ten.name+"` is over its share of the router's queue for priority class `"+class+"`; retry later.", errTypeRateLimit, "rate_limit_exceeded")
		case waitTimeout:
			return shed(fasthttp.StatusServiceUnavailable, "timeout", "The request waited the router's queue timeout for a replica of model `"+string(ex.model)+"`; retry later.", errTypeUnavailable, "queue_timeout")
		case waitGone:
			shed(statusClientClosed, "client_gone", "Client closed the request.", errTypeInvalid, "")
			ctx.SetConnectionClose()
			return false
		}
	}
}

// wait outcomes.
const (
	waitTurn    = iota // popped: try the decision again
	waitShed           // evicted for its tenant's share
	waitTimeout        // the deadline passed while queued
	waitGone           // the client left while queued
)

// queueClientCheck is how often a queued request's client is checked
// (a client that left gives up its place instead of reaching an engine).
const queueClientCheck = 100 * time.Millisecond

// wait blocks a queued waiter until its turn, its eviction, the deadline
// (on the router's clock) or its client leaving.
func (q *fairQueue) wait(ctx *fasthttp.RequestCtx, w *waiter, deadline int64) int {
	t := time.NewTimer(time.Duration(max(deadline-q.s.now(), 0)))
	defer t.Stop()
	tick := time.NewTicker(queueClientCheck)
	defer tick.Stop()
	for {
		select {
		case <-w.ch:
			if w.shed.Load() {
				return waitShed
			}
			q.taken(w)
			return waitTurn
		case <-t.C:
			if q.remove(w) {
				return waitTimeout
			}
			<-w.ch // popped or shed meanwhile: its token
			if w.shed.Load() {
				return waitShed
			}
			q.taken(w)
			return waitTurn
		case <-tick.C:
			if !clientGone(ctx.Conn()) {
				continue
			}
			if !q.remove(w) {
				<-w.ch
				if !w.shed.Load() {
					q.taken(w)
					q.kick() // the turn it was given goes to the next
				}
			}
			return waitGone
		}
	}
}
