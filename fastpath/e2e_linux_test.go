package fastpath

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/warmpath/warmpath/bpf"
	"github.com/warmpath/warmpath/fastpath/testbed"
)

// lineServer answers each line it reads with "<name> <len(line)>\n".
func lineServer(t *testing.T, ns *testbed.NS, addr, name string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatalf("listen in %s: %v", ns.Name, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				r := bufio.NewReaderSize(c, 1<<16)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "%s %d\n", name, len(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

type e2eConn struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, ns *testbed.NS, addr string) *e2eConn {
	t.Helper()
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &e2eConn{Conn: c, r: bufio.NewReader(c)}
}

// ask sends a line of n bytes and returns who answered.
func (c *e2eConn) ask(t *testing.T, n int) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := strings.Repeat("x", n-1) + "\n"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	reply, err := c.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var who string
	var got int
	if _, err := fmt.Sscanf(reply, "%s %d", &who, &got); err != nil || got != n {
		t.Fatalf("reply %q to %d bytes", reply, n)
	}
	return who
}

// TestEndToEndSteering: client ns -> edge ns (xdp_steer on the client-facing
// veth, the slowpath stand-in listening on the VIP) -> backend ns (xdp_decap,
// VIP on lo, a server on the VIP). Settings per docs/fastpath.md. Twice:
// with the backend link's MTU raised by the 20 bytes of IPIP, and with 1500
// everywhere, where large segments only get through because xdp_steer
// answers them with ICMP "fragmentation needed" (path MTU discovery).
func TestEndToEndSteering(t *testing.T) {
	testbed.RequireRoot(t)
	t.Run("backend MTU 1520", func(t *testing.T) { endToEnd(t, false) })
	t.Run("MTU 1500, PMTUD", func(t *testing.T) { endToEnd(t, true) })
}

// e2eNets builds the client, edge and backend namespaces of
// TestEndToEndSteering (pmtud: MTU 1500 everywhere, else the backend link
// raised by the 20 bytes of IPIP).
func e2eNets(t *testing.T, pmtud bool) (cli, edge, be *testbed.NS) {
	t.Helper()
	cli, edge, be = testbed.NewNS(t, "cli"), testbed.NewNS(t, "edge"), testbed.NewNS(t, "be")
	const beMAC = "02:00:00:00:03:02"
	testbed.Veth(t, cli, "c0", "02:00:00:00:03:01", edge, "e0", "02:00:00:00:03:03")
	testbed.Veth(t, edge, "e1", "02:00:00:00:03:04", be, "b0", beMAC)

	cli.Run("ip", "addr", "add", "10.1.0.2/24", "dev", "c0")
	cli.Run("ip", "route", "add", "default", "via", "10.1.0.1")
	cli.Run("ethtool", "-K", "c0", "tx", "off") // veth partial checksums die in a redirect

	edge.Run("ip", "addr", "add", "10.1.0.1/24", "dev", "e0")
	edge.Run("ip", "addr", "add", "10.2.0.1/24", "dev", "e1")
	edge.Run("ip", "addr", "add", "10.100.0.1/32", "dev", "lo")
	edge.Run("ip", "neigh", "replace", "10.2.0.2", "dev", "e1", "lladdr", beMAC, "nud", "permanent")
	edge.Sysctl("net.ipv4.ip_forward", "1")
	edge.Sysctl("net.ipv4.conf.all.rp_filter", "0")
	edge.Sysctl("net.ipv4.conf.e1.rp_filter", "2")
	edge.Sysctl("net.ipv4.conf.e1.accept_local", "1") // replies come from the VIP, local here
	if pmtud {
		// XDP_TX back into a veth is only received if the peer runs XDP.
		passOnClientVeth(t, cli, "c0")
	} else {
		// IPIP adds 20 bytes: the backend link carries client MTU + 20.
		edge.Run("ip", "link", "set", "e1", "mtu", "1520")
		be.Run("ip", "link", "set", "b0", "mtu", "1520")
	}

	be.Run("ip", "addr", "add", "10.2.0.2/24", "dev", "b0")
	be.Run("ip", "addr", "add", "10.100.0.1/32", "dev", "lo")
	be.Run("ip", "route", "add", "default", "via", "10.2.0.1")
	be.Sysctl("net.ipv4.conf.all.arp_ignore", "1")
	be.Sysctl("net.ipv4.conf.all.arp_announce", "2")
	be.Sysctl("net.ipv4.conf.all.rp_filter", "0")
	be.Sysctl("net.ipv4.conf.b0.rp_filter", "0")
	return cli, edge, be
}

func endToEnd(t *testing.T, pmtud bool) {
	cli, edge, be := e2eNets(t, pmtud)
	bpffs := testbed.BPFFS(t)
	var k *Kernel
	openEdge := func() {
		t.Helper()
		if err := edge.Do(func() (err error) {
			k, err = OpenKernel(Options{PinPath: filepath.Join(bpffs, "edge"), Interface: "e0", Attach: AttachDriver,
				EncapSource: netip.MustParseAddr("10.2.0.1")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	openEdge()
	t.Cleanup(func() { _ = k.Detach() })
	d := openTestDecap(t, be, bpffs)

	svc, client := e2eServe(t, k, d, edge, be)

	local := dial(t, cli, svc.String())
	if who := local.ask(t, 100); who != "edge" {
		t.Fatalf("no affinity: answered by %s, want edge", who)
	}
	if err := k.SetAffinity(Affinity{Client: client, Service: svc, Backend: 1, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if who := local.ask(t, 100); who != "edge" {
		t.Fatalf("established local connection hijacked to %s", who)
	}
	steered := dial(t, cli, svc.String())
	if who := steered.ask(t, 100); who != "backend" {
		t.Fatalf("follow-up connection answered by %s, want backend", who)
	}
	if who := steered.ask(t, 100_000); who != "backend" {
		t.Fatalf("100 KB request on the steered connection answered by %s", who)
	}
	// warmpath restarts: Close keeps the program attached and the flow
	// table pinned, so the steered connection keeps flowing with no process
	// holding the datapath, and the next process adopts everything.
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if who := steered.ask(t, 100); who != "backend" {
		t.Fatalf("steered connection answered by %s while warmpath was down", who)
	}
	openEdge()
	if who := steered.ask(t, 100); who != "backend" {
		t.Fatalf("steered connection answered by %s after restart", who)
	}
	if err := k.DeleteAffinity(client, svc); err != nil {
		t.Fatal(err)
	}
	if who := steered.ask(t, 100); who != "backend" {
		t.Fatalf("steered connection moved to %s after the affinity was deleted", who)
	}
	if who := dial(t, cli, svc.String()).ask(t, 100); who != "edge" {
		t.Fatalf("new connection without affinity answered by %s", who)
	}

	kc, err := k.Counters()
	if err != nil {
		t.Fatal(err)
	}
	dc, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if kc.Global[FlowNewSteer].Packets != 1 || kc.Global[Steered].Packets < 5 || kc.Global[FlowNewLocal].Packets != 2 {
		t.Errorf("edge counters: new_steer %d steered %d new_local %d", kc.Global[FlowNewSteer].Packets,
			kc.Global[Steered].Packets, kc.Global[FlowNewLocal].Packets)
	}
	if dc.Global[DecapOK].Packets != kc.Global[Steered].Packets {
		t.Errorf("decapsulated %d packets, edge steered %d", dc.Global[DecapOK].Packets, kc.Global[Steered].Packets)
	}
	if kc.Global[Dropped].Packets != 0 {
		t.Errorf("edge dropped %d packets", kc.Global[Dropped].Packets)
	}
	if icmp := kc.Global[ICMPFragNeeded].Packets; (icmp > 0) != pmtud || icmp != kc.Global[ErrFragNeeded].Packets {
		t.Errorf("ICMP frag needed sent %d, too-big packets %d (PMTUD case: %v)", icmp, kc.Global[ErrFragNeeded].Packets, pmtud)
	}
	if t.Failed() {
		var sb strings.Builder
		_ = WriteStatus(&sb, k)
		t.Log(sb.String())
	}
}

// passOnClientVeth attaches the bare xdp_pass program to dev in ns.
func passOnClientVeth(t *testing.T, ns *testbed.NS, dev string) {
	t.Helper()
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		t.Fatal(err)
	}
	var objs struct {
		Pass *ebpf.Program `ebpf:"xdp_pass"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = objs.Pass.Close() })
	err = ns.Do(func() error {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: objs.Pass, Interface: iface.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = l.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("attach xdp_pass to %s: %v", dev, err)
	}
}

// e2eServe writes the e2e service (10.100.0.1:8000) to the edge datapath
// and the decap program, backend 1 (10.2.0.2, healthy, generation 1) to
// the edge, starts a line server on the service in the edge and backend
// namespaces (answering "edge" and "backend"), and returns the service and
// the client address (10.1.0.2).
func e2eServe(t *testing.T, dp Datapath, d *Decap, edge, be *testbed.NS) (Service, netip.Addr) {
	t.Helper()
	svc := netip.MustParseAddrPort("10.100.0.1:8000")
	for _, err := range []error{
		dp.SetServices([]Service{svc}),
		dp.SetBackends([]Backend{{ID: 1, Addr: netip.MustParseAddr("10.2.0.2"), Healthy: true, Generation: 1}}),
		d.SetServices([]Service{svc}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	lineServer(t, edge, svc.String(), "edge")
	lineServer(t, be, svc.String(), "backend")
	return svc, netip.MustParseAddr("10.1.0.2")
}

// TestEndToEndFallback: what a fast-path loss does to connections, on real
// TCP through the e2e topology. Writes that keep failing switch the
// Fallback to userspace but leave the program attached and drained: the
// established steered connection keeps reaching its backend, a new one
// from the same client goes to the edge (the slowpath). `warmpath detach`
// takes the program off: the established steered connection's next
// packets reach the edge's stack, which resets it; new connections go to
// the edge.
func TestEndToEndFallback(t *testing.T) {
	testbed.RequireRoot(t)
	tests := []struct {
		name      string
		lose      func(t *testing.T, dp Datapath, pin string)
		keepsFlow bool
	}{
		{name: "map writes failing", keepsFlow: true, lose: func(t *testing.T, dp Datapath, _ string) {
			breakAffinityMap(dp)
			a := Affinity{Client: netip.MustParseAddr("10.1.0.9"), Service: vip, Backend: 1, Generation: 1}
			for range lostAfterFailures {
				_ = dp.SetAffinity(a)
			}
		}},
		{name: "warmpath detach", lose: func(t *testing.T, dp Datapath, pin string) {
			if err := Uninstall(pin); err != nil {
				t.Fatal(err)
			}
			if err := dp.(Checker).Check(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cli, edge, be := e2eNets(t, false)
			bpffs := testbed.BPFFS(t)
			pin := filepath.Join(bpffs, "edge")
			var dp Datapath
			if err := edge.Do(func() (err error) {
				dp, err = Open(Options{Mode: ModeKernel, PinPath: pin, Interface: "e0", Attach: AttachDriver,
					EncapSource: netip.MustParseAddr("10.2.0.1"), Logger: slog.New(slog.DiscardHandler)})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = dp.Close(); _ = Uninstall(pin) })
			d := openTestDecap(t, be, bpffs)
			svc, client := e2eServe(t, dp, d, edge, be)
			if err := dp.SetAffinity(Affinity{Client: client, Service: svc, Backend: 1, Generation: 1}); err != nil {
				t.Fatal(err)
			}
			// A reset connection's backend end never hears of it: close it
			// there, or the server waits for its deadline.
			t.Cleanup(func() { be.Run("ss", "-K", "state", "established", "src", svc.String()) })
			steered := dial(t, cli, svc.String())
			if who := steered.ask(t, 100); who != "backend" {
				t.Fatalf("steered connection answered by %s before the loss", who)
			}

			tc.lose(t, dp, pin)
			if dp.Mode() != ModeUserspace {
				t.Fatalf("mode %s after the loss", dp.Mode())
			}
			if tc.keepsFlow {
				for _, n := range []int{100, 100_000} {
					if who := steered.ask(t, n); who != "backend" {
						t.Fatalf("established steered connection answered by %s after the loss", who)
					}
				}
			} else {
				_ = steered.SetDeadline(time.Now().Add(10 * time.Second))
				_, werr := io.WriteString(steered, "x\n")
				_, rerr := steered.r.ReadString('\n')
				if werr == nil && rerr == nil {
					t.Fatal("established steered connection still answered after the program was detached")
				}
				t.Logf("established steered connection after detach: write %v, read %v", werr, rerr)
			}
			if who := dial(t, cli, svc.String()).ask(t, 100); who != "edge" {
				t.Fatalf("new connection after the loss answered by %s, want the edge", who)
			}
		})
	}
}

// openTestDecap attaches the decap program to b0 in be (the backend
// namespace), accepting the edge's encapsulation source 10.2.0.1; it is
// detached at cleanup.
func openTestDecap(t *testing.T, be *testbed.NS, bpffs string) *Decap {
	t.Helper()
	var d *Decap
	if err := be.Do(func() (err error) {
		d, err = OpenDecap(DecapOptions{PinPath: filepath.Join(bpffs, "decap"), Interface: "b0", Attach: AttachDriver,
			Source: netip.MustParseAddr("10.2.0.1")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Detach() })
	return d
}
