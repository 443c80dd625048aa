package fastpath

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/warmpath/warmpath/bpf"
	"github.com/warmpath/warmpath/fastpath/testbed"
)

func TestKernelContract(t *testing.T) {
	testbed.RequireRoot(t)
	clk := &fakeClock{}
	k, err := OpenKernel(Options{PinPath: filepath.Join(testbed.BPFFS(t), "warmpath"), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	testContract(t, k, clk)
}

func TestCounterLayout(t *testing.T) {
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{
		"counters": uint32(NumCounterKinds) + MaxBackends*uint32(backendSlots),
		"backends": MaxBackends, "services": MaxServices, "affinity": MaxAffinity, "flows": MaxFlows,
	} {
		if got := spec.Maps[name].MaxEntries; got != want {
			t.Errorf("map %s has %d entries, Go expects %d: keep counters.go and warmpath.c in sync", name, got, want)
		}
	}
	// Every counter's metric name is its C enumerator's, read from the
	// object's BTF: C_PASS_NOT_IPV4 is pass_not_ipv4.
	var idx *btf.Enum
	if err := spec.Types.TypeByName("counter_idx", &idx); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, v := range idx.Values {
		if v.Name == "C_GLOBAL_MAX" {
			if CounterKind(v.Value) != NumCounterKinds {
				t.Errorf("C_GLOBAL_MAX = %d, NumCounterKinds = %d", v.Value, NumCounterKinds)
			}
			continue
		}
		seen++
		if got, want := CounterKind(v.Value).String(), strings.ToLower(strings.TrimPrefix(v.Name, "C_")); got != want {
			t.Errorf("%s (%d): metric name %q, want %q", v.Name, v.Value, got, want)
		}
	}
	if seen != int(NumCounterKinds) {
		t.Errorf("%d C counters, %d Go kinds", seen, NumCounterKinds)
	}
}

// openDecapVIP loads xdp_decap (not attached) on a fresh bpffs with vip as
// its one service and source as the edge it accepts (invalid: any).
func openDecapVIP(tb testing.TB, source netip.Addr) *Decap {
	tb.Helper()
	d, err := OpenDecap(DecapOptions{PinPath: filepath.Join(testbed.BPFFS(tb), "decap"), Source: source})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	if err := d.SetServices([]Service{vip}); err != nil {
		tb.Fatal(err)
	}
	return d
}

// vethBed is the setup of the attach tests: root, a fresh namespace with a
// veth pair (dev and dev+"p", MACs macIn and macClient) and a pin path on a
// fresh bpffs.
func vethBed(t *testing.T, tag, dev string) (*testbed.NS, string) {
	t.Helper()
	testbed.RequireRoot(t)
	ns := testbed.NewNS(t, tag)
	testbed.Veth(t, ns, dev, macIn, ns, dev+"p", macClient)
	return ns, filepath.Join(testbed.BPFFS(t), "warmpath")
}

func xdpAttached(ns *testbed.NS, dev string) bool {
	return strings.Contains(ns.Run("ip", "link", "show", "dev", dev), "prog/xdp")
}

// TestPinReload: load, attach, write state, close (program stays attached),
// open again (state is still there, link adopted), detach (all gone).
func TestPinReload(t *testing.T) {
	ns, pin := vethBed(t, "pin", "wpin")
	open := func() *Kernel {
		t.Helper()
		var k *Kernel
		err := ns.Do(func() (err error) {
			k, err = OpenKernel(Options{PinPath: pin, Interface: "wpin", Attach: AttachDriver, EncapSource: encapSrc})
			return err
		})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		return k
	}
	k := open()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	a := Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1, Generation: 7}
	must(k.SetServices([]Service{vip}))
	must(k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 7}}))
	must(k.SetAffinity(a))
	fk := bpf.WarmpathFlowKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 4}
	must(k.objs.Flows.Put(&fk, &bpf.WarmpathFlowVal{Addr: be32(be1Addr), Backend: 1}))
	must(k.Close())
	if !xdpAttached(ns, "wpin") {
		t.Fatal("program detached by Close; steered flows would stop")
	}

	// A read-only opener (warmpath status) must not touch the settings.
	ro, err := OpenKernel(Options{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	var cfg bpf.WarmpathConfig
	must(ro.objs.Settings.Lookup(uint32(0), &cfg))
	if cfg.EncapSrc != be32(encapSrc) || cfg.NhTtlNs != uint64(DefaultNextHopTTL) {
		t.Errorf("settings after a read-only open: %+v", cfg)
	}
	must(ro.Close())

	k = open()
	t.Cleanup(func() { _ = k.Close() })
	svcs, err := k.Services()
	must(err)
	bs, err := k.Backends()
	must(err)
	e, ok, err := k.LookupAffinity(a.Client, a.Service)
	must(err)
	if len(svcs) != 1 || svcs[0] != vip || len(bs) != 1 || bs[0].Generation != 7 || !ok || e.Affinity != a {
		t.Fatalf("state not adopted: services %v backends %+v affinity %+v %v", svcs, bs, e, ok)
	}
	var fv bpf.WarmpathFlowVal
	if err := k.objs.Flows.Lookup(&fk, &fv); err != nil || fv.Backend != 1 {
		t.Fatalf("flow table not adopted: %+v %v", fv, err)
	}
	if !xdpAttached(ns, "wpin") {
		t.Fatal("not attached after reopen")
	}

	must(k.Detach())
	if xdpAttached(ns, "wpin") {
		t.Error("still attached after Detach")
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin path %s still there after Detach: %v", pin, err)
	}
	if err := k.SetServices(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("after Detach: %v, want ErrClosed", err)
	}
}

// TestOpenKernelErrors: no bpffs, missing interface.
func TestOpenKernelErrors(t *testing.T) {
	testbed.RequireRoot(t)
	if _, err := OpenKernel(Options{PinPath: filepath.Join(t.TempDir(), "warmpath")}); err == nil || !strings.Contains(err.Error(), "not a bpffs") {
		t.Errorf("pin path off bpffs: %v", err)
	}
	pin := filepath.Join(testbed.BPFFS(t), "warmpath")
	_, err := OpenKernel(Options{PinPath: pin, Interface: "wp-no-such-if"})
	if err == nil || !strings.Contains(err.Error(), "wp-no-such-if") {
		t.Errorf("missing interface: %v", err)
	}
	ns := testbed.NewNS(t, "attach")
	testbed.Veth(t, ns, "wpin", macIn, ns, "wpinp", macClient)
	err = ns.Do(func() error {
		_, err := OpenKernel(Options{PinPath: pin, Interface: "wpin", Attach: "bogus"})
		return err
	})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("bad attach mode: %v, want ErrInvalid", err)
	}
}

