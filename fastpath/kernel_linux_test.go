package fastpath

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/warmpath/warmpath/bpf"
	"github.com/warmpath/warmpath/fastpath/testbed"
)

// Addresses inside the test's own network namespace.
const (
	macIn     = "02:00:00:00:01:01" // edge, client-facing
	macClient = "02:00:00:00:01:02"
	macBE     = "02:00:00:00:02:01" // edge, backend-facing
	macBE1    = "02:00:00:00:02:02" // backend 1 (10.2.0.2)
	macBE4    = "02:00:00:00:02:04" // backend 4 (10.2.0.4)
)

var (
	vip        = netip.MustParseAddrPort("10.100.0.1:8000")
	encapSrc   = netip.MustParseAddr("10.2.0.1")
	be1Addr    = netip.MustParseAddr("10.2.0.2")
	be4Addr    = netip.MustParseAddr("10.2.0.4")
	beNoNeigh  = netip.MustParseAddr("10.2.0.9")
	beNoRoute  = netip.MustParseAddr("10.9.9.9")
	clientPort = uint16(40000)
)

// xdpMd mirrors struct xdp_md for BPF_PROG_TEST_RUN's context.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// edgeEnv is an edge host in a fresh netns: a client-facing veth (wpin), a
// backend-facing veth (wpbe, 10.2.0.1/24) with static neighbours for
// 10.2.0.2 and 10.2.0.4, forwarding on; the datapath loaded with its maps
// pinned on a private bpffs, not attached (programs run via test-run).
type edgeEnv struct {
	ns      *testbed.NS
	k       *Kernel
	ifindex int
	pin     string
	extra   struct {
		Pass *ebpf.Program `ebpf:"xdp_pass"`
	}
}

func newEdgeEnv(t testing.TB) *edgeEnv {
	t.Helper()
	return newEdgeEnvOpts(t, Options{NextHopTTL: -1})
}

// newEdgeEnvOpts is newEdgeEnv with datapath options (PinPath and
// EncapSource are set here).
func newEdgeEnvOpts(t testing.TB, opts Options) *edgeEnv {
	t.Helper()
	testbed.RequireRoot(t)
	ns := testbed.NewNS(t, "edge")
	testbed.Veth(t, ns, "wpin", macIn, ns, "wpinp", macClient)
	testbed.Veth(t, ns, "wpbe", macBE, ns, "wpbep", macBE1)
	ns.Run("ip", "addr", "add", "10.1.0.1/24", "dev", "wpin")
	ns.Run("ip", "addr", "add", "10.2.0.1/24", "dev", "wpbe")
	ns.Run("ip", "neigh", "replace", "10.2.0.2", "dev", "wpbe", "lladdr", macBE1, "nud", "permanent")
	ns.Run("ip", "neigh", "replace", "10.2.0.4", "dev", "wpbe", "lladdr", macBE4, "nud", "permanent")
	ns.Sysctl("net.ipv4.ip_forward", "1")
	pin := filepath.Join(testbed.BPFFS(t), "warmpath")
	opts.PinPath, opts.EncapSource = pin, encapSrc
	k, err := OpenKernel(opts)
	if err != nil {
		t.Fatalf("open kernel datapath: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	e := &edgeEnv{ns: ns, k: k, ifindex: ns.Ifindex("wpin"), pin: pin}
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.LoadAndAssign(&e.extra, nil); err != nil {
		t.Fatalf("load xdp_pass: %v", err)
	}
	t.Cleanup(func() { _ = e.extra.Pass.Close() })
	return e
}

// run runs prog on in as if received on wpin, on CPU 0; returns verdict
// and output.
func (e *edgeEnv) run(t testing.TB, prog *ebpf.Program, in []byte) (uint32, []byte) {
	t.Helper()
	return e.runOn(t, 0, prog, in)
}

// steerClient sets one service (vip), one healthy backend (be1Addr, ID 1)
// and an affinity of client 10.1.0.2 to it, all at generation gen.
func (e *edgeEnv) steerClient(tb testing.TB, gen uint32) {
	tb.Helper()
	for _, err := range []error{
		e.k.SetServices([]Service{vip}),
		e.k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: gen}}),
		e.k.SetAffinity(Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1, Generation: gen}),
	} {
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// runOn is run on the given CPU.
func (e *edgeEnv) runOn(t testing.TB, cpu int, prog *ebpf.Program, in []byte) (uint32, []byte) {
	t.Helper()
	return e.runRepeatOn(t, cpu, prog, in, 0)
}

// runRepeatOn runs prog repeat times (0: once) in one BPF_PROG_TEST_RUN on
// the given CPU, as received on wpin, and returns the last run's verdict
// and output.
func (e *edgeEnv) runRepeatOn(t testing.TB, cpu int, prog *ebpf.Program, in []byte, repeat uint32) (uint32, []byte) {
	t.Helper()
	opts := ebpf.RunOptions{
		Data:    in,
		DataOut: make([]byte, len(in)+256),
		Context: xdpMd{DataEnd: uint32(len(in)), IngressIfindex: uint32(e.ifindex)},
		Repeat:  repeat,
	}
	var ret uint32
	err := e.ns.Do(func() error {
		// Per-CPU state (next-hop cache, sampling) must see one CPU.
		var orig, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			return err
		}
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &orig)
		var err error
		ret, err = prog.Run(&opts)
		return err
	})
	if err != nil {
		t.Fatalf("prog run: %v", err)
	}
	return ret, opts.DataOut
}

