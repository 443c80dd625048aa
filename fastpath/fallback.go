package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLost: the kernel datapath stopped working while the process ran (its
// XDP program was detached, its interface went away, or its map operations
// keep failing). A Fallback then continues in userspace mode.
var ErrLost = errors.New("kernel datapath lost")

// Checker is implemented by datapaths that can tell whether they still
// work (Kernel: its XDP program is still attached to its interface). A
// caller runs Check periodically (the control loop, once per step).
type Checker interface {
	// Check returns nil while the datapath works, else an error wrapping
	// ErrLost (or another error when it could not tell).
	Check() error
}

// lostAfterFailures is how many calls of one datapath operation failing in
// a row (other than caller errors: ErrInvalid, ErrFull, ErrUnknownBackend)
// make a Fallback give the kernel datapath up. One failure is not enough: a
// map update can fail transiently (ENOMEM) and the caller already degrades
// safely (the entry is deleted, the client stays on the slowpath). Counted
// per operation, so one broken map is not hidden by the others working.
const lostAfterFailures = 8

// Operations, for the per-operation failure counts.
const (
	opCheck = iota
	opSetServices
	opServices
	opSetBackends
	opBackends
	opBump
	opSetAffinity
	opDeleteAffinity
	opLookupAffinity
	opRangeAffinity
	opExpireIdle
	opCounters
	numOps
)

// Fallback is a kernel Datapath that turns into a userspace one when the
// kernel side is lost mid-run, instead of failing: Mode then reports
// ModeUserspace (warmpath_fastpath_kernel_mode 0), every call goes to an
// in-memory Userspace datapath holding the services and backends carried
// over, one ERROR line says why, and the kernel side is detached (nothing
// maintains its entries any more, so none may keep steering). The slowpath
// never depended on it, so it keeps serving every connection. The switch
// is one-way: a restart (or a new Open) brings the kernel datapath back.
// Open returns the kernel datapath wrapped in a Fallback.
type Fallback struct {
	k      Datapath
	u      *Userspace
	log    *slog.Logger
	lost   atomic.Bool
	closed atomic.Bool
	fails  [numOps]atomic.Int32 // consecutive failures per operation
	mu     sync.Mutex           // serialises lose and Close
}

// NewFallback wraps k. now is the userspace side's clock (nil: monotonic).
func NewFallback(k Datapath, now func() int64, log *slog.Logger) *Fallback {
	if log == nil {
		log = slog.Default().With("component", "fastpath")
	}
	return &Fallback{k: k, u: NewUserspace(now), log: log}
}

// Lost reports whether the kernel datapath was given up.
func (f *Fallback) Lost() bool { return f.lost.Load() }

// Check runs the kernel datapath's Check; when it reports the datapath lost
// the Fallback switches to userspace and Check returns nil (the datapath
// works again, in userspace). Other errors are returned and count as
// failed operations.
func (f *Fallback) Check() error {
	if f.lost.Load() || f.closed.Load() {
		return nil
	}
	c, ok := f.k.(Checker)
	if !ok {
		return nil
	}
	err := c.Check()
	if f.note(opCheck, err) {
		return nil
	}
	return err
}

// note looks at a kernel call's error; true means the kernel datapath is
// (now) lost and the call must be made on the userspace side.
func (f *Fallback) note(op int, err error) bool {
	switch {
	case err == nil:
		f.fails[op].Store(0)
		return false
	case f.closed.Load():
		return false
	case f.lost.Load():
		return true // lost by another goroutine while this call ran
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrFull), errors.Is(err, ErrUnknownBackend):
		return false // the caller's problem, not the datapath's
	case errors.Is(err, ErrLost), errors.Is(err, ErrClosed):
		f.lose(err)
		return true
	}
	if n := f.fails[op].Add(1); n >= lostAfterFailures {
		f.lose(fmt.Errorf("%w: %d datapath operations failed in a row, the last: %w", ErrLost, n, err))
		return true
	}
	return false
}

func (f *Fallback) lose(reason error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost.Load() || f.closed.Load() {
		return
	}
	// Carry the configuration over, so status and metrics stay meaningful
	// (the maps are still readable through this process's handles).
	if svcs, err := f.k.Services(); err == nil {
		_ = f.u.SetServices(svcs)
	}
	if bs, err := f.k.Backends(); err == nil {
		_ = f.u.SetBackends(bs)
	}
	f.lost.Store(true)
	derr := f.k.Detach()
	f.log.Error("fast path lost: userspace mode from now on, every connection goes through the slowpath (restart warmpath to re-attach)",
		"reason", reason.Error(), "detach_error", derr)
}

