package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/fastpath"
	"github.com/warmpath/warmpath/fastpath/testbed"
	"github.com/warmpath/warmpath/slowpath"
	"github.com/warmpath/warmpath/slowpath/slowpathtest"
)

// TestServeFastpathLostMidRun: the router serves traffic with the XDP fast
// path attached (kernel mode, serve's own wiring: openFastpath and
// startFastpath), and the BPF side is torn down from under it. Every request
// still succeeds, the router logs one line that the fast path is gone,
// warmpath_fastpath_kernel_mode drops to 0 and the control loop keeps
// running without errors. The clients post to the router directly, never
// through the VIP, so this sees no steered connection: what each kind of
// loss does to those is fastpath's TestEndToEndFallback (a detach resets
// them; failing writes leave the program attached and drained, and they
// keep their backend).
func TestServeFastpathLostMidRun(t *testing.T) {
	testbed.RequireRoot(t)
	tests := []struct {
		name     string
		teardown func(t *testing.T, ns *testbed.NS, pin string)
	}{
		{name: "warmpath detach", teardown: func(t *testing.T, _ *testbed.NS, pin string) {
			var out syncBuf
			if err := run(context.Background(), []string{"detach", "--pin-path", pin}, env{stdout: &out, stderr: &out}); err != nil {
				t.Fatalf("warmpath detach: %v: %s", err, out.String())
			}
		}},
		{name: "interface deleted", teardown: func(t *testing.T, ns *testbed.NS, _ string) {
			ns.Run("ip", "link", "del", "wfb")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			en := startEngine(t)
			ns := testbed.NewNS(t, "fb")
			testbed.Veth(t, ns, "wfb", "", ns, "wfbp", "")
			pin := filepath.Join(testbed.BPFFS(t), "warmpath")

			cfg := slowpath.Default()
			cfg.Listen, cfg.Admin = "127.0.0.1:0", ""
			cfg.Replicas = []slowpath.ReplicaConfig{{Address: en.Addr(), Models: []string{"m"}}}
			cfg.Fastpath.Mode, cfg.Fastpath.Interface, cfg.Fastpath.Attach = "kernel", "wfb", "driver"
			cfg.Fastpath.Services = []string{"10.100.0.1:8000"}
			cfg.Fastpath.PinPath = pin
			cfg.Fastpath.RebalanceInterval = 20 * time.Millisecond
			var logs syncBuf
			log := slog.New(slog.NewTextHandler(&logs, nil))
			srv, err := slowpath.New(cfg, log)
			if err != nil {
				t.Fatal(err)
			}
			var dp fastpath.Datapath
			if err := ns.Do(func() (err error) { dp, err = openFastpath(&cfg.Fastpath, nil, log); return err }); err != nil {
				t.Fatal(err)
			}
			fr, err := startFastpath(dp, &cfg.Fastpath, srv, log)
			if err != nil {
				_ = dp.Close()
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := fr.stop(); err != nil {
					t.Errorf("stop fast path: %v", err)
				}
			})
			url := slowpathtest.Serve(t, srv) + "/v1/chat/completions"
			gauge := func(name string) float64 {
				mfs, err := srv.Registry().Gather()
				if err != nil {
					t.Fatal(err)
				}
				var v float64
				for _, mf := range mfs {
					if mf.GetName() == name {
						for _, m := range mf.GetMetric() {
							v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
						}
					}
				}
				return v
			}

			// Four clients send requests until told to stop (bounded).
			var ok, failed atomic.Int64
			var firstErr atomic.Pointer[string]
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for c := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 5000; i++ {
						select {
						case <-stop:
							return
						default:
						}
						resp, err := testClient.Post(url, "application/json", strings.NewReader(chatBody("m", fmt.Sprintf("c%d q%d", c, i))))
						if err == nil {
							b, _ := io.ReadAll(resp.Body)
							resp.Body.Close()
							if resp.StatusCode != 200 || !strings.Contains(string(b), `"choices"`) {
								err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
							}
						}
						if err != nil {
							failed.Add(1)
							msg := err.Error()
							firstErr.CompareAndSwap(nil, &msg)
							continue
						}
						ok.Add(1)
					}
				}()
			}
			defer func() { close(stop); wg.Wait() }()
			waitUntil := func(what string, cond func() bool) {
				t.Helper()
				for range 1000 {
					if cond() {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				t.Fatalf("timed out waiting for %s (ok %d, failed %d)\n%s", what, ok.Load(), failed.Load(), logs.String())
			}
			// The client is promoted: its entry is in the kernel's map.
			client := netip.MustParseAddr("127.0.0.1")
			vip := netip.MustParseAddrPort(cfg.Fastpath.Services[0])
			waitUntil("the client promoted into the kernel datapath", func() bool {
				_, found, err := dp.LookupAffinity(client, vip)
				return err == nil && found && dp.Mode() == fastpath.ModeKernel
			})
			if g := gauge("warmpath_fastpath_kernel_mode"); g != 1 {
				t.Fatalf("kernel_mode %v before the teardown", g)
			}
			before := ok.Load()

			tc.teardown(t, ns, pin)
			waitUntil("kernel_mode 0", func() bool { return gauge("warmpath_fastpath_kernel_mode") == 0 })
			at := ok.Load()
			waitUntil("100 more requests in userspace mode", func() bool { return ok.Load() >= at+100 })
			close(stop)
			wg.Wait()
			stop = make(chan struct{})

			if n := failed.Load(); n != 0 {
				t.Fatalf("%d requests failed (ok %d), first: %s", n, ok.Load(), *firstErr.Load())
			}
			if n := strings.Count(logs.String(), "userspace mode"); n != 1 {
				t.Fatalf("%d log lines about userspace mode, want 1:\n%s", n, logs.String())
			}
			if n := gauge("warmpath_steer_errors_total"); n != 0 {
				t.Fatalf("steer errors_total %v: the control loop failed after the fallback\n%s", n, logs.String())
			}
			if strings.Contains(ns.Run("ip", "link", "show"), "prog/xdp") {
				t.Fatal("xdp program still attached after the teardown")
			}
			t.Logf("%s: %d requests before the teardown, %d after it, 0 failed; log: %s", tc.name, before, ok.Load()-before,
				strings.TrimSpace(logs.String()[strings.Index(logs.String(), "level=ERROR"):]))
		})
	}
}