func counters(t testing.TB, dp Datapath) Counters {
	t.Helper()
	c, err := dp.Counters()
	if err != nil {
		t.Fatalf("counters: %v", err)
	}
	return c
}

// assertDelta checks that exactly the kinds in want moved, by want packets.
func assertDelta(t *testing.T, before, after Counters, want map[CounterKind]uint64) {
	t.Helper()
	for k := range NumCounterKinds {
		got := after.Global[k].Packets - before.Global[k].Packets
		if got != want[k] {
			t.Errorf("counter %v moved by %d, want %d", k, got, want[k])
		}
	}
}

var xdpVerdicts = map[uint32]string{0: "ABORTED", 1: "DROP", 2: "PASS", 3: "TX", 4: "REDIRECT"}

func syn(client string, sport uint16) tcpPkt {
	return tcpPkt{srcMAC: macClient, dstMAC: macIn, src: netip.AddrPortFrom(netip.MustParseAddr(client), sport),
		dst: vip, flags: fSYN, fragOff: 0x4000, id: 0x1234}
}

func ack(client string, sport uint16) tcpPkt {
	p := syn(client, sport)
	p.flags = fACK | fPSH
	p.payload = []byte("POST /v1/chat/completions HTTP/1.1\r\n")
	return p
}

// bigAck is a data segment whose encapsulation exceeds a 1400-byte MTU.
func bigAck(client string, fragOff uint16) []byte {
	p := ack(client, clientPort)
	p.payload = make([]byte, 1400-40-10)
	p.fragOff = fragOff
	return p.frame()
}

