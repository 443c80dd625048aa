package fastpath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// flaky is a "kernel" datapath whose Check and map writes fail on demand.
type flaky struct {
	*Userspace
	checkErr atomic.Pointer[error]
	writeErr atomic.Pointer[error]
	detached atomic.Bool
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

func (f *flaky) Detach() error {
	f.detached.Store(true)
	return f.Userspace.Detach()
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
// ERROR line, configuration carried over, the kernel side detached, every
// later call served. Caller errors and transient failures never switch it.
func TestFallbackSwitch(t *testing.T) {
	client := netip.MustParseAddr("10.1.0.2")
	aff := Affinity{Client: client, Service: vip, Backend: 1, Generation: 3}
	tests := []struct {
		name   string
		break_ func(t *testing.T, k *flaky, f *Fallback)
		lost   bool
	}{
		{name: "check reports the program detached", lost: true, break_: func(t *testing.T, k *flaky, f *Fallback) {
			k.checkErr.Store(errp(fmt.Errorf("%w: xdp_steer is no longer attached to eth0", ErrLost)))
			if err := f.Check(); err != nil {
				t.Fatalf("Check after the switch: %v, want nil (userspace works)", err)
			}
		}},
		{name: "writes keep failing while reads work", lost: true, break_: func(t *testing.T, k *flaky, f *Fallback) {
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
		}},
		{name: "a failure between successes", break_: func(t *testing.T, k *flaky, f *Fallback) {
			for range 3 * lostAfterFailures {
				k.writeErr.Store(errp(syscall.ENOMEM))
				_ = f.SetAffinity(aff)
				k.writeErr.Store(nil)
				if err := f.SetAffinity(aff); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{name: "caller errors", break_: func(t *testing.T, k *flaky, f *Fallback) {
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
		{name: "check cannot tell", break_: func(t *testing.T, k *flaky, f *Fallback) {
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
			tc.break_(t, k, f)
			if f.Lost() != tc.lost {
				t.Fatalf("lost = %v, want %v", f.Lost(), tc.lost)
			}
			lines := strings.Count(logs.String(), "userspace mode")
			if !tc.lost {
				if f.Mode() != ModeKernel || lines != 0 || k.detached.Load() {
					t.Fatalf("switched without losing the kernel: mode %s, log %q", f.Mode(), logs.String())
				}
				return
			}
			if f.Mode() != ModeUserspace || !k.detached.Load() {
				t.Fatalf("mode %s, kernel detached %v", f.Mode(), k.detached.Load())
			}
			// Later calls, the check included, work and log nothing more.
			_ = f.Check()
			if err := f.SetAffinity(aff); err != nil {
				t.Fatal(err)
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
		})
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