// TestAttachGeneric: generic (skb) mode attaches where asked to.
func TestAttachGeneric(t *testing.T) {
	ns, pin := vethBed(t, "generic", "wpin")
	var k *Kernel
	if err := ns.Do(func() (err error) {
		k, err = OpenKernel(Options{PinPath: pin, Interface: "wpin", Attach: AttachGeneric})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if out := ns.Run("ip", "link", "show", "dev", "wpin"); !strings.Contains(out, "xdpgeneric") {
		t.Errorf("not attached in generic mode:\n%s", out)
	}
	if err := k.Detach(); err != nil {
		t.Fatal(err)
	}
	if xdpAttached(ns, "wpin") || strings.Contains(ns.Run("ip", "link", "show", "dev", "wpin"), "xdp") {
		t.Error("still attached after Detach")
	}
}

func TestDecapFixtures(t *testing.T) {
	testbed.RequireRoot(t)
	edge := netip.MustParseAddr("10.2.0.1")
	d := openDecapVIP(t, edge)
	gpu := netip.MustParseAddr("10.2.0.2")
	inner := ack("10.1.0.2", clientPort)
	innerIP := inner.ip()
	wrapped := encap(innerIP, macBE1, macBE, edge, gpu)
	decapped := append(ethHdr(macBE1, macBE, 0x0800), innerIP...)
	otherSvc := inner
	otherSvc.dst = netip.MustParseAddrPort("10.100.0.1:22")
	fromStranger := encap(innerIP, macBE1, macBE, netip.MustParseAddr("10.2.0.66"), gpu)
	outerOpts := bytes.Clone(wrapped)
	outerOpts[14] = 0x46
	fragment := encap(innerIP, macBE1, macBE, edge, gpu)
	fragment[14+6] = 0x20 // MF
	truncated := wrapped[:14+20+20+10]
	innerBadVer := bytes.Clone(wrapped)
	innerBadVer[14+20] = 0x55

	tests := []struct {
		name string
		in   []byte
		out  []byte // nil: unchanged
		want map[CounterKind]uint64
	}{
		{name: "IPIP for the service is stripped", in: wrapped, out: decapped, want: map[CounterKind]uint64{DecapOK: 1}},
		{name: "steered SYN is stripped", in: encap(syn("10.1.0.2", clientPort).ip(), macBE1, macBE, edge, gpu),
			out: append(ethHdr(macBE1, macBE, 0x0800), syn("10.1.0.2", clientPort).ip()...), want: map[CounterKind]uint64{DecapOK: 1}},
		{name: "plain TCP to the VIP passes", in: inner.frame(), want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "IPIP for another service passes", in: encap(otherSvc.ip(), macBE1, macBE, edge, gpu), want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "IPIP from an unknown source passes", in: fromStranger, want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "outer IP options pass", in: outerOpts, want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "outer fragment passes", in: fragment, want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "IPv6 passes", in: ipv6Frame(macBE1, macBE), want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "truncated outer header passes", in: wrapped[:14+10], want: map[CounterKind]uint64{DecapPass: 1}},
		{name: "truncated inner packet", in: truncated, want: map[CounterKind]uint64{DecapMalformed: 1}},
		{name: "inner version not 4", in: innerBadVer, want: map[CounterKind]uint64{DecapMalformed: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before, err := d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			opts := ebpf.RunOptions{Data: tc.in, DataOut: make([]byte, len(tc.in)+64)}
			verdict, err := d.objs.Decap.Run(&opts)
			if err != nil {
				t.Fatal(err)
			}
			after, err := d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if verdict != 2 {
				t.Errorf("verdict %s, want PASS", xdpVerdicts[verdict])
			}
			want := tc.out
			if want == nil {
				want = tc.in
			}
			if !bytes.Equal(opts.DataOut, want) {
				t.Errorf("output differs\n got %s\nwant %s", hex.EncodeToString(opts.DataOut), hex.EncodeToString(want))
			}
			assertDelta(t, before, after, tc.want)
		})
	}
}

// TestEncapDecapRoundTrip: what the edge emits, the GPU host turns back
// into the client's packet.
func TestEncapDecapRoundTrip(t *testing.T) {
	e := newEdgeEnv(t)
	if err := e.k.SetServices([]Service{vip}); err != nil {
		t.Fatal(err)
	}
	if err := e.k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true}}); err != nil {
		t.Fatal(err)
	}
	if err := e.k.SetAffinity(Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1}); err != nil {
		t.Fatal(err)
	}
	d := openDecapVIP(t, netip.Addr{})
	in := syn("10.1.0.2", clientPort)
	verdict, wire := e.run(t, e.k.objs.Steer, in.frame())
	if verdict != 4 {
		t.Fatalf("edge verdict %s", xdpVerdicts[verdict])
	}
	opts := ebpf.RunOptions{Data: wire, DataOut: make([]byte, len(wire)+64)}
	if _, err := d.objs.Decap.Run(&opts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(opts.DataOut[14:], in.ip()) {
		t.Errorf("round trip changed the packet\n got %x\nwant %x", opts.DataOut[14:], in.ip())
	}
	if !bytes.Equal(opts.DataOut[:12], append(mac(macBE1), mac(macBE)...)) {
		t.Errorf("decap frame MACs %x, want edge->backend", opts.DataOut[:12])
	}
}

