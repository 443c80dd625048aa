package slowpath

import (
	"sync"
	"sync/atomic"
	"time"
)

// gate wakes requests queued for capacity (limits.on_limit: queue). Waiters
// register with wait, which returns a channel closed by the next signal;
// signal is one atomic load when nobody waits.
type gate struct {
	waiters atomic.Int32
	mu      sync.Mutex
	ch      chan struct{}
	// onSignal, if set before serving, is called on every signal (the
	// fair queue's kick: a slot freed).
	onSignal func()
}

func (g *gate) wait() chan struct{} {
	g.waiters.Add(1)
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	c := g.ch
	g.mu.Unlock()
	return c
}

// done unregisters a waiter that will not sleep.
func (g *gate) done() { g.waiters.Add(-1) }

// sleep waits for c or the deadline and unregisters; false on deadline.
func (g *gate) sleep(c chan struct{}, deadline time.Time) bool {
	defer g.done()
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c:
		return true
	case <-t.C:
		return false
	}
}

func (g *gate) signal() {
	if g.onSignal != nil {
		g.onSignal()
	}
	if g.waiters.Load() == 0 {
		return
	}
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}
