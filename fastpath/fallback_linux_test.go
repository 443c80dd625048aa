package fastpath

import (
	"bytes"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warmpath/warmpath/fastpath/testbed"
)

// TestKernelLostMidRun: the XDP side torn down from under a running
// datapath. Detaching it (`warmpath detach` = Uninstall, which now detaches
// even a link another process holds) or deleting its interface makes Check
// report ErrLost, map writes that keep failing do it too, and the datapath
// Open returned switches to userspace mode with one ERROR line, the
// program detached; unmounting bpffs is not a loss (the program and maps
// live on through the process's handles and keep steering).
func TestKernelLostMidRun(t *testing.T) {
	testbed.RequireRoot(t)
	tests := []struct {
		name     string
		teardown func(t *testing.T, ns *testbed.NS, pin string)
		lost     bool
	}{
		{name: "warmpath detach", lost: true, teardown: func(t *testing.T, _ *testbed.NS, pin string) {
			if err := Uninstall(pin); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "interface deleted", lost: true, teardown: func(t *testing.T, ns *testbed.NS, _ string) {
			ns.Run("ip", "link", "del", "wlost")
		}},
		{name: "map writes failing", lost: true, teardown: func(t *testing.T, _ *testbed.NS, _ string) {}},
		{name: "bpffs unmounted", teardown: func(t *testing.T, _ *testbed.NS, pin string) {
			if err := unix.Unmount(filepath.Dir(pin), unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := testbed.NewNS(t, "lost")
			testbed.Veth(t, ns, "wlost", macIn, ns, "wlostp", macClient)
			pin := filepath.Join(testbed.BPFFS(t), "warmpath")
			var logs bytes.Buffer
			var dp Datapath
			err := ns.Do(func() (err error) {
				dp, err = Open(Options{Mode: ModeKernel, PinPath: pin, Interface: "wlost", Attach: AttachDriver,
					EncapSource: encapSrc, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
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
			if dp.Mode() != ModeKernel || !xdpAttached(ns, "wlost") {
				t.Fatalf("before: mode %s, attached %v", dp.Mode(), xdpAttached(ns, "wlost"))
			}

			tc.teardown(t, ns, pin)
			if tc.name == "map writes failing" {
				// The affinity map's handle breaks under the datapath (as
				// a kernel refusing every update would): the program stays
				// attached, so only the failing writes can tell.
				k := dp.(*Fallback).k.(*Kernel)
				k.mu.Lock()
				_ = k.objs.Affinity.Close()
				k.mu.Unlock()
				for i := range lostAfterFailures {
					if err := dp.SetAffinity(a); (err == nil) != (i == lostAfterFailures-1) {
						t.Fatalf("write %d with a broken map: %v", i, err)
					}
				}
			}
			if err := ck.Check(); err != nil {
				t.Fatalf("Check after %s: %v", tc.name, err)
			}
			want := ModeKernel
			if tc.lost {
				want = ModeUserspace
			}
			if dp.Mode() != want {
				t.Fatalf("mode %s after %s, want %s", dp.Mode(), tc.name, want)
			}
			if !tc.lost && !xdpAttached(ns, "wlost") {
				t.Fatal("program detached by a bpffs unmount")
			}
			if tc.lost && tc.name != "interface deleted" && xdpAttached(ns, "wlost") {
				t.Fatalf("program still attached after %s: a lost datapath must stop steering", tc.name)
			}
			// The datapath keeps answering, in whichever mode.
			if err := dp.SetAffinity(a); err != nil {
				t.Fatal(err)
			}
			if bs, err := dp.Backends(); err != nil || len(bs) != 1 {
				t.Fatalf("backends after %s: %v %v", tc.name, bs, err)
			}
			if _, err := dp.Counters(); err != nil {
				t.Fatal(err)
			}
			n := strings.Count(logs.String(), "userspace mode")
			if (tc.lost && n != 1) || (!tc.lost && n != 0) {
				t.Fatalf("%d userspace-mode log lines after %s:\n%s", n, tc.name, logs.String())
			}
			t.Logf("%s: mode %s; log: %s", tc.name, dp.Mode(), strings.TrimSpace(logs.String()))
		})
	}
}