func TestSteerFixtures(t *testing.T) {
	e := newEdgeEnv(t)
	k := e.k
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(k.SetServices([]Service{vip}))
	must(k.SetBackends([]Backend{
		{ID: 1, Addr: be1Addr, Healthy: true, Generation: 7},
		{ID: 2, Addr: be1Addr, Healthy: true, Generation: 3},
		{ID: 3, Addr: beNoNeigh, Healthy: true, Generation: 1},
		{ID: 4, Addr: be4Addr, Healthy: true, Generation: 1},
		{ID: 5, Addr: beNoRoute, Healthy: true, Generation: 1},
		{ID: 6, Addr: be1Addr, Healthy: false, Generation: 1},
		{ID: 7, Addr: be1Addr, Healthy: true, Generation: 1, SampleEvery: 1},
		{ID: 8, Addr: be1Addr, Healthy: true, Generation: 1, SampleEvery: 2},
	}))
	aff := func(client string, backend BackendID, gen uint32) {
		t.Helper()
		must(k.SetAffinity(Affinity{Client: netip.MustParseAddr(client), Service: vip, Backend: backend, Generation: gen}))
	}
	steered := func(p tcpPkt, dst netip.Addr, dstMAC string) []byte {
		return encap(p.ip(), dstMAC, macBE, encapSrc, dst)
	}

	withOpts := syn("10.1.0.20", clientPort)
	withOpts.ipOpts = []byte{0x01, 0x01, 0x01, 0x00} // NOP NOP NOP EOL
	udp := syn("10.1.0.2", clientPort)
	udp.proto = 17
	frag := syn("10.1.0.2", clientPort)
	frag.fragOff = 0x2000 // MF
	fragTail := syn("10.1.0.2", clientPort)
	fragTail.fragOff = 0x0010
	otherPort := syn("10.1.0.2", clientPort)
	otherPort.dst = netip.AddrPortFrom(vip.Addr(), 9999)
	nonVIP := syn("10.1.0.2", clientPort)
	nonVIP.dst = netip.MustParseAddrPort("10.1.0.1:8000")
	valid := syn("10.1.0.2", clientPort).frame()
	badVersion := bytes.Clone(valid)
	badVersion[14] = 0x65
	badIHL := bytes.Clone(valid)
	badIHL[14] = 0x44
	shortTCP := valid[:14+20+10]
	longTotLen := bytes.Clone(valid)
	longTotLen[14+3] += 40
	badDoff := bytes.Clone(valid)
	badDoff[14+20+12] = 4 << 4

	tests := []struct {
		name    string
		setup   func()
		in      []byte
		verdict uint32
		out     []byte // nil: output must equal input
		want    map[CounterKind]uint64
		backend map[BackendID][3]uint64 // steered, syn, sampled packet deltas
	}{
		{name: "non-VIP destination passes", in: nonVIP.frame(), verdict: 2,
			want: map[CounterKind]uint64{PassNotService: 1}},
		{name: "VIP on another port passes", in: otherPort.frame(), verdict: 2,
			want: map[CounterKind]uint64{PassNotService: 1}},
		{name: "UDP to VIP passes", in: udp.frame(), verdict: 2,
			want: map[CounterKind]uint64{PassNotService: 1}},
		{name: "IPv6 passes", in: ipv6Frame(macIn, macClient), verdict: 2,
			want: map[CounterKind]uint64{PassNotIPv4: 1}},
		{name: "ARP passes", in: append(ethHdr("ff:ff:ff:ff:ff:ff", macClient, 0x0806), make([]byte, 28)...), verdict: 2,
			want: map[CounterKind]uint64{PassNotIPv4: 1}},
		{name: "truncated IPv4 header", in: valid[:14+12], verdict: 2,
			want: map[CounterKind]uint64{ErrMalformed: 1}},
		{name: "truncated TCP header", in: shortTCP, verdict: 2,
			want: map[CounterKind]uint64{ErrMalformed: 1}},
		{name: "total length beyond frame", in: longTotLen, verdict: 2,
			want: map[CounterKind]uint64{ErrMalformed: 1}},
		{name: "IP version 6 in IPv4 frame", in: badVersion, verdict: 2,
			want: map[CounterKind]uint64{ErrMalformed: 1}},
		{name: "IHL below 5", in: badIHL, verdict: 2,
			want: map[CounterKind]uint64{ErrMalformed: 1}},
		{name: "TCP data offset below 5", in: badDoff, verdict: 2,
			want: map[CounterKind]uint64{ErrMalformed: 1}},
		{name: "first fragment passes", setup: func() { aff("10.1.0.2", 1, 7) }, in: frag.frame(), verdict: 2,
			want: map[CounterKind]uint64{PassFragment: 1}},
		{name: "later fragment passes", in: fragTail.frame(), verdict: 2,
			want: map[CounterKind]uint64{PassFragment: 1}},
		{name: "SYN without affinity goes local", in: syn("10.1.0.3", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{FlowNewLocal: 1, PassLocal: 1}},
		{name: "SYN with affinity is encapsulated to the backend", in: syn("10.1.0.2", clientPort).frame(),
			verdict: 4, out: steered(syn("10.1.0.2", clientPort), be1Addr, macBE1),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 1, 0}}},
		{name: "established steered flow follows its backend", in: ack("10.1.0.2", clientPort).frame(),
			verdict: 4, out: steered(ack("10.1.0.2", clientPort), be1Addr, macBE1),
			want:    map[CounterKind]uint64{Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 0, 0}}},
		{name: "steered flow keeps its backend after the affinity moves",
			setup: func() { aff("10.1.0.2", 4, 1) }, in: ack("10.1.0.2", clientPort).frame(),
			verdict: 4, out: steered(ack("10.1.0.2", clientPort), be1Addr, macBE1),
			want:    map[CounterKind]uint64{Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 0, 0}}},
		{name: "steered flow keeps its backend after the affinity is deleted",
			setup: func() { must(k.DeleteAffinity(netip.MustParseAddr("10.1.0.2"), vip)) },
			in:    ack("10.1.0.2", clientPort).frame(), verdict: 4,
			out:     steered(ack("10.1.0.2", clientPort), be1Addr, macBE1),
			want:    map[CounterKind]uint64{Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 0, 0}}},
		{name: "local flow stays local after an affinity appears",
			setup: func() { aff("10.1.0.3", 1, 7) }, in: ack("10.1.0.3", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{PassLocal: 1}},
		{name: "retransmitted SYN of a local flow stays local", in: syn("10.1.0.3", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{PassLocal: 1}},
		{name: "new connection of that client is steered", in: syn("10.1.0.3", clientPort+1).frame(),
			verdict: 4, out: steered(syn("10.1.0.3", clientPort+1), be1Addr, macBE1),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 1, 0}}},
		{name: "SYN with IP options is encapsulated unchanged", setup: func() { aff("10.1.0.20", 1, 7) },
			in: withOpts.frame(), verdict: 4, out: steered(withOpts, be1Addr, macBE1),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 1, 0}}},
		{name: "stale generation goes local", setup: func() { aff("10.1.0.4", 2, 2) },
			in: syn("10.1.0.4", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{AffinityStale: 1, FlowNewLocal: 1, PassLocal: 1}},
		{name: "bumped generation invalidates the entry",
			setup: func() {
				aff("10.1.0.5", 2, 3)
				if g, err := k.BumpGeneration(2); err != nil || g != 4 {
					t.Fatalf("bump: %d %v", g, err)
				}
			},
			in: syn("10.1.0.5", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{AffinityStale: 1, FlowNewLocal: 1, PassLocal: 1}},
		{name: "unhealthy backend goes local", setup: func() { aff("10.1.0.6", 6, 1) },
			in: syn("10.1.0.6", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{AffinityStale: 1, FlowNewLocal: 1, PassLocal: 1}},
		{name: "non-SYN without flow is steered from affinity", setup: func() { aff("10.1.0.7", 1, 7) },
			in: ack("10.1.0.7", clientPort).frame(), verdict: 4,
			out:     steered(ack("10.1.0.7", clientPort), be1Addr, macBE1),
			want:    map[CounterKind]uint64{FlowRestored: 1, Steered: 1},
			backend: map[BackendID][3]uint64{1: {1, 0, 0}}},
		{name: "non-SYN without flow or affinity passes", in: ack("10.1.0.8", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{PassNoState: 1}},
		{name: "it is then remembered as local", setup: func() { aff("10.1.0.8", 1, 7) },
			in: ack("10.1.0.8", clientPort).frame(), verdict: 2,
			want: map[CounterKind]uint64{PassLocal: 1}},
		{name: "sampled SYN goes to the slowpath", setup: func() { aff("10.1.0.9", 7, 1) },
			in: syn("10.1.0.9", clientPort).frame(), verdict: 2,
			want:    map[CounterKind]uint64{Sampled: 1, FlowNewLocal: 1, PassLocal: 1},
			backend: map[BackendID][3]uint64{7: {0, 1, 1}}},
		{name: "every 2nd SYN sampled: 1st steered", setup: func() { aff("10.1.0.14", 8, 1) },
			in: syn("10.1.0.14", clientPort).frame(), verdict: 4,
			out:     steered(syn("10.1.0.14", clientPort), be1Addr, macBE1),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1},
			backend: map[BackendID][3]uint64{8: {1, 1, 0}}},
		{name: "every 2nd SYN sampled: 2nd to the slowpath",
			in: syn("10.1.0.14", clientPort+1).frame(), verdict: 2,
			want:    map[CounterKind]uint64{Sampled: 1, FlowNewLocal: 1, PassLocal: 1},
			backend: map[BackendID][3]uint64{8: {0, 1, 1}}},
		{name: "every 2nd SYN sampled: 3rd steered",
			in: syn("10.1.0.14", clientPort+2).frame(), verdict: 4,
			out:     steered(syn("10.1.0.14", clientPort+2), be1Addr, macBE1),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1},
			backend: map[BackendID][3]uint64{8: {1, 1, 0}}},
		{name: "unresolved neighbour: encapsulated and passed to the stack", setup: func() { aff("10.1.0.10", 3, 1) },
			in: syn("10.1.0.10", clientPort).frame(), verdict: 2,
			out:     encap(syn("10.1.0.10", clientPort).ip(), macIn, macClient, encapSrc, beNoNeigh),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, SteeredStack: 1},
			backend: map[BackendID][3]uint64{3: {1, 1, 0}}},
		{name: "no route to backend: new connection goes local", setup: func() { aff("10.1.0.11", 5, 1) },
			in: syn("10.1.0.11", clientPort).frame(), verdict: 2,
			want:    map[CounterKind]uint64{FlowNewSteer: 1, ErrFIB: 1, PassLocal: 1},
			backend: map[BackendID][3]uint64{5: {0, 1, 0}}},
		{name: "SYN to backend 4 is steered", setup: func() { aff("10.1.0.12", 4, 1) },
			in: syn("10.1.0.12", clientPort).frame(), verdict: 4,
			out:     steered(syn("10.1.0.12", clientPort), be4Addr, macBE4),
			want:    map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1},
			backend: map[BackendID][3]uint64{4: {1, 1, 0}}},
		{name: "route to its backend blackholed: established flow dropped",
			setup: func() { e.ns.Run("ip", "route", "add", "blackhole", be4Addr.String()+"/32") },
			in:    ack("10.1.0.12", clientPort).frame(), verdict: 1,
			want: map[CounterKind]uint64{ErrFIB: 1, Dropped: 1}},
		{name: "too big after encapsulation: ICMP fragmentation needed to the client",
			setup: func() {
				e.ns.Run("ip", "link", "set", "wpbe", "mtu", "1400")
				aff("10.1.0.13", 1, 7)
			},
			in:      bigAck("10.1.0.13", 0x4000),
			verdict: 3,
			out:     icmpFragNeeded(bigAck("10.1.0.13", 0x4000), macClient, macIn, 1400),
			want:    map[CounterKind]uint64{FlowRestored: 1, ErrFragNeeded: 1, ICMPFragNeeded: 1}},
		{name: "too big without DF: dropped (XDP cannot fragment)",
			in: bigAck("10.1.0.13", 0), verdict: 1,
			want: map[CounterKind]uint64{ErrFragNeeded: 1, Dropped: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			before := counters(t, k)
			verdict, out := e.run(t, k.objs.Steer, tc.in)
			after := counters(t, k)
			if verdict != tc.verdict {
				t.Errorf("verdict %s, want %s", xdpVerdicts[verdict], xdpVerdicts[tc.verdict])
			}
			want := tc.out
			if want == nil {
				want = tc.in
			}
			if verdict != 1 && !bytes.Equal(out, want) {
				t.Errorf("output differs\n got %s\nwant %s", hex.EncodeToString(out), hex.EncodeToString(want))
			}
			assertDelta(t, before, after, tc.want)
			for id := range BackendID(MaxBackends) {
				b0, b1 := before.Backend(id), after.Backend(id)
				got := [3]uint64{b1.Steered.Packets - b0.Steered.Packets, b1.SYN.Packets - b0.SYN.Packets, b1.Sampled.Packets - b0.Sampled.Packets}
				if got != tc.backend[id] {
					t.Errorf("backend %d counters moved by %v, want %v", id, got, tc.backend[id])
				}
			}
			if bytes := after.Global[PassLocal].Bytes - before.Global[PassLocal].Bytes; tc.want[PassLocal] == 1 && bytes != uint64(len(tc.in)) {
				t.Errorf("pass_local bytes moved by %d, want %d", bytes, len(tc.in))
			}
		})
	}
}