// call runs op on the kernel side and, when that is (or becomes) lost, on
// the userspace side.
func call[T any](f *Fallback, id int, op func(Datapath) (T, error)) (T, error) {
	if !f.lost.Load() {
		v, err := op(f.k)
		if !f.note(id, err) {
			return v, err
		}
	}
	return op(f.u)
}

func call0(f *Fallback, id int, op func(Datapath) error) error {
	_, err := call(f, id, func(d Datapath) (struct{}, error) { return struct{}{}, op(d) })
	return err
}

// Mode reports ModeKernel until the kernel datapath is lost, then
// ModeUserspace.
func (f *Fallback) Mode() Mode {
	if f.lost.Load() {
		return ModeUserspace
	}
	return f.k.Mode()
}

// SetServices implements Datapath.
func (f *Fallback) SetServices(svcs []Service) error {
	return call0(f, opSetServices, func(d Datapath) error { return d.SetServices(svcs) })
}

// Services implements Datapath.
func (f *Fallback) Services() ([]Service, error) {
	return call(f, opServices, func(d Datapath) ([]Service, error) { return d.Services() })
}

// SetBackends implements Datapath.
func (f *Fallback) SetBackends(bs []Backend) error {
	return call0(f, opSetBackends, func(d Datapath) error { return d.SetBackends(bs) })
}

// Backends implements Datapath.
func (f *Fallback) Backends() ([]Backend, error) {
	return call(f, opBackends, func(d Datapath) ([]Backend, error) { return d.Backends() })
}

// BumpGeneration implements Datapath.
func (f *Fallback) BumpGeneration(id BackendID) (uint32, error) {
	return call(f, opBump, func(d Datapath) (uint32, error) { return d.BumpGeneration(id) })
}

// SetAffinity implements Datapath.
func (f *Fallback) SetAffinity(a Affinity) error {
	if !f.lost.Load() { // the request path: no closure
		err := f.k.SetAffinity(a)
		if !f.note(opSetAffinity, err) {
			return err
		}
	}
	return f.u.SetAffinity(a)
}

// DeleteAffinity implements Datapath.
func (f *Fallback) DeleteAffinity(client netip.Addr, svc Service) error {
	if !f.lost.Load() {
		err := f.k.DeleteAffinity(client, svc)
		if !f.note(opDeleteAffinity, err) {
			return err
		}
	}
	return f.u.DeleteAffinity(client, svc)
}

// LookupAffinity implements Datapath.
func (f *Fallback) LookupAffinity(client netip.Addr, svc Service) (AffinityEntry, bool, error) {
	if !f.lost.Load() {
		e, ok, err := f.k.LookupAffinity(client, svc)
		if !f.note(opLookupAffinity, err) {
			return e, ok, err
		}
	}
	return f.u.LookupAffinity(client, svc)
}

// RangeAffinity implements Datapath.
func (f *Fallback) RangeAffinity(fn func(AffinityEntry) bool) error {
	return call0(f, opRangeAffinity, func(d Datapath) error { return d.RangeAffinity(fn) })
}

// ExpireIdle implements Datapath.
func (f *Fallback) ExpireIdle(maxIdle time.Duration) (int, error) {
	return call(f, opExpireIdle, func(d Datapath) (int, error) { return d.ExpireIdle(maxIdle) })
}

// Counters implements Datapath.
func (f *Fallback) Counters() (Counters, error) {
	return call(f, opCounters, func(d Datapath) (Counters, error) { return d.Counters() })
}

// Close implements Datapath: it closes the side in use.
func (f *Fallback) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed.Swap(true) {
		return nil
	}
	if f.lost.Load() {
		return f.u.Close()
	}
	return f.k.Close()
}

// Detach implements Datapath.
func (f *Fallback) Detach() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed.Swap(true) {
		return ErrClosed
	}
	if f.lost.Load() {
		return f.u.Close()
	}
	return f.k.Detach()
}

var (
	_ Datapath = (*Fallback)(nil)
	_ Checker  = (*Fallback)(nil)
)
