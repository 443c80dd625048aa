package fastpath

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// benchEnv is newEdgeEnv with one service, one backend (with a resolved
// neighbour) and an affinity for client 10.1.0.2.
func benchEnv(b *testing.B) *edgeEnv {
	b.Helper()
	e := newEdgeEnv(b)
	e.steerClient(b, 1)
	return e
}

const kernelRepeat = 20000

// progTestRunAttr is the BPF_PROG_TEST_RUN part of union bpf_attr.
type progTestRunAttr struct {
	progFD, retval, dataSizeIn, dataSizeOut uint32
	dataIn, dataOut                         uint64
	repeat, duration                        uint32
	ctxSizeIn, ctxSizeOut                   uint32
	ctxIn, ctxOut                           uint64
	flags, cpu, batchSize                   uint32
	_                                       uint32
}

// kernelTestRun runs prog repeat times in one BPF_PROG_TEST_RUN and returns
// the verdict and the kernel's own mean time per run. cilium/ebpf's Run
// drops that duration, and wall time is useless here: with Repeat > 1 the
// XDP test runner toggles a static key (bpf_prog_change_xdp), about 20 ms
// of fixed cost per call on this kernel.
func kernelTestRun(prog *ebpf.Program, data []byte, ctx xdpMd, repeat uint32) (uint32, time.Duration, error) {
	attr := progTestRunAttr{
		progFD:     uint32(prog.FD()),
		dataSizeIn: uint32(len(data)),
		dataIn:     uint64(uintptr(unsafe.Pointer(&data[0]))),
		repeat:     repeat,
		ctxSizeIn:  uint32(unsafe.Sizeof(ctx)),
		ctxIn:      uint64(uintptr(unsafe.Pointer(&ctx))),
	}
	for {
		_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		runtime.KeepAlive(data)
		runtime.KeepAlive(&ctx)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, 0, errno
		}
		return attr.retval, time.Duration(attr.duration), nil
	}
}

// barePass loads the floor: a program that only returns XDP_PASS.
func barePass(b testing.TB) *ebpf.Program {
	b.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		b.Fatalf("load bare XDP_PASS: %v", err)
	}
	b.Cleanup(func() { _ = p.Close() })
	return p
}

// bareEncap loads the least an encapsulating program can do: make room for
// an outer IPv4 header (adjust_head -20), mark it as IPIP (protocol byte
// 4, so benchHarness undoes it) and return XDP_REDIRECT. Under the harness
// it is the floor of any encapsulation, the reference for xdp_steer's own
// cost.
func bareEncap(b testing.TB) *ebpf.Program {
	b.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "Dual MIT/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.Mov.Imm(asm.R2, -20),
			asm.FnXdpAdjustHead.Call(),
			asm.JNE.Imm(asm.R0, 0, "abort"),
			asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
			asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 14+20),
			asm.JGT.Reg(asm.R4, asm.R3, "abort"),
			asm.StoreImm(asm.R2, 14+9, 4, asm.Byte),
			asm.Mov.Imm(asm.R0, 4), // XDP_REDIRECT
			asm.Return(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("abort"),
			asm.Return(),
		}})
	if err != nil {
		b.Fatalf("load bare encapsulation: %v", err)
	}
	b.Cleanup(func() { _ = p.Close() })
	return p
}

// ethRewrite stores the bench packets' Ethernet header at the packet start
// (R2: data, bounds checked by the caller), as benchHarness's undo does.
func ethRewrite(tb testing.TB) asm.Instructions {
	tb.Helper()
	mac := func(s string) (uint32, uint16) {
		hw, err := net.ParseMAC(s)
		if err != nil {
			tb.Fatal(err)
		}
		return binary.NativeEndian.Uint32(hw[:4]), binary.NativeEndian.Uint16(hw[4:6])
	}
	dst4, dst2 := mac(macIn)
	src4, src2 := mac(macClient)
	var ethP [2]byte
	binary.BigEndian.PutUint16(ethP[:], 0x0800)
	return asm.Instructions{
		asm.StoreImm(asm.R2, 0, int64(int32(dst4)), asm.Word),
		asm.StoreImm(asm.R2, 4, int64(int16(dst2)), asm.Half),
		asm.StoreImm(asm.R2, 6, int64(int32(src4)), asm.Word),
		asm.StoreImm(asm.R2, 10, int64(int16(src2)), asm.Half),
		asm.StoreImm(asm.R2, 12, int64(int16(binary.NativeEndian.Uint16(ethP[:]))), asm.Half),
	}
}