// TestServiceRemoval: established packets follow the flow table (and its
// per-CPU cache) without the services map, so removing a service must take
// its flows with it: an established steered flow of a removed service is
// passed (as the services map alone would decide), while a flow of another
// VIP on the same port is still steered; the port filter keeps exactly the
// ports of the services.
func TestServiceRemoval(t *testing.T) {
	e := newEdgeEnv(t)
	k := e.k
	vip2 := netip.AddrPortFrom(netip.MustParseAddr("10.100.0.2"), vip.Port())
	vip3 := netip.AddrPortFrom(vip.Addr(), vip.Port()+1)
	client := netip.MustParseAddr("10.1.0.2")
	for _, err := range []error{
		k.SetServices([]Service{vip, vip2, vip3}),
		k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}}),
		k.SetAffinity(Affinity{Client: client, Service: vip, Backend: 1, Generation: 1}),
		k.SetAffinity(Affinity{Client: client, Service: vip2, Backend: 1, Generation: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	to := func(p tcpPkt, svc Service) tcpPkt {
		p.dst = svc
		return p
	}
	flowKey := func(svc Service) bpf.WarmpathFlowKey {
		return bpf.WarmpathFlowKey{Saddr: be32(client), Daddr: be32(svc.Addr()), Sport: be16(clientPort), Dport: be16(svc.Port())}
	}
	portSet := func(port uint16) bool {
		var bits uint64
		if err := k.objs.SvcPorts.Lookup(uint32(port>>6), &bits); err != nil {
			t.Fatal(err)
		}
		return bits>>(port&63)&1 == 1
	}
	steps := []struct {
		name    string
		setup   func()
		in      tcpPkt
		verdict uint32
		want    map[CounterKind]uint64
	}{
		{name: "SYN to the first service is steered", in: syn("10.1.0.2", clientPort), verdict: 4,
			want: map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1}},
		{name: "its established packet is steered", in: ack("10.1.0.2", clientPort), verdict: 4,
			want: map[CounterKind]uint64{Steered: 1}},
		{name: "SYN to another VIP on the same port is steered", in: to(syn("10.1.0.2", clientPort), vip2), verdict: 4,
			want: map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1}},
		{name: "first service removed: its established flow passes",
			setup: func() {
				if err := k.SetServices([]Service{vip2}); err != nil {
					t.Fatal(err)
				}
				var fv bpf.WarmpathFlowVal
				if err := k.objs.Flows.Lookup(flowKey(vip), &fv); !errors.Is(err, ebpf.ErrKeyNotExist) {
					t.Errorf("flow of the removed service: %v, want ErrKeyNotExist", err)
				}
				if err := k.objs.Flows.Lookup(flowKey(vip2), &fv); err != nil {
					t.Errorf("flow of the kept service: %v", err)
				}
				if !portSet(vip.Port()) || portSet(vip3.Port()) {
					t.Errorf("port filter: %d set %v, %d set %v; want only the kept service's port",
						vip.Port(), portSet(vip.Port()), vip3.Port(), portSet(vip3.Port()))
				}
			},
			in: ack("10.1.0.2", clientPort), verdict: 2, want: map[CounterKind]uint64{PassNotService: 1}},
		{name: "the kept service's established flow is still steered", in: to(ack("10.1.0.2", clientPort), vip2),
			verdict: 4, want: map[CounterKind]uint64{Steered: 1}},
		{name: "service back: a new connection to it is steered again",
			setup: func() {
				if err := k.SetServices([]Service{vip, vip2}); err != nil {
					t.Fatal(err)
				}
			},
			in: syn("10.1.0.2", clientPort+1), verdict: 4, want: map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.setup != nil {
				st.setup()
			}
			before := counters(t, k)
			verdict, _ := e.run(t, k.objs.Steer, st.in.frame())
			after := counters(t, k)
			if verdict != st.verdict {
				t.Fatalf("verdict %s, want %s", xdpVerdicts[verdict], xdpVerdicts[st.verdict])
			}
			assertDelta(t, before, after, st.want)
		})
	}
}

