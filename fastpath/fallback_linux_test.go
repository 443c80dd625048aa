package fastpath

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/warmpath/warmpath/fastpath/testbed"
)

// openLost opens the kernel datapath (through Open, so wrapped in a
// Fallback) attached to dev in ns, pinned at pin, with one service, one
// backend and one affinity entry.
func openLost(t *testing.T, ns *testbed.NS, dev, pin string, logs *bytes.Buffer) (Datapath, Checker) {
	t.Helper()
	var dp Datapath
	err := ns.Do(func() (err error) {
		dp, err = Open(Options{Mode: ModeKernel, PinPath: pin, Interface: dev, Attach: AttachDriver,
			EncapSource: encapSrc, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	ck, ok := dp.(Checker)
	if !ok {
		t.Fatalf("Open returned %T, not a Checker", dp)
	}
	a := Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1, Generation: 1}
	for _, err := range []error{dp.SetServices([]Service{vip}),
		dp.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}}), dp.SetAffinity(a), ck.Check()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if dp.Mode() != ModeKernel || !xdpAttached(ns, dev) {
		t.Fatalf("before: mode %s, attached %v", dp.Mode(), xdpAttached(ns, dev))
	}
	return dp, ck
}

func pinNames(t *testing.T, pin string) []string {
	t.Helper()
	ents, err := os.ReadDir(pin)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// breakAffinityMap closes the affinity map's handle under a running kernel
// datapath (as a kernel refusing every update would): the program stays
// attached, so only failing writes can tell.
func breakAffinityMap(dp Datapath) {
	k := dp.(*Fallback).k.(*Kernel)
	k.mu.Lock()
	_ = k.objs.Affinity.Close()
	k.mu.Unlock()
}

// TestKernelLostMidRun: the XDP side torn down from under a running
// datapath. Detaching it (`warmpath detach` = Uninstall, which detaches
// even a link another process holds) or deleting its interface makes Check
// report ErrLost: the datapath Open returned switches to userspace mode
// with one ERROR line and releases its own state (nothing of it stays
// pinned). Map writes that keep failing switch it too, but the program,
// still attached, is left attached and drained (backends unhealthy in the
// kernel, pins kept), so the connections it steers live on. Unmounting
// bpffs is not a loss (the program and maps live on through the process's
// handles and keep steering).
func TestKernelLostMidRun(t *testing.T) {
	testbed.RequireRoot(t)
	tests := []struct {
		name     string
		teardown func(t *testing.T, ns *testbed.NS, pin string, dp Datapath)
		want     string // kernel, released, drained
	}{
		{name: "warmpath detach", want: "released", teardown: func(t *testing.T, _ *testbed.NS, pin string, _ Datapath) {
			if err := Uninstall(pin); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "interface deleted", want: "released", teardown: func(t *testing.T, ns *testbed.NS, _ string, _ Datapath) {
			ns.Run("ip", "link", "del", "wlost")
		}},
		{name: "map writes failing", want: "drained", teardown: func(t *testing.T, _ *testbed.NS, _ string, dp Datapath) {
			breakAffinityMap(dp)
			a := Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1, Generation: 1}
			for i := range lostAfterFailures {
				if err := dp.SetAffinity(a); (err == nil) != (i == lostAfterFailures-1) {
					t.Fatalf("write %d with a broken map: %v", i, err)
				}
			}
		}},
		{name: "bpffs unmounted", want: "kernel", teardown: func(t *testing.T, _ *testbed.NS, pin string, _ Datapath) {
			if err := unix.Unmount(filepath.Dir(pin), unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns, pin := vethBed(t, "lost", "wlost")
			var logs bytes.Buffer
			dp, ck := openLost(t, ns, "wlost", pin, &logs)

			tc.teardown(t, ns, pin, dp)
			if err := ck.Check(); err != nil {
				t.Fatalf("Check after %s: %v", tc.name, err)
			}
			want := ModeUserspace
			if tc.want == "kernel" {
				want = ModeKernel
			}
			if dp.Mode() != want {
				t.Fatalf("mode %s after %s, want %s", dp.Mode(), tc.name, want)
			}
			switch tc.want {
			case "kernel":
				if !xdpAttached(ns, "wlost") {
					t.Fatal("program detached by a bpffs unmount")
				}
			case "released":
				if tc.name != "interface deleted" && xdpAttached(ns, "wlost") {
					t.Fatalf("program still attached after %s", tc.name)
				}
				if left := pinNames(t, pin); len(left) != 0 {
					t.Fatalf("pins left after releasing its own state: %v", left)
				}
			case "drained":
				if !xdpAttached(ns, "wlost") {
					t.Fatal("program detached: its established steered connections would be reset")
				}
				if left := pinNames(t, pin); len(left) != 7 {
					t.Fatalf("pins after draining: %v, want the link and 6 maps", left)
				}
				r, err := OpenKernel(Options{PinPath: pin}) // a reader, like warmpath status
				if err != nil {
					t.Fatal(err)
				}
				bs, err := r.Backends()
				_ = r.Close()
				if err != nil || len(bs) != 1 || bs[0].Healthy {
					t.Fatalf("kernel backends after draining: %+v %v, want the one backend unhealthy", bs, err)
				}
			}
			// The datapath keeps answering, in whichever mode.
			a := Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1, Generation: 1}
			if err := dp.SetAffinity(a); err != nil {
				t.Fatal(err)
			}
			if bs, err := dp.Backends(); err != nil || len(bs) != 1 || !bs[0].Healthy {
				t.Fatalf("backends after %s: %+v %v", tc.name, bs, err)
			}
			if _, err := dp.Counters(); err != nil {
				t.Fatal(err)
			}
			n := strings.Count(logs.String(), "userspace mode")
			if (tc.want != "kernel" && n != 1) || (tc.want == "kernel" && n != 0) {
				t.Fatalf("%d userspace-mode log lines after %s:\n%s", n, tc.name, logs.String())
			}
			if tc.want == "drained" {
				// Close (a restart) keeps the drained program attached for
				// the next instance to adopt.
				if err := dp.Close(); err != nil {
					t.Fatal(err)
				}
				if !xdpAttached(ns, "wlost") || len(pinNames(t, pin)) != 7 {
					t.Fatalf("after Close: attached %v, pins %v", xdpAttached(ns, "wlost"), pinNames(t, pin))
				}
				if err := Uninstall(pin); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: mode %s; log: %s", tc.name, dp.Mode(), strings.TrimSpace(logs.String()))
		})
	}
}

// TestLostLeavesOthersState: an instance that finds its program gone must
// not remove the state another instance pinned at the same path since:
// after `warmpath detach` a new instance created its own maps and link,
// or the interface was recreated and a new instance adopted the pinned
// maps with a new link. The new instance stays attached and pinned, and
// its Close (a hitless restart) keeps its program attached.
func TestLostLeavesOthersState(t *testing.T) {
	testbed.RequireRoot(t)
	tests := []struct {
		name    string
		between func(t *testing.T, ns *testbed.NS, pin string)
	}{
		{name: "warmpath detach, then a new instance", between: func(t *testing.T, _ *testbed.NS, pin string) {
			if err := Uninstall(pin); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "interface recreated, a new instance adopts the maps", between: func(t *testing.T, ns *testbed.NS, _ string) {
			ns.Run("ip", "link", "del", "wlost")
			testbed.Veth(t, ns, "wlost", macIn, ns, "wlostp", macClient)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns, pin := vethBed(t, "others", "wlost")
			var logs1, logs2 bytes.Buffer
			dp1, ck1 := openLost(t, ns, "wlost", pin, &logs1)
			tc.between(t, ns, pin)
			dp2, _ := openLost(t, ns, "wlost", pin, &logs2)
			pins := pinNames(t, pin)

			if err := ck1.Check(); err != nil {
				t.Fatal(err)
			}
			if dp1.Mode() != ModeUserspace {
				t.Fatalf("old instance: mode %s, want userspace", dp1.Mode())
			}
			if left := pinNames(t, pin); len(left) != len(pins) {
				t.Fatalf("after the old instance's fallback: pins %v, want the new instance's %v", left, pins)
			}
			if dp2.Mode() != ModeKernel || !xdpAttached(ns, "wlost") {
				t.Fatalf("new instance: mode %s, attached %v", dp2.Mode(), xdpAttached(ns, "wlost"))
			}
			if bs, err := dp2.Backends(); err != nil || len(bs) != 1 {
				t.Fatalf("new instance's backends: %+v %v", bs, err)
			}
			if err := dp1.Close(); err != nil {
				t.Fatal(err)
			}
			if err := dp2.Close(); err != nil {
				t.Fatal(err)
			}
			if !xdpAttached(ns, "wlost") || len(pinNames(t, pin)) != len(pins) {
				t.Fatalf("after the new instance's Close: attached %v, pins %v", xdpAttached(ns, "wlost"), pinNames(t, pin))
			}
			if err := Uninstall(pin); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// infoFails is a link whose BPF_OBJ_GET_INFO_BY_FD fails.
type infoFails struct{ link.Link }

func (infoFails) Info() (*link.Info, error) { return nil, syscall.EINTR }

// TestKernelCheckInfoFails: a failed info call is not a loss: Check
// returns its error (not ErrLost), the Fallback stays in kernel mode and
// the program attached; the check works again once the call does.
func TestKernelCheckInfoFails(t *testing.T) {
	ns, pin := vethBed(t, "info", "wlost")
	var logs bytes.Buffer
	dp, ck := openLost(t, ns, "wlost", pin, &logs)
	k := dp.(*Fallback).k.(*Kernel)
	k.mu.Lock()
	orig := k.link
	k.link = infoFails{orig}
	k.mu.Unlock()

	if err := k.Check(); err == nil || errors.Is(err, ErrLost) || !errors.Is(err, syscall.EINTR) {
		t.Fatalf("Kernel.Check with a failing info call: %v, want EINTR, not ErrLost", err)
	}
	if err := ck.Check(); !errors.Is(err, syscall.EINTR) {
		t.Fatalf("Fallback.Check: %v, want EINTR passed on", err)
	}
	if dp.Mode() != ModeKernel || !xdpAttached(ns, "wlost") || logs.Len() != 0 {
		t.Fatalf("one failed info call switched: mode %s, attached %v, log %q", dp.Mode(), xdpAttached(ns, "wlost"), logs.String())
	}
	k.mu.Lock()
	k.link = orig
	k.mu.Unlock()
	if err := ck.Check(); err != nil || dp.Mode() != ModeKernel {
		t.Fatalf("Check after recovery: %v, mode %s", err, dp.Mode())
	}
	if err := Uninstall(pin); err != nil {
		t.Fatal(err)
	}
}

// TestKernelLossInsideRange: a RangeAffinity callback that runs the check
// after the program was detached (the loss found inside the range) must
// not deadlock (the release waits for the range), and the kernel side is
// released once the range ended.
func TestKernelLossInsideRange(t *testing.T) {
	ns, pin := vethBed(t, "range", "wlost")
	var logs bytes.Buffer
	dp, ck := openLost(t, ns, "wlost", pin, &logs)
	if err := Uninstall(pin); err != nil {
		t.Fatal(err)
	}
	if seen := rangeReentering(t, dp, ck); seen != 1 {
		t.Fatalf("range: %d entries, want 1", seen)
	}
	k := dp.(*Fallback).k.(*Kernel)
	k.mu.Lock()
	closed := k.closed
	k.mu.Unlock()
	if dp.Mode() != ModeUserspace || !closed {
		t.Fatalf("after the range: mode %s, kernel side released %v", dp.Mode(), closed)
	}
}

// TestFallbackDrainKeepsEstablished: what the program does after its
// writes kept failing and the Fallback switched (run through
// BPF_PROG_TEST_RUN on the edge's own program): the established steered
// connection is still encapsulated to its backend, while a new connection
// from the same client is no longer steered (it reaches the edge's stack,
// the slowpath).
func TestFallbackDrainKeepsEstablished(t *testing.T) {
	e := newEdgeEnv(t)
	var logs bytes.Buffer
	f := NewFallback(e.k, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { _ = f.Close() })
	// A handle of its own: the program outlives the datapath's handles, as
	// an attached one does.
	prog, err := e.k.objs.Steer.Clone()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prog.Close() })
	const client = "10.1.0.2"
	a := Affinity{Client: netip.MustParseAddr(client), Service: vip, Backend: 1, Generation: 1}
	for _, err := range []error{f.SetServices([]Service{vip}),
		f.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}}), f.SetAffinity(a)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	const redirect, pass = 4, 2
	verdict := func(p tcpPkt) uint32 {
		t.Helper()
		v, _ := e.run(t, prog, p.frame())
		return v
	}
	if v := verdict(syn(client, clientPort)); v != redirect {
		t.Fatalf("SYN before: %s, want REDIRECT", xdpVerdicts[v])
	}
	if v := verdict(ack(client, clientPort)); v != redirect {
		t.Fatalf("data before: %s, want REDIRECT", xdpVerdicts[v])
	}

	breakAffinityMap(f)
	for range lostAfterFailures {
		_ = f.SetAffinity(a)
	}
	if !f.Lost() {
		t.Fatal("not lost after failing writes")
	}
	if v := verdict(ack(client, clientPort)); v != redirect {
		t.Fatalf("established connection after the switch: %s, want REDIRECT (still steered to its backend)", xdpVerdicts[v])
	}
	if v := verdict(syn(client, clientPort+1)); v != pass {
		t.Fatalf("new connection after the switch: %s, want PASS (the slowpath)", xdpVerdicts[v])
	}
	if v := verdict(ack(client, clientPort)); v != redirect {
		t.Fatalf("established connection, later: %s, want REDIRECT", xdpVerdicts[v])
	}
	t.Logf("log: %s", strings.TrimSpace(logs.String()))
}