// encapUndo loads bareEncap followed, in the same program, by
// benchHarness's undo (adjust_head +20, the Ethernet header rewritten):
// run without the harness, it prices the pair, so that half of it (the
// two adjust_head calls run the same helper code) estimates the undo that
// the harness adds to every steered repetition.
func encapUndo(tb testing.TB) *ebpf.Program {
	tb.Helper()
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Imm(asm.R2, -20),
		asm.FnXdpAdjustHead.Call(),
		asm.JNE.Imm(asm.R0, 0, "abort"),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20+4),
		asm.JGT.Reg(asm.R4, asm.R3, "abort"),
		asm.StoreImm(asm.R2, 14+9, 4, asm.Byte),
		asm.LoadMem(asm.R4, asm.R2, 14+9, asm.Byte),
		asm.JNE.Imm(asm.R4, 4, "abort"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 20),
		asm.FnXdpAdjustHead.Call(),
		asm.JNE.Imm(asm.R0, 0, "abort"),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20+4),
		asm.JGT.Reg(asm.R4, asm.R3, "abort"),
	}
	ins = append(ins, ethRewrite(tb)...)
	ins = append(ins,
		asm.Mov.Imm(asm.R0, 4), // XDP_REDIRECT
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("abort"),
		asm.Return(),
	)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "Dual MIT/GPL", Instructions: ins})
	if err != nil {
		tb.Fatalf("load encapsulation + undo: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// loadSteerObject loads xdp_steer from another build of bpf/warmpath.c
// (an object file: an older version to compare with, or a profiling
// build), sharing every map of e's datapath that has the same name and
// layout; maps whose layout differs (a cache of another version) are the
// object's own, unpinned.
func loadSteerObject(tb testing.TB, e *edgeEnv, path string) *ebpf.Program {
	tb.Helper()
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		tb.Fatalf("read %s: %v", path, err)
	}
	have := map[string]*ebpf.Map{}
	v := reflect.ValueOf(&e.k.objs.WarmpathMaps).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
			have[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	repl := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone
		if m, ok := have[name]; ok && ms.Type == m.Type() && ms.KeySize == m.KeySize() &&
			ms.ValueSize == m.ValueSize() && ms.MaxEntries == m.MaxEntries() {
			repl[name] = m
		}
	}
	for name := range spec.Programs {
		if name != "xdp_steer" {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		tb.Fatalf("load xdp_steer from %s: %v", path, err)
	}
	tb.Cleanup(coll.Close)
	return coll.Programs["xdp_steer"]
}

// benchHarness loads a program that tail-calls target, for
// BPF_PROG_TEST_RUN with Repeat > 1: the kernel reuses the packet buffer,
// so each repetition starts by undoing the previous one's encapsulation
// (an IPv4 header of protocol 4 after the Ethernet header: strip 20 bytes,
// rewrite the Ethernet header of the bench packets). With nextPort it then
// adds one to the TCP source port (IHL 5 assumed), so every repetition of a
// SYN is a new connection. The harness is plain bytecode, independent of
// bpf/warmpath.c, so the same benchmark measures any version of xdp_steer;
// its own cost is the "harness" case (it tail-calls the bare program).
func benchHarness(b testing.TB, target *ebpf.Program, nextPort bool) *ebpf.Program {
	b.Helper()
	progs, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		b.Fatalf("prog array: %v", err)
	}
	b.Cleanup(func() { _ = progs.Close() })
	loadPkt := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20+4),
	}
	ins := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	ins = append(ins, loadPkt...)
	ins = append(ins,
		asm.JGT.Reg(asm.R4, asm.R3, "call"),
		asm.LoadMem(asm.R4, asm.R2, 14+9, asm.Byte),
		asm.JNE.Imm(asm.R4, 4, "fresh"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 20),
		asm.FnXdpAdjustHead.Call(),
		asm.JNE.Imm(asm.R0, 0, "abort"),
	)
	ins = append(ins, loadPkt...)
	ins = append(ins, asm.JGT.Reg(asm.R4, asm.R3, "abort"))
	ins = append(ins, ethRewrite(b)...)
	fresh := asm.Mov.Imm(asm.R0, 0).WithSymbol("fresh")
	ins = append(ins, fresh)
	if nextPort {
		ins = append(ins,
			asm.LoadMem(asm.R4, asm.R2, 14+20, asm.Half),
			asm.Add.Imm(asm.R4, 1),
			asm.StoreMem(asm.R2, 14+20, asm.R4, asm.Half),
		)
	}
	ins = append(ins,
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("call"),
		asm.LoadMapPtr(asm.R2, progs.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("abort"), // XDP_ABORTED
		asm.Return(),
	)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "Dual MIT/GPL", Instructions: ins})
	if err != nil {
		b.Fatalf("load bench harness: %v", err)
	}
	b.Cleanup(func() { _ = p.Close() })
	if err := progs.Put(uint32(0), target); err != nil {
		b.Fatalf("prog array: %v", err)
	}
	return p
}

