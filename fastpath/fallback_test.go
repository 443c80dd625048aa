package fastpath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// flaky is a "kernel" datapath whose Check and map writes fail on demand.
// It records how it was given up: detached (Detach: everything under the
// pin path) or released (only its own state), and whether that happened
// while its RangeAffinity was running (a deadlock on the real Kernel).
type flaky struct {
	*Userspace
	checkErr    atomic.Pointer[error]
	writeErr    atomic.Pointer[error] // SetAffinity
	backendsErr atomic.Pointer[error] // SetBackends
	expireErr   atomic.Pointer[error] // ExpireIdle
	detached    atomic.Bool
	released    atomic.Bool
	inRange     atomic.Int32
	underRange  atomic.Bool // detached or released inside RangeAffinity
}

func (f *flaky) Mode() Mode { return ModeKernel }

func (f *flaky) Check() error {
	if p := f.checkErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (f *flaky) SetAffinity(a Affinity) error {
	if p := f.writeErr.Load(); p != nil {
		return *p
	}
	return f.Userspace.SetAffinity(a)
}

func (f *flaky) SetBackends(bs []Backend) error {
	if p := f.backendsErr.Load(); p != nil {
		return *p
	}
	return f.Userspace.SetBackends(bs)
}

func (f *flaky) ExpireIdle(d time.Duration) (int, error) {
	if p := f.expireErr.Load(); p != nil {
		return 0, *p
	}
	return f.Userspace.ExpireIdle(d)
}

func (f *flaky) RangeAffinity(fn func(AffinityEntry) bool) error {
	f.inRange.Add(1)
	defer f.inRange.Add(-1)
	return f.Userspace.RangeAffinity(fn)
}

func (f *flaky) Detach() error {
	f.underRange.Store(f.underRange.Load() || f.inRange.Load() > 0)
	f.detached.Store(true)
	return f.Userspace.Detach()
}

func (f *flaky) release() error {
	f.underRange.Store(f.underRange.Load() || f.inRange.Load() > 0)
	f.released.Store(true)
	return f.Userspace.Close()
}

func newFlaky(t *testing.T) (*flaky, *Fallback, *bytes.Buffer) {
	t.Helper()
	k := &flaky{Userspace: NewUserspace(nil)}
	var logs bytes.Buffer
	f := NewFallback(k, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { _ = f.Close() })
	if err := f.SetServices([]Service{vip}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 3}}); err != nil {
		t.Fatal(err)
	}
	return k, f, &logs
}

func errp(err error) *error { return &err }