// TestFlowCache: established packets are decided from a per-CPU copy of
// the flow table. The program's own re-decision (a retransmitted SYN whose
// backend became unusable goes local) replaces its CPU's copy at once;
// another CPU's copy is used for at most FLOW_CACHE_TICKS jiffies (64) and
// the flow table decides after that.
func TestFlowCache(t *testing.T) {
	e := newEdgeEnv(t)
	k := e.k
	multi := runtime.NumCPU() > 1
	for _, err := range []error{
		k.SetServices([]Service{vip}),
		k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}}),
		k.SetAffinity(Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 1, Generation: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	expect := func(cpu int, p tcpPkt, want uint32) {
		t.Helper()
		if v, _ := e.runOn(t, cpu, k.objs.Steer, p.frame()); v != want {
			t.Fatalf("flags %#x on CPU %d: verdict %s, want %s", p.flags, cpu, xdpVerdicts[v], xdpVerdicts[want])
		}
	}
	expect(0, syn("10.1.0.2", clientPort), 4)
	expect(0, ack("10.1.0.2", clientPort), 4)
	if multi {
		expect(1, ack("10.1.0.2", clientPort), 4) // CPU 1 holds a copy now
	}
	if err := k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: false, Generation: 1}}); err != nil {
		t.Fatal(err)
	}
	// Established flows keep their backend when it turns unhealthy...
	expect(0, ack("10.1.0.2", clientPort), 4)
	// ...but a retransmitted SYN is decided again: local.
	expect(0, syn("10.1.0.2", clientPort), 2)
	expect(0, ack("10.1.0.2", clientPort), 2)
	if !multi {
		return
	}
	// CPU 1's copy expires within 64 ticks: one second covers HZ >= 64.
	time.Sleep(time.Second)
	expect(1, ack("10.1.0.2", clientPort), 2)
}