// harnessFlows calls fn with the flow key of each packet a nextPort harness
// run of n repetitions sends from client to the VIP: source ports raw+1 ...
// raw+n as the harness counts them (native-endian adds on the
// network-order field). Keys are built as bytes so the benchmark runs
// against any flow_key layout that starts with saddr, daddr, sport, dport
// (12 bytes, or 16 with proto and padding).
func harnessFlows(m *ebpf.Map, client string, raw uint16, n int, fn func(key []byte) error) error {
	key := make([]byte, m.KeySize())
	c, v := netip.MustParseAddr(client).As4(), vip.Addr().As4()
	copy(key[0:], c[:])
	copy(key[4:], v[:])
	binary.BigEndian.PutUint16(key[10:], vip.Port())
	if len(key) >= 13 {
		key[12] = unix.IPPROTO_TCP
	}
	for i := 1; i <= n; i++ {
		binary.NativeEndian.PutUint16(key[8:], raw+uint16(i))
		if err := fn(key); err != nil {
			return err
		}
	}
	return nil
}

// pinCPU pins the calling (locked) thread to the first CPU it may run on,
// so the cases of one iteration share a CPU and its per-CPU caches.
func pinCPU(b *testing.B) {
	b.Helper()
	var set, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		b.Fatal(err)
	}
	for c := range 1024 {
		if set.IsSet(c) {
			one.Set(c)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		b.Fatal(err)
	}
}

// baselineEnv names an environment variable: the path of another build of
// bpf/warmpath.c (e.g. main's bpf/warmpath_bpfel.o copied aside) whose
// xdp_steer BenchmarkXDPSteer also runs, interleaved, as base_est,
// base_syn and base_many.
const baselineEnv = "WARMPATH_XDP_BASELINE"

