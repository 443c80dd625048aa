package tenant

// Item is one queued request in a Scheduler. Set Tenant, Class and Cost
// before Push; V is the caller's.
type Item[T any] struct {
	V      T
	Tenant string
	Class  int   // 0 is served first
	Cost   int64 // estimated tokens (at least 1 is charged)
	f      *flow[T]
}

// Queued reports whether it is in a scheduler.
func (it *Item[T]) Queued() bool { return it.f != nil }

type flow[T any] struct {
	tenant   string
	items    []*Item[T]
	deficit  int64
	credited bool // got its quantum this turn
	inRing   bool
}

type class[T any] struct {
	flows map[string]*flow[T]
	ring  []*flow[T] // flows with items, in round-robin order; ring[0] is served
	n     int
}

// Scheduler orders queued requests: strict priority between classes (a
// lower class number first), and within a class deficit round-robin
// between tenants on each request's estimated tokens (Shreedhar and
// Varghese): each turn a tenant's deficit grows by the quantum and it is
// served while its head request's cost fits, so every tenant with queued
// requests gets the same share of tokens however many it queues. Not safe
// for concurrent use.
type Scheduler[T any] struct {
	quantum int64
	maxLen  int
	classes []class[T]
}

// NewScheduler returns a scheduler with classes priority classes, a DRR
// quantum in tokens and a bound of maxLen queued requests per class.
func NewScheduler[T any](classes int, quantum int64, maxLen int) *Scheduler[T] {
	s := &Scheduler[T]{quantum: max(quantum, 1), maxLen: max(maxLen, 1), classes: make([]class[T], classes)}
	for i := range s.classes {
		s.classes[i].flows = make(map[string]*flow[T])
	}
	return s
}

// Len returns the requests queued in class c.
func (s *Scheduler[T]) Len(c int) int { return s.classes[c].n }

// Total returns the requests queued in every class.
func (s *Scheduler[T]) Total() int {
	n := 0
	for i := range s.classes {
		n += s.classes[i].n
	}
	return n
}

// Queued returns tenant's requests queued in class c.
func (s *Scheduler[T]) Queued(c int, tenant string) int {
	if f := s.classes[c].flows[tenant]; f != nil {
		return len(f.items)
	}
	return 0
}

// QueuedAll returns tenant's requests queued in every class.
func (s *Scheduler[T]) QueuedAll(tenant string) int {
	n := 0
	for c := range s.classes {
		n += s.Queued(c, tenant)
	}
	return n
}

// AnyQueued reports whether a tenant with requests queued in class upTo
// or a higher one (a lower number) satisfies pred.
func (s *Scheduler[T]) AnyQueued(upTo int, pred func(tenant string) bool) bool {
	for c := 0; c <= upTo && c < len(s.classes); c++ {
		for _, f := range s.classes[c].ring {
			if pred(f.tenant) {
				return true
			}
		}
	}
	return false
}

// Push queues it. When its class is full, the tenant with the most queued
// requests gives up its newest one (evicted, to be shed) if it has at
// least two more than it's tenant; otherwise it is refused (ok false):
// it's tenant holds as much of the queue as anyone.
func (s *Scheduler[T]) Push(it *Item[T]) (evicted *Item[T], ok bool) {
	c := &s.classes[it.Class]
	if c.n >= s.maxLen {
		var big *flow[T]
		for _, f := range c.ring {
			if big == nil || len(f.items) > len(big.items) {
				big = f
			}
		}
		mine := 0
		if f := c.flows[it.Tenant]; f != nil {
			mine = len(f.items)
		}
		if big == nil || len(big.items) < mine+2 {
			return nil, false
		}
		evicted = big.items[len(big.items)-1]
		s.Remove(evicted)
	}
	f := s.flowOf(c, it.Tenant)
	f.items = append(f.items, it)
	it.f = f
	c.n++
	if !f.inRing {
		f.inRing = true
		c.ring = append(c.ring, f)
	}
	return evicted, true
}

func (s *Scheduler[T]) flowOf(c *class[T], tenant string) *flow[T] {
	f := c.flows[tenant]
	if f == nil {
		f = &flow[T]{tenant: tenant}
		c.flows[tenant] = f
	}
	return f
}

// Pop takes the next request: from the highest class with any, the DRR
// choice within it. nil when nothing is queued.
func (s *Scheduler[T]) Pop() *Item[T] { return s.PopEligible(nil) }

// PopEligible is Pop among the tenants eligible reports true for (nil:
// all): an ineligible tenant (at its share of the capacity) is passed
// over without earning its quantum, and keeps its place. nil when no
// eligible tenant has anything queued.
func (s *Scheduler[T]) PopEligible(eligible func(tenant string) bool) *Item[T] {
	for ci := range s.classes {
		c := &s.classes[ci]
		if c.n == 0 {
			continue
		}
		if eligible != nil {
			k := 0
			for k < len(c.ring) && !eligible(c.ring[k].tenant) {
				k++
			}
			if k == len(c.ring) {
				continue // nobody in this class may go
			}
			if k > 0 {
				// The first eligible tenant takes the turn; those passed
				// over keep their order behind it.
				f := c.ring[k]
				copy(c.ring[1:k+1], c.ring[:k])
				c.ring[0] = f
			}
		}
		for {
			f := c.ring[0]
			if eligible != nil && !eligible(f.tenant) {
				f.credited = false
				copy(c.ring, c.ring[1:])
				c.ring[len(c.ring)-1] = f
				continue
			}
			if !f.credited {
				f.deficit += s.quantum
				f.credited = true
			}
			it := f.items[0]
			if cost := max(it.Cost, 1); f.deficit >= cost {
				f.deficit -= cost
				s.take(c, f, 0)
				return it
			}
			// Turn over: the next tenant.
			f.credited = false
			copy(c.ring, c.ring[1:])
			c.ring[len(c.ring)-1] = f
		}
	}
	return nil
}

// take removes f.items[i]; an emptied flow leaves the ring and its
// deficit resets (DRR: an idle tenant banks nothing).
func (s *Scheduler[T]) take(c *class[T], f *flow[T], i int) {
	it := f.items[i]
	f.items = append(f.items[:i], f.items[i+1:]...)
	it.f = nil
	c.n--
	if len(f.items) > 0 {
		return
	}
	f.deficit, f.credited, f.inRing = 0, false, false
	for k, g := range c.ring {
		if g == f {
			c.ring = append(c.ring[:k], c.ring[k+1:]...)
			break
		}
	}
	delete(c.flows, f.tenant)
}

// Remove takes it out of the queue (its deadline passed, its client left);
// false when it was not queued.
func (s *Scheduler[T]) Remove(it *Item[T]) bool {
	f := it.f
	if f == nil {
		return false
	}
	c := &s.classes[it.Class]
	for i, x := range f.items {
		if x == it {
			s.take(c, f, i)
			return true
		}
	}
	return false
}

// Requeue puts back a popped request that could not be served after all
// (the capacity it was popped for was gone): at the head of its tenant's
// queue, its cost refunded, its tenant served first in its class. It may
// exceed the class bound by one.
func (s *Scheduler[T]) Requeue(it *Item[T]) {
	c := &s.classes[it.Class]
	f := s.flowOf(c, it.Tenant)
	f.items = append(f.items, nil)
	copy(f.items[1:], f.items)
	f.items[0] = it
	it.f = f
	c.n++
	f.deficit += max(it.Cost, 1)
	if !f.inRing {
		f.inRing, f.credited = true, true
		c.ring = append(c.ring, nil)
		copy(c.ring[1:], c.ring)
		c.ring[0] = f
	}
}