// TestNextHopCache: with the cache on, a steered flow keeps using the cached
// next hop (a route change is not seen until the entry expires), the cached
// MTU is still enforced, and changing the settings flushes the cache.
func TestNextHopCache(t *testing.T) {
	e := newEdgeEnvOpts(t, Options{NextHopTTL: time.Hour})
	k := e.k
	e.ns.Run("ip", "link", "set", "wpbe", "mtu", "1400")
	for _, err := range []error{
		k.SetServices([]Service{vip}),
		k.SetBackends([]Backend{{ID: 4, Addr: be4Addr, Healthy: true, Generation: 1}}),
		k.SetAffinity(Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: vip, Backend: 4, Generation: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	big := ack("10.1.0.2", clientPort)
	big.payload = make([]byte, 1400-40-10)
	steps := []struct {
		name    string
		setup   func()
		in      tcpPkt
		verdict uint32
		want    map[CounterKind]uint64
	}{
		{name: "first SYN fills the cache", in: syn("10.1.0.2", clientPort), verdict: 4,
			want: map[CounterKind]uint64{FlowNewSteer: 1, Steered: 1}},
		{name: "route blackholed: cached next hop still used",
			setup: func() { e.ns.Run("ip", "route", "add", "blackhole", be4Addr.String()+"/32") },
			in:    ack("10.1.0.2", clientPort), verdict: 4, want: map[CounterKind]uint64{Steered: 1}},
		{name: "cached MTU enforced", in: big, verdict: 3,
			want: map[CounterKind]uint64{ErrFragNeeded: 1, ICMPFragNeeded: 1}},
		{name: "settings change flushes the cache",
			setup: func() {
				if err := k.setSettings(encapSrc, 0); err != nil {
					t.Fatal(err)
				}
			},
			in: ack("10.1.0.2", clientPort), verdict: 1, want: map[CounterKind]uint64{ErrFIB: 1, Dropped: 1}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.setup != nil {
				st.setup()
			}
			before := counters(t, k)
			verdict, out := e.run(t, k.objs.Steer, st.in.frame())
			after := counters(t, k)
			if verdict != st.verdict {
				t.Fatalf("verdict %s, want %s", xdpVerdicts[verdict], xdpVerdicts[st.verdict])
			}
			if verdict == 3 {
				if want := icmpFragNeeded(st.in.frame(), macClient, macIn, 1400); !bytes.Equal(out, want) {
					t.Errorf("ICMP differs\n got %x\nwant %x", out, want)
				}
			}
			if verdict == 4 {
				if want := encap(st.in.ip(), macBE4, macBE, encapSrc, be4Addr); !bytes.Equal(out, want) {
					t.Errorf("output differs\n got %x\nwant %x", out, want)
				}
			}
			assertDelta(t, before, after, st.want)
		})
	}
}

// TestAffinityRefreshClock: the program refreshes last_used_ns on the clock
// Go compares with (CLOCK_MONOTONIC; the program reads its tick-grained
// CLOCK_MONOTONIC_COARSE view), so ExpireIdle sees real idle times.
func TestAffinityRefreshClock(t *testing.T) {
	e := newEdgeEnv(t)
	k := e.k
	client := netip.MustParseAddr("10.1.0.2")
	for _, err := range []error{
		k.SetServices([]Service{vip}),
		k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true}}),
		k.SetAffinity(Affinity{Client: client, Service: vip, Backend: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	key := affinityKey(client, vip)
	val := bpf.WarmpathAffVal{LastUsedNs: 1, Backend: 1}
	if err := k.objs.Affinity.Put(&key, &val); err != nil { // idle since boot
		t.Fatal(err)
	}
	before := coarseNow(t)
	if v, _ := e.run(t, k.objs.Steer, syn("10.1.0.2", clientPort).frame()); v != 4 {
		t.Fatalf("verdict %s", xdpVerdicts[v])
	}
	after := monoNow()
	if err := k.objs.Affinity.Lookup(&key, &val); err != nil {
		t.Fatal(err)
	}
	if got := int64(val.LastUsedNs); got < before || got > after {
		t.Fatalf("last_used_ns %d outside [%d, %d]: program and Go clocks differ", got, before, after)
	}
	if n, err := k.ExpireIdle(time.Hour); err != nil || n != 0 {
		t.Fatalf("refreshed entry expired: %d %v", n, err)
	}
}

// coarseNow reads CLOCK_MONOTONIC_COARSE, the clock of bpf_ktime_get_coarse_ns.
func coarseNow(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// TestCollectorKernel: the collector reads the real per-CPU counters.
func TestCollectorKernel(t *testing.T) {
	e := newEdgeEnv(t)
	if err := e.k.SetServices([]Service{vip}); err != nil {
		t.Fatal(err)
	}
	nonVIP := syn("10.1.0.2", clientPort)
	nonVIP.dst = netip.MustParseAddrPort("10.1.0.1:22")
	frame := nonVIP.frame()
	for range 3 {
		e.run(t, e.k.objs.Steer, frame)
	}
	out := string(gatherText(t, NewCollector(e.k)))
	for _, want := range []string{
		"warmpath_fastpath_kernel_mode 1",
		`warmpath_fastpath_packets_total{kind="pass_not_service"} 3`,
		fmt.Sprintf(`warmpath_fastpath_bytes_total{kind="pass_not_service"} %d`, 3*len(frame)),
		`warmpath_fastpath_packets_total{kind="steered"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