// TestFallbackSwitch: the kernel side lost (Check says so, or its writes
// keep failing) turns the Fallback into a userspace datapath: mode, one
// ERROR line, configuration carried over, every later call served. A gone
// kernel side is released (only its own state); a failing one is left
// attached and drained: every backend unhealthy in the kernel (or, if that
// write fails too, every affinity entry deleted) so established steered
// flows keep their backend and no new one is steered; only when neither
// drain write works is it released. Caller errors and transient failures
// never switch it.
func TestFallbackSwitch(t *testing.T) {
	client := netip.MustParseAddr("10.1.0.2")
	aff := Affinity{Client: client, Service: vip, Backend: 1, Generation: 3}
	failWrites := func(t *testing.T, k *flaky, f *Fallback) {
		k.writeErr.Store(errp(fmt.Errorf("set affinity: %w", syscall.EBADF)))
		for i := range lostAfterFailures - 1 {
			if err := f.SetAffinity(aff); !errors.Is(err, syscall.EBADF) {
				t.Fatalf("write %d: %v, want the kernel's error while not lost", i, err)
			}
			if f.Lost() {
				t.Fatalf("lost after %d failures", i+1)
			}
			// Other operations working do not hide the broken one.
			if _, err := f.Counters(); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.SetAffinity(aff); err != nil {
			t.Fatalf("write %d: %v, want it redone in userspace", lostAfterFailures, err)
		}
	}
	const (
		kernel   = "kernel"   // not lost
		released = "released" // lost, own state released
		drained  = "drained"  // lost, left attached, backends unhealthy
		emptied  = "emptied"  // lost, left attached, affinity entries deleted
	)
	tests := []struct {
		name   string
		break_ func(t *testing.T, k *flaky, f *Fallback)
		want   string
	}{
		{name: "check reports the program detached", want: released, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.checkErr.Store(errp(fmt.Errorf("%w: xdp_steer is no longer attached to eth0", ErrLost)))
			if err := f.Check(); err != nil {
				t.Fatalf("Check after the switch: %v, want nil (userspace works)", err)
			}
		}},
		{name: "writes keep failing while reads work", want: drained, break_: failWrites},
		{name: "writes keep failing, backends cannot be marked", want: emptied, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.backendsErr.Store(errp(syscall.EBADF))
			failWrites(t, k, f)
		}},
		{name: "writes keep failing, nothing can be drained", want: released, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.backendsErr.Store(errp(syscall.EBADF))
			k.expireErr.Store(errp(syscall.EBADF))
			failWrites(t, k, f)
		}},
		{name: "check keeps failing to tell", want: drained, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.checkErr.Store(errp(syscall.EBADF))
			for i := range lostAfterFailures - 1 {
				if err := f.Check(); !errors.Is(err, syscall.EBADF) || f.Lost() {
					t.Fatalf("check %d: %v, lost %v", i, err, f.Lost())
				}
			}
			if err := f.Check(); err != nil {
				t.Fatalf("check %d: %v", lostAfterFailures, err)
			}
		}},
		{name: "a failure between successes", want: kernel, break_: func(t *testing.T, k *flaky, f *Fallback) {
			for range 3 * lostAfterFailures {
				k.writeErr.Store(errp(syscall.ENOMEM))
				_ = f.SetAffinity(aff)
				k.writeErr.Store(nil)
				if err := f.SetAffinity(aff); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{name: "caller errors", want: kernel, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.writeErr.Store(errp(fmt.Errorf("set affinity: %w", ErrFull)))
			for range 2 * lostAfterFailures {
				if err := f.SetAffinity(aff); !errors.Is(err, ErrFull) {
					t.Fatalf("got %v, want ErrFull", err)
				}
			}
			k.writeErr.Store(nil)
			for range 2 * lostAfterFailures {
				if err := f.SetAffinity(Affinity{Client: netip.MustParseAddr("::1"), Service: vip}); !errors.Is(err, ErrInvalid) {
					t.Fatalf("got %v, want ErrInvalid", err)
				}
			}
			for range 2 * lostAfterFailures {
				if err := f.SetAffinity(Affinity{Client: client, Service: vip, Backend: 9}); !errors.Is(err, ErrUnknownBackend) {
					t.Fatalf("got %v, want ErrUnknownBackend", err)
				}
			}
		}},
		{name: "check cannot tell", want: kernel, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.checkErr.Store(errp(syscall.EINTR))
			if err := f.Check(); !errors.Is(err, syscall.EINTR) {
				t.Fatalf("Check: %v, want the error passed on", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, f, logs := newFlaky(t)
			if f.Mode() != ModeKernel {
				t.Fatalf("mode %s before", f.Mode())
			}
			// An established steered client, in the kernel.
			if err := k.Userspace.SetAffinity(aff); err != nil {
				t.Fatal(err)
			}
			tc.break_(t, k, f)
			if lost := tc.want != kernel; f.Lost() != lost {
				t.Fatalf("lost = %v, want %v", f.Lost(), lost)
			}
			lines := strings.Count(logs.String(), "userspace mode")
			if tc.want == kernel {
				if f.Mode() != ModeKernel || lines != 0 || k.detached.Load() || k.released.Load() {
					t.Fatalf("switched without losing the kernel: mode %s, log %q", f.Mode(), logs.String())
				}
				return
			}
			if f.Mode() != ModeUserspace {
				t.Fatalf("mode %s", f.Mode())
			}
			if k.detached.Load() {
				t.Fatal("the kernel side was detached by path (Kernel.Detach): another instance's pins would go too")
			}
			if got := k.released.Load(); got != (tc.want == released) {
				t.Fatalf("kernel side released %v, want %v", got, tc.want == released)
			}
			if tc.want == drained || tc.want == emptied {
				// Left attached: the kernel's state stops new steering
				// but keeps the program (and its flows) in place.
				kbs, err := k.Userspace.Backends()
				if err != nil || len(kbs) != 1 || kbs[0].Healthy != (tc.want == emptied) {
					t.Fatalf("kernel backends after draining: %+v %v", kbs, err)
				}
				_, found, err := k.Userspace.LookupAffinity(client, vip)
				if err != nil || found != (tc.want == drained) {
					t.Fatalf("kernel affinity entry after draining: found %v %v", found, err)
				}
			}
			// Later calls, the check included, work and log nothing more.
			_ = f.Check()
			if err := f.SetAffinity(aff); err != nil {
				t.Fatal(err)
			}
			if bs, err := f.Backends(); err != nil || len(bs) != 1 || !bs[0].Healthy {
				t.Fatalf("userspace backends after the switch: %+v %v (want the carried-over, healthy one)", bs, err)
			}
			if _, err := f.BumpGeneration(1); err != nil {
				t.Fatalf("bump generation of a carried-over backend: %v", err)
			}
			if svcs, err := f.Services(); err != nil || len(svcs) != 1 || svcs[0] != vip {
				t.Fatalf("services after the switch: %v %v", svcs, err)
			}
			if e, ok, err := f.LookupAffinity(client, vip); err != nil || !ok || e.Backend != 1 {
				t.Fatalf("entry after the switch: %+v %v %v", e, ok, err)
			}
			if lines = strings.Count(logs.String(), "userspace mode"); lines != 1 || !strings.Contains(logs.String(), "level=ERROR") {
				t.Fatalf("want one ERROR line about userspace mode, got %d:\n%s", lines, logs.String())
			}
			// Close closes the kernel side too (the old code leaked it).
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := k.Userspace.Backends(); !errors.Is(err, ErrClosed) {
				t.Fatalf("kernel side after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestFallbackLossInsideRange: a RangeAffinity callback that runs into the
// loss (here its Check) must not release the kernel side while the range
// runs (the real Kernel's release waits for it: a deadlock); the release
// happens once the range ended.
func TestFallbackLossInsideRange(t *testing.T) {
	k, f, _ := newFlaky(t)
	for i := range 3 {
		a := Affinity{Client: netip.AddrFrom4([4]byte{10, 1, 0, byte(2 + i)}), Service: vip, Backend: 1, Generation: 3}
		if err := f.SetAffinity(a); err != nil {
			t.Fatal(err)
		}
	}
	k.checkErr.Store(errp(fmt.Errorf("%w: detached", ErrLost)))
	if seen := rangeReentering(t, f, f); seen != 3 {
		t.Fatalf("range: %d entries, want 3", seen)
	}
	if k.underRange.Load() {
		t.Fatal("kernel side given up while its RangeAffinity ran")
	}
	if !f.Lost() || !k.released.Load() {
		t.Fatalf("lost %v, released %v after the range", f.Lost(), k.released.Load())
	}
}

// TestFallbackClosedIsNotLost: the process closing its own datapath is not
// a loss.
func TestFallbackClosedIsNotLost(t *testing.T) {
	_, f, logs := newFlaky(t)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 * lostAfterFailures {
		if err := f.SetAffinity(Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1}); !errors.Is(err, ErrClosed) {
			t.Fatalf("after Close: %v, want ErrClosed", err)
		}
	}
	if f.Lost() || logs.Len() != 0 {
		t.Fatalf("Close counted as a loss: %q", logs.String())
	}
}

// TestFallbackContract: wrapped, a datapath still honours the whole API.
func TestFallbackContract(t *testing.T) {
	clk := &fakeClock{}
	f := NewFallback(NewUserspace(clk.now), clk.now, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = f.Close() })
	testContract(t, f, clk)
}

// slowWrite is a "kernel" datapath whose SetBackends, once armed, yields
// (boundedly) until someone reads its backends before it writes: it holds
// a write in flight while a loss is being handled.
type slowWrite struct {
	*Userspace
	checkErr atomic.Pointer[error]
	armed    atomic.Bool
	entered  chan struct{}
	copied   atomic.Bool
}

func (s *slowWrite) Mode() Mode { return ModeKernel }

func (s *slowWrite) Check() error {
	if p := s.checkErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *slowWrite) SetBackends(bs []Backend) error {
	if s.armed.Load() {
		close(s.entered)
		for i := 0; i < 10000 && !s.copied.Load(); i++ {
			runtime.Gosched()
		}
	}
	return s.Userspace.SetBackends(bs)
}

// Close and Detach leave it open: a kernel side given up keeps taking the
// in-flight write, as real maps do until their last handle goes.
func (s *slowWrite) Close() error  { return nil }
func (s *slowWrite) Detach() error { return nil }

func (s *slowWrite) Backends() ([]Backend, error) {
	s.copied.Store(true)
	return s.Userspace.Backends()
}

// TestFallbackCarryOverSeesWrites: a SetBackends in flight on the kernel
// while the loss is handled is not lost: it lands before the carry-over
// (and so reaches the userspace side) or after the switch in userspace.
func TestFallbackCarryOverSeesWrites(t *testing.T) {
	k := &slowWrite{Userspace: NewUserspace(nil), entered: make(chan struct{})}
	f := NewFallback(k, nil, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = f.Close() })
	if err := f.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}}); err != nil {
		t.Fatal(err)
	}
	want := []Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}, {ID: 4, Addr: be4Addr, Healthy: true, Generation: 1}}
	k.armed.Store(true)
	done := make(chan error)
	go func() { done <- f.SetBackends(want) }()
	<-k.entered
	k.checkErr.Store(errp(fmt.Errorf("%w: detached", ErrLost)))
	if err := f.Check(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := f.Backends()
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("userspace backends after the switch: %+v %v, want %+v (the write that succeeded)", got, err, want)
	}
}

// rangeReentering ranges over dp's entries calling ck.Check and
// dp.SetAffinity from inside the callback (both must work there) and
// returns how many entries it saw.
func rangeReentering(t *testing.T, dp Datapath, ck Checker) int {
	t.Helper()
	seen := 0
	err := dp.RangeAffinity(func(e AffinityEntry) bool {
		seen++
		if err := ck.Check(); err != nil {
			t.Errorf("Check inside the range: %v", err)
		}
		if err := dp.SetAffinity(e.Affinity); err != nil {
			t.Errorf("SetAffinity inside the range: %v", err)
		}
		return true
	})
	if err != nil {
		t.Fatalf("range: %v", err)
	}
	return seen
}
