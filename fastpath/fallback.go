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
// over, and one ERROR line says why. The slowpath never depended on the
// kernel side, so it keeps serving every new connection. The switch is
// one-way: a restart (or a new Open) brings the kernel datapath back.
//
// What happens to the kernel side depends on how it was lost:
//   - gone (Check: the program is no longer attached to its interface, or
//     the kernel side reports ErrLost/ErrClosed): it steers nothing any
//     more, so this process releases its own link and handles, unpinning
//     only objects that are still its own (another instance may have
//     pinned its own state at the same path since: that is left alone).
//     Connections it steered were already cut by whatever detached it.
//   - failing (lostAfterFailures calls of one operation in a row): the
//     program is still attached and its flows map carries established
//     steered connections, so it is left attached and drained instead:
//     every backend is written unhealthy (if that write fails too, every
//     affinity entry is deleted), so no new connection is steered while
//     established ones keep their backend. The handles stay open until
//     Close (which leaves the drained program pinned for the next instance
//     to adopt, as a hitless restart does) or Detach. Only when neither
//     drain write works is the own link detached (stale entries nobody
//     maintains must not steer new connections forever).
//
// Open returns the kernel datapath wrapped in a Fallback.
type Fallback struct {
	k      Datapath
	u      *Userspace
	log    *slog.Logger
	lost   atomic.Bool
	closed atomic.Bool
	fails  [numOps]atomic.Int32 // consecutive failures per operation
	// gate: write-held by lose (the carry-over, then lost set), Close and
	// Detach; read-held by the calls whose writes lose carries over
	// (SetServices, SetBackends, BumpGeneration) around their kernel call,
	// so none lands between the copy and the switch.
	gate    sync.RWMutex
	drained bool // the kernel side was left attached and drained (under gate)
	// release of a gone kernel side, deferred while a RangeAffinity runs
	// (its callback may have caused the loss: Kernel.release would wait for
	// the range to end).
	ranging        atomic.Int32
	pendingRelease atomic.Bool
}

// releaser is a kernel side that can give up only its own state (Kernel).
type releaser interface {
	release() error
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
		f.lose(err, true)
		return true
	}
	if n := f.fails[op].Add(1); n >= lostAfterFailures {
		f.lose(fmt.Errorf("%w: %d datapath operations failed in a row, the last: %w", ErrLost, n, err), false)
		return true
	}
	return false
}

// lose switches to userspace. gone: the kernel side steers nothing any
// more (release it); else it is failing but attached (drain it).
func (f *Fallback) lose(reason error, gone bool) {
	f.gate.Lock()
	if f.lost.Load() || f.closed.Load() {
		f.gate.Unlock()
		return
	}
	// Carry the configuration over, so status and metrics stay meaningful
	// (the maps are still readable through this process's handles).
	svcs, serr := f.k.Services()
	if serr == nil {
		_ = f.u.SetServices(svcs)
	}
	bs, berr := f.k.Backends()
	if berr == nil {
		_ = f.u.SetBackends(bs)
	}
	f.lost.Store(true)
	xdp := "gone: this process's own link and pins released, any other instance's left alone"
	if !gone {
		if err := f.drain(bs, berr); err == nil {
			f.drained = true
			xdp = "left attached and drained: established steered connections keep their backend, new ones are not steered (restart to steer again)"
		} else {
			xdp = "detached: it could not be drained (" + err.Error() + "), established steered connections are cut"
		}
	}
	if !f.drained {
		f.pendingRelease.Store(true)
	}
	f.gate.Unlock()
	f.log.Error("fast path lost: userspace mode from now on, every new connection goes through the slowpath",
		"reason", reason.Error(), "xdp", xdp)
	f.finishRelease()
}

// drain stops the attached kernel side from steering new connections
// while its established flows keep their backend: every backend written
// unhealthy, or else every affinity entry deleted.
func (f *Fallback) drain(bs []Backend, berr error) error {
	var errs []error
	if berr == nil {
		down := make([]Backend, len(bs))
		for i, b := range bs {
			b.Healthy = false
			down[i] = b
		}
		err := f.k.SetBackends(down)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("mark backends unhealthy: %w", err))
	} else {
		errs = append(errs, berr)
	}
	if _, err := f.k.ExpireIdle(0); err != nil {
		return errors.Join(append(errs, fmt.Errorf("delete affinity entries: %w", err))...)
	}
	// Every entry deleted: affinity_pick finds none, so no new connection
	// is steered (a SetAffinity already in flight on the kernel when lost
	// was set may still land one entry).
	return nil
}