// BenchmarkXDPSteer measures, interleaved in every iteration (so the cases
// share the machine's load), kernelRepeat packets per BPF_PROG_TEST_RUN of:
// the bare XDP_PASS program (floor), the harness alone (tail call into the
// bare program), the harness around bareEncap (encap: the least any
// encapsulation costs here, undo included), encapUndo without the harness
// (pair: the encapsulation's adjust_head and the undo in one program), a
// steered packet of an established flow (est), one of kernelRepeat
// established flows in turn (many: every repetition another flow, so
// per-CPU caches of recent flows miss and the flow table is a real working
// set), and a new SYN (every repetition a new source port: services,
// affinity, flow insert, encapsulation), all through xdp_steer with the
// next-hop cache on (the default); with $WARMPATH_XDP_BASELINE set, the
// same three through that object's xdp_steer too (base_*).
//
// Reported: kernel-timed ns per packet of each, the ratios to the floor
// (est/floor, many/floor, syn/floor: raw, the harness and its undo
// included) and, for the established packet, the net figure: undo_ns is
// the harness's own cost (harness - floor) plus the undo's (half of pair -
// floor), est_net = est - undo_ns, and est_net/floor. ns/op is the wall
// time of one iteration (test runner fixed costs, flow cleanup): ignore it.
func BenchmarkXDPSteer(b *testing.B) {
	e := benchEnv(b)
	if err := e.k.setSettings(encapSrc, DefaultNextHopTTL); err != nil {
		b.Fatal(err)
	}
	floor := barePass(b)
	est := ack("10.1.0.2", clientPort).frame()
	// Record the flow's decision first, as on the wire.
	if v, _ := e.run(b, e.k.objs.Steer, syn("10.1.0.2", clientPort).frame()); v != 4 {
		b.Fatalf("SYN verdict %d, want 4", v)
	}
	synIn := syn("10.1.0.2", 1024).frame()
	manyIn := ack("10.1.0.50", 1024).frame()
	// The many flows were decided earlier (steered to backend 1).
	val := make([]byte, 8)
	a4 := be1Addr.As4()
	copy(val, a4[:])
	binary.NativeEndian.PutUint32(val[4:], 1)
	if err := harnessFlows(e.k.objs.Flows, "10.1.0.50", binary.NativeEndian.Uint16(manyIn[14+20:]), kernelRepeat,
		func(key []byte) error { return e.k.objs.Flows.Put(key, val) }); err != nil {
		b.Fatalf("insert flows: %v", err)
	}
	type benchCase struct {
		name string
		prog *ebpf.Program
		in   []byte
		want uint32
		syn  bool // creates flows, deleted after the run
	}
	steerCases := func(prefix string, steer *ebpf.Program) []benchCase {
		return []benchCase{
			{prefix + "est", benchHarness(b, steer, false), est, 4, false},
			{prefix + "syn", benchHarness(b, steer, true), synIn, 4, true},
			{prefix + "many", benchHarness(b, steer, true), manyIn, 4, false},
		}
	}
	cases := []benchCase{
		{"floor", floor, est, 2, false},
		{"harness", benchHarness(b, floor, false), est, 2, false},
		{"encap", benchHarness(b, bareEncap(b), false), est, 4, false},
		{"pair", encapUndo(b), est, 4, false},
	}
	cases = append(cases, steerCases("", e.k.objs.Steer)...)
	base := os.Getenv(baselineEnv)
	if base != "" {
		cases = append(cases, steerCases("base_", loadSteerObject(b, e, base))...)
		if v, _ := e.run(b, cases[len(cases)-3].prog, est); v != 4 {
			b.Fatalf("baseline: established verdict %d, want 4", v)
		}
	}
	total := make(map[string]time.Duration)
	raw := binary.NativeEndian.Uint16(synIn[14+20:])
	err := e.ns.Do(func() error {
		pinCPU(b)
		for b.Loop() {
			for _, c := range cases {
				ctx := xdpMd{DataEnd: uint32(len(c.in)), IngressIfindex: uint32(e.ifindex)}
				v, d, err := kernelTestRun(c.prog, c.in, ctx, kernelRepeat)
				if err != nil || v != c.want {
					b.Fatalf("%s: verdict %d (want %d) err %v", c.name, v, c.want, err)
				}
				total[c.name] += d
				if !c.syn {
					continue
				}
				// Every SYN of the next run must be new again.
				err = harnessFlows(e.k.objs.Flows, "10.1.0.2", raw, kernelRepeat, func(key []byte) error {
					if err := e.k.objs.Flows.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						return err
					}
					return nil
				})
				if err != nil {
					b.Fatalf("delete flows: %v", err)
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	ns := func(name string) float64 { return float64(total[name].Nanoseconds()) / float64(b.N) }
	for _, c := range cases {
		b.ReportMetric(ns(c.name), c.name+"_ns/pkt")
	}
	f := ns("floor")
	undo := ns("harness") - f + (ns("pair")-f)/2
	b.ReportMetric(undo, "undo_ns")
	b.ReportMetric(ns("encap")/f, "encap/floor")
	prefixes := []string{""}
	if base != "" {
		prefixes = append(prefixes, "base_")
	}
	for _, p := range prefixes {
		b.ReportMetric(ns(p+"est")/f, p+"est/floor")
		b.ReportMetric((ns(p+"est")-undo)/f, p+"est_net/floor")
		b.ReportMetric(ns(p+"syn")/f, p+"syn/floor")
		b.ReportMetric(ns(p+"many")/f, p+"many/floor")
	}
}

// BenchmarkXDPStages times steer_fast stage by stage: profiling builds of
// bpf/warmpath.c (-DWARMPATH_BENCH_STOP=n, compiled here with clang-14 or
// $BPF2GO_CC; skipped without it) that return right after stage n, each
// through benchHarness on an established packet with ready headers,
// interleaved with the floor, the harness and the real xdp_steer (full).
// Reported: ns per packet of each and each stage's increment over the one
// before (stage 1 over the harness, full over stage 6). Stage 4 includes
// the harness's undo, which starts there (the packet is encapsulated).
func BenchmarkXDPStages(b *testing.B) {
	cc := os.Getenv("BPF2GO_CC")
	if cc == "" {
		cc = "clang-14"
	}
	if _, err := exec.LookPath(cc); err != nil {
		b.Skipf("%s not found: profiling builds need it", cc)
	}
	e := benchEnv(b)
	if err := e.k.setSettings(encapSrc, DefaultNextHopTTL); err != nil {
		b.Fatal(err)
	}
	stages := []string{"parse", "slot", "checks", "adjust_head", "headers", "counter"}
	dir := b.TempDir()
	type stageCase struct {
		name string
		prog *ebpf.Program
	}
	floor := barePass(b)
	cases := []stageCase{{"floor", floor}, {"harness", benchHarness(b, floor, false)}}
	for i, name := range stages {
		obj := filepath.Join(dir, name+".o")
		out, err := exec.Command(cc, "-O2", "-g", "-target", "bpfel", "-mcpu=v3", "-Wall", "-Werror", "-I../bpf",
			"-DWARMPATH_BENCH_STOP="+string(rune('1'+i)), "-c", "../bpf/warmpath.c", "-o", obj).CombinedOutput()
		if err != nil {
			b.Fatalf("build stage %s: %v: %s", name, err, out)
		}
		cases = append(cases, stageCase{name, benchHarness(b, loadSteerObject(b, e, obj), false)})
	}
	cases = append(cases, stageCase{"full", benchHarness(b, e.k.objs.Steer, false)})
	est := ack("10.1.0.2", clientPort).frame()
	if v, _ := e.run(b, e.k.objs.Steer, syn("10.1.0.2", clientPort).frame()); v != 4 {
		b.Fatalf("SYN verdict %d, want 4", v)
	}
	total := make([]time.Duration, len(cases))
	err := e.ns.Do(func() error {
		pinCPU(b)
		for b.Loop() {
			for i, c := range cases {
				ctx := xdpMd{DataEnd: uint32(len(est)), IngressIfindex: uint32(e.ifindex)}
				want := uint32(4)
				if i < 2 {
					want = 2
				}
				v, d, err := kernelTestRun(c.prog, est, ctx, kernelRepeat)
				if err != nil || v != want {
					b.Fatalf("%s: verdict %d (want %d) err %v", c.name, v, want, err)
				}
				total[i] += d
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	ns := func(i int) float64 { return float64(total[i].Nanoseconds()) / float64(b.N) }
	for i, c := range cases {
		b.ReportMetric(ns(i), c.name+"_ns/pkt")
		if i >= 2 {
			b.ReportMetric(ns(i)-ns(i-1), "+"+c.name+"_ns")
		}
	}
}

// BenchmarkXDPKernelLoop runs each case kernelRepeat times per
// BPF_PROG_TEST_RUN and reports the kernel-measured ns/pkt (no syscall in
// it) and the single-core rate in Mpps, one sub-benchmark per case (see
// BenchmarkXDPSteer for the interleaved ratios). Steering runs xdp_steer
// through benchHarness (its undo and tail call included), with the
// next-hop cache off (a bpf_fib_lookup per packet) and on (the default).
// ns/op is wall time per call and is dominated by the test runner's fixed
// cost: ignore it.
func BenchmarkXDPKernelLoop(b *testing.B) {
	e := benchEnv(b)
	floor := barePass(b)
	nonVIP := syn("10.1.0.2", clientPort)
	nonVIP.dst = netip.MustParseAddrPort("10.1.0.1:22")
	steer := benchHarness(b, e.k.objs.Steer, false)
	cases := []struct {
		name string
		prog *ebpf.Program
		in   []byte
		want uint32
	}{
		{"floor=xdp_pass", floor, ack("10.1.0.2", clientPort).frame(), 2},
		{"harness=xdp_pass", benchHarness(b, floor, false), ack("10.1.0.2", clientPort).frame(), 2},
		{"pass=non-vip", e.k.objs.Steer, nonVIP.frame(), 2},
		{"pass=vip-local-established", e.k.objs.Steer, ack("10.1.0.3", clientPort).frame(), 2},
		{"steer=established/nh-cache=off", steer, ack("10.1.0.2", clientPort).frame(), 4},
		{"steer=syn-decided/nh-cache=off", steer, syn("10.1.0.2", clientPort+1).frame(), 4},
		{"steer=established/nh-cache=on", steer, ack("10.1.0.2", clientPort).frame(), 4},
		{"steer=syn-decided/nh-cache=on", steer, syn("10.1.0.2", clientPort+1).frame(), 4},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			ttl := time.Duration(0)
			if strings.HasSuffix(tc.name, "nh-cache=on") {
				ttl = DefaultNextHopTTL
			}
			if err := e.k.setSettings(encapSrc, ttl); err != nil {
				b.Fatal(err)
			}
			// Record the flow's decision first, as on the wire.
			if v, _ := e.run(b, tc.prog, tc.in); v != tc.want {
				b.Fatalf("verdict %d, want %d", v, tc.want)
			}
			ctx := xdpMd{DataEnd: uint32(len(tc.in)), IngressIfindex: uint32(e.ifindex)}
			var total time.Duration
			runs := 0
			err := e.ns.Do(func() error {
				for b.Loop() {
					v, d, err := kernelTestRun(tc.prog, tc.in, ctx, kernelRepeat)
					if err != nil || v != tc.want {
						b.Fatalf("run: verdict %d err %v", v, err)
					}
					total += d
					runs++
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			ns := float64(total.Nanoseconds()) / float64(runs)
			b.ReportMetric(ns, "ns/pkt")
			b.ReportMetric(1e3/ns, "Mpps")
		})
	}
}

// BenchmarkXDPSyscall runs one packet per BPF_PROG_TEST_RUN syscall with
// real output. ns/op includes the syscall (see floor=xdp_pass): subtract it
// for the program's cost. steer=syn uses a new source port every packet, so
// each is a real first SYN: affinity lookup, flow insert, FIB lookup,
// encapsulation.
func BenchmarkXDPSyscall(b *testing.B) {
	e := benchEnv(b)
	nonVIP := syn("10.1.0.2", clientPort)
	nonVIP.dst = netip.MustParseAddrPort("10.1.0.1:22")
	cases := []struct {
		name     string
		prog     *ebpf.Program
		in       []byte
		want     uint32
		varyPort bool
	}{
		{"floor=xdp_pass", barePass(b), syn("10.1.0.2", clientPort).frame(), 2, false},
		{"pass=non-vip", e.k.objs.Steer, nonVIP.frame(), 2, false},
		{"steer=syn", e.k.objs.Steer, syn("10.1.0.2", clientPort).frame(), 4, true},
		{"steer=established", e.k.objs.Steer, ack("10.1.0.2", clientPort).frame(), 4, false},
	}
	if err := e.k.setSettings(encapSrc, DefaultNextHopTTL); err != nil {
		b.Fatal(err)
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			in := tc.in
			opts := ebpf.RunOptions{
				Data:    in,
				DataOut: make([]byte, len(in)+64),
				Context: xdpMd{DataEnd: uint32(len(in)), IngressIfindex: uint32(e.ifindex)},
			}
			out := opts.DataOut
			port := uint16(1024)
			err := e.ns.Do(func() error {
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if tc.varyPort {
						port++
						if port == 0 {
							port = 1024
						}
						binary.BigEndian.PutUint16(in[14+20:], port)
					}
					opts.DataOut = out
					if v, err := tc.prog.Run(&opts); err != nil || v != tc.want {
						b.Fatalf("run: verdict %d err %v", v, err)
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
