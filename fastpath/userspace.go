package fastpath

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"
)

type affKey struct {
	client netip.Addr
	svc    Service
}

type affVal struct {
	backend  BackendID
	gen      uint32
	lastUsed int64
}

// Userspace is the fallback Datapath: it steers nothing (every connection
// reaches the slowpath) but keeps services, backends and affinity entries
// with the kernel's semantics, so status, metrics and the control loop
// behave the same. Its counters stay zero: it sees no packets.
type Userspace struct {
	mu       sync.Mutex
	now      func() int64
	services map[Service]struct{}
	backends map[BackendID]Backend
	aff      map[affKey]affVal
	closed   bool
}

// NewUserspace returns an empty userspace Datapath. now is a monotonic
// clock in nanoseconds; nil means the process's monotonic clock.
func NewUserspace(now func() int64) *Userspace {
	if now == nil {
		now = monoNow
	}
	return &Userspace{
		now:      now,
		services: make(map[Service]struct{}),
		backends: make(map[BackendID]Backend),
		aff:      make(map[affKey]affVal),
	}
}

// Mode returns ModeUserspace.
func (u *Userspace) Mode() Mode { return ModeUserspace }

// SetServices replaces the set of services.
func (u *Userspace) SetServices(svcs []Service) error {
	if err := checkServices(svcs); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return ErrClosed
	}
	clear(u.services)
	for _, s := range svcs {
		u.services[s] = struct{}{}
	}
	return nil
}

// Services returns the services, sorted.
func (u *Userspace) Services() ([]Service, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, ErrClosed
	}
	out := make([]Service, 0, len(u.services))
	for s := range u.services {
		out = append(out, s)
	}
	sortServices(out)
	return out, nil
}

// SetBackends replaces the set of backends.
func (u *Userspace) SetBackends(bs []Backend) error {
	if err := checkBackends(bs); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return ErrClosed
	}
	clear(u.backends)
	for _, b := range bs {
		u.backends[b.ID] = b
	}
	return nil
}

// Backends returns the backends by id.
func (u *Userspace) Backends() ([]Backend, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, ErrClosed
	}
	out := make([]Backend, 0, len(u.backends))
	for _, b := range u.backends {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Backend) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// BumpGeneration increments the generation of backend id.
func (u *Userspace) BumpGeneration(id BackendID) (uint32, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return 0, ErrClosed
	}
	b, ok := u.backends[id]
	if !ok {
		return 0, fmt.Errorf("bump generation of backend %d: %w", id, ErrUnknownBackend)
	}
	b.Generation++
	u.backends[id] = b
	return b.Generation, nil
}

// SetAffinity records the affinity; its idle time restarts.
func (u *Userspace) SetAffinity(a Affinity) error {
	if err := validAffinity(a); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return ErrClosed
	}
	if _, ok := u.backends[a.Backend]; !ok {
		return fmt.Errorf("set affinity to backend %d: %w", a.Backend, ErrUnknownBackend)
	}
	k := affKey{a.Client, a.Service}
	if _, ok := u.aff[k]; !ok && len(u.aff) >= MaxAffinity {
		return fmt.Errorf("set affinity: %w", ErrFull)
	}
	u.aff[k] = affVal{backend: a.Backend, gen: a.Generation, lastUsed: u.now()}
	return nil
}

// DeleteAffinity removes the entry of (client, svc) if present.
func (u *Userspace) DeleteAffinity(client netip.Addr, svc Service) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return ErrClosed
	}
	delete(u.aff, affKey{client, svc})
	return nil
}

// LookupAffinity returns the entry of (client, svc).
func (u *Userspace) LookupAffinity(client netip.Addr, svc Service) (AffinityEntry, bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return AffinityEntry{}, false, ErrClosed
	}
	v, ok := u.aff[affKey{client, svc}]
	if !ok {
		return AffinityEntry{}, false, nil
	}
	return u.entry(affKey{client, svc}, v, u.now()), true, nil
}

func (u *Userspace) entry(k affKey, v affVal, now int64) AffinityEntry {
	return AffinityEntry{
		Affinity: Affinity{Client: k.client, Service: k.svc, Backend: v.backend, Generation: v.gen},
		Idle:     idle(now, v.lastUsed),
	}
}

// RangeAffinity calls fn for each entry (in no particular order) until fn
// returns false. fn must not call back into u.
func (u *Userspace) RangeAffinity(fn func(AffinityEntry) bool) error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return ErrClosed
	}
	now := u.now()
	entries := make([]AffinityEntry, 0, len(u.aff))
	for k, v := range u.aff {
		entries = append(entries, u.entry(k, v, now))
	}
	u.mu.Unlock()
	for _, e := range entries {
		if !fn(e) {
			break
		}
	}
	return nil
}

// ExpireIdle deletes entries idle for at least maxIdle.
func (u *Userspace) ExpireIdle(maxIdle time.Duration) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return 0, ErrClosed
	}
	now, n := u.now(), 0
	for k, v := range u.aff {
		if idle(now, v.lastUsed) >= maxIdle {
			delete(u.aff, k)
			n++
		}
	}
	return n, nil
}

// Counters returns zero counters: userspace mode sees no packets.
func (u *Userspace) Counters() (Counters, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return Counters{}, ErrClosed
	}
	return Counters{}, nil
}

// Close marks u closed.
func (u *Userspace) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	return nil
}

// Detach is Close: there is nothing attached.
func (u *Userspace) Detach() error { return u.Close() }

func idle(now, last int64) time.Duration {
	if now <= last {
		return 0
	}
	return time.Duration(now - last)
}

func checkServices(svcs []Service) error {
	if len(svcs) > MaxServices {
		return fmt.Errorf("%d services: at most %d: %w", len(svcs), MaxServices, ErrInvalid)
	}
	for _, s := range svcs {
		if err := validService(s); err != nil {
			return err
		}
	}
	return nil
}

func checkBackends(bs []Backend) error {
	seen := make(map[BackendID]bool, len(bs))
	for _, b := range bs {
		if err := validBackend(b); err != nil {
			return err
		}
		if seen[b.ID] {
			return fmt.Errorf("backend id %d listed twice: %w", b.ID, ErrInvalid)
		}
		seen[b.ID] = true
	}
	return nil
}

func sortServices(s []Service) {
	slices.SortFunc(s, func(a, b Service) int { return a.Compare(b) })
}

var _ Datapath = (*Userspace)(nil)