// TestUninstall: with a program attached and state pinned by a process
// that is gone, Uninstall (no loading) detaches and removes everything.
func TestUninstall(t *testing.T) {
	ns, pin := vethBed(t, "uninst", "wpin")
	err := ns.Do(func() error {
		k, err := OpenKernel(Options{PinPath: pin, Interface: "wpin", Attach: AttachDriver})
		if err != nil {
			return err
		}
		return k.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	if !xdpAttached(ns, "wpin") {
		t.Fatal("not attached")
	}
	if err := Uninstall(pin); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if xdpAttached(ns, "wpin") {
		t.Error("still attached after Uninstall")
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin path still there: %v", err)
	}
	if err := Uninstall(pin); err != nil {
		t.Errorf("second Uninstall: %v", err)
	}
}

// TestReattachAfterInterfaceRecreated: the pinned link of an interface that
// was deleted and created again is replaced by a fresh attachment.
func TestReattachAfterInterfaceRecreated(t *testing.T) {
	ns, pin := vethBed(t, "recreate", "wpin")
	open := func() {
		t.Helper()
		err := ns.Do(func() error {
			k, err := OpenKernel(Options{PinPath: pin, Interface: "wpin", Attach: AttachDriver})
			if err != nil {
				return err
			}
			return k.Close()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	open()
	ns.Run("ip", "link", "del", "wpin")
	testbed.Veth(t, ns, "wpin", macIn, ns, "wpinp", macClient)
	if xdpAttached(ns, "wpin") {
		t.Fatal("fresh interface already has a program")
	}
	open()
	if !xdpAttached(ns, "wpin") {
		t.Fatal("not re-attached to the recreated interface")
	}
	if err := Uninstall(pin); err != nil {
		t.Fatal(err)
	}
}