// finishRelease releases a gone kernel side once no RangeAffinity runs.
func (f *Fallback) finishRelease() {
	if f.ranging.Load() != 0 || !f.pendingRelease.CompareAndSwap(true, false) {
		return
	}
	var err error
	if r, ok := f.k.(releaser); ok {
		err = r.release()
	} else {
		err = f.k.Close()
	}
	if err != nil {
		f.log.Warn("fast path lost: releasing the kernel side", "err", err)
	}
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

// gated is call for the writes lose carries over: the kernel call runs
// under gate, so it lands before the copy or goes to userspace after it.
func gated[T any](f *Fallback, id int, op func(Datapath) (T, error)) (T, error) {
	f.gate.RLock()
	if f.lost.Load() {
		f.gate.RUnlock()
		return op(f.u)
	}
	v, err := op(f.k)
	f.gate.RUnlock()
	if !f.note(id, err) { // lose takes gate: after RUnlock
		return v, err
	}
	return op(f.u)
}

func call0(f *Fallback, id int, op func(Datapath) error) error {
	_, err := call(f, id, func(d Datapath) (struct{}, error) { return struct{}{}, op(d) })
	return err
}

func gated0(f *Fallback, id int, op func(Datapath) error) error {
	_, err := gated(f, id, func(d Datapath) (struct{}, error) { return struct{}{}, op(d) })
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
	return gated0(f, opSetServices, func(d Datapath) error { return d.SetServices(svcs) })
}

// Services implements Datapath.
func (f *Fallback) Services() ([]Service, error) {
	return call(f, opServices, func(d Datapath) ([]Service, error) { return d.Services() })
}

// SetBackends implements Datapath.
func (f *Fallback) SetBackends(bs []Backend) error {
	return gated0(f, opSetBackends, func(d Datapath) error { return d.SetBackends(bs) })
}

// Backends implements Datapath.
func (f *Fallback) Backends() ([]Backend, error) {
	return call(f, opBackends, func(d Datapath) ([]Backend, error) { return d.Backends() })
}

// BumpGeneration implements Datapath.
func (f *Fallback) BumpGeneration(id BackendID) (uint32, error) {
	return gated(f, opBump, func(d Datapath) (uint32, error) { return d.BumpGeneration(id) })
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

// RangeAffinity implements Datapath. fn may call any method but Close and
// Detach; a loss it causes is handled after the range ends.
func (f *Fallback) RangeAffinity(fn func(AffinityEntry) bool) error {
	f.ranging.Add(1) // before call reads lost: see finishRelease
	defer func() {
		if f.ranging.Add(-1) == 0 {
			f.finishRelease()
		}
	}()
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

// Close implements Datapath: it closes the side in use. After a loss the
// userspace side is closed and so is the kernel side's handles: a gone
// one released (if not yet), a drained one closed with its pins kept (the
// next instance adopts the program and re-enables its backends).
func (f *Fallback) Close() error {
	return f.close(false)
}

// Detach implements Datapath: in kernel mode Kernel.Detach (everything
// under PinPath). After a loss a drained kernel side is detached that way
// too; a gone one is only released (its pin path may hold another
// instance's state by now).
func (f *Fallback) Detach() error {
	return f.close(true)
}

func (f *Fallback) close(detach bool) error {
	f.gate.Lock()
	if f.closed.Swap(true) {
		f.gate.Unlock()
		if detach {
			return ErrClosed
		}
		return nil
	}
	lost, drained := f.lost.Load(), f.drained
	f.gate.Unlock()
	// The kernel side is closed outside gate: it waits for a running
	// RangeAffinity, whose callback may need gate.
	switch {
	case !lost && detach:
		return f.k.Detach()
	case !lost:
		return f.k.Close()
	case drained && detach:
		return errors.Join(f.u.Close(), f.k.Detach())
	case drained:
		return errors.Join(f.u.Close(), f.k.Close())
	}
	f.finishRelease()
	return f.u.Close()
}

var (
	_ Datapath = (*Fallback)(nil)
	_ Checker  = (*Fallback)(nil)
)
