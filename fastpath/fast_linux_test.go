package fastpath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/warmpath/warmpath/bpf"
)

// runRepeat runs prog repeat times in one BPF_PROG_TEST_RUN on CPU 0 (as
// received on wpin) and returns the last run's verdict and output.
func (e *edgeEnv) runRepeat(t testing.TB, prog *ebpf.Program, in []byte, repeat uint32) (uint32, []byte) {
	t.Helper()
	return e.runRepeatOn(t, 0, prog, in, repeat)
}

// readySlot returns the index and every CPU's copy of the ready-headers
// slot of frame's flow (Ethernet + IPv4 without options + TCP): the hash
// flow_hash, its top bits as ready_slot_of takes them.
func readySlot(t *testing.T, k *Kernel, frame []byte) (uint32, []bpf.WarmpathReadySlot) {
	t.Helper()
	ip := frame[14:]
	saddr, daddr := binary.NativeEndian.Uint32(ip[12:]), binary.NativeEndian.Uint32(ip[16:])
	sport, dport := binary.NativeEndian.Uint16(ip[20:]), binary.NativeEndian.Uint16(ip[22:])
	idx := ((saddr ^ daddr ^ (uint32(sport)<<16 | uint32(dport))) * 0x9e3779b1) >> 22 & (k.objs.Ready.MaxEntries() - 1)
	var per []bpf.WarmpathReadySlot
	if err := k.objs.Ready.Lookup(idx, &per); err != nil {
		t.Fatalf("ready slot %d: %v", idx, err)
	}
	want := bpf.WarmpathFlowKey{Saddr: saddr, Daddr: daddr, Sport: sport, Dport: dport}
	if per[0].Key != want {
		t.Fatalf("ready slot %d on CPU 0 holds %+v, want %+v", idx, per[0].Key, want)
	}
	return idx, per
}

// TestSteerFastPath: once a packet of a steered flow has gone through the
// full path with a valid next-hop cache slot, the flow's next packets in
// the same tick are encapsulated from the ready headers in this CPU's ready
// slot (steer_fast). Its output and counters are the full path's,
// for every shape of header it takes; a poisoned copy in the slot shows up
// in the output (the path is really taken) unless the slot's epoch or tick
// is not the current one.
func TestSteerFastPath(t *testing.T) {
	e := newEdgeEnvOpts(t, Options{NextHopTTL: time.Hour})
	k := e.k
	client := "10.1.0.2"
	for _, err := range []error{
		k.SetServices([]Service{vip}),
		k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: true, Generation: 1}}),
		k.SetAffinity(Affinity{Client: netip.MustParseAddr(client), Service: vip, Backend: 1, Generation: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := e.run(t, k.objs.Steer, syn(client, clientPort).frame()); v != 4 {
		t.Fatalf("SYN verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
	}
	// The harness undoes each repetition's encapsulation, so every
	// repetition after the first sees the same packet with ready headers.
	harness := benchHarness(t, k.objs.Steer, false)
	const repeat = 200
	shapes := map[string]func(p *tcpPkt){
		"ack":            func(p *tcpPkt) {},
		"payload, DF":    func(p *tcpPkt) { p.payload = make([]byte, 700); p.fragOff = 0x4000; p.flags |= fPSH },
		"tos, id, no DF": func(p *tcpPkt) { p.tos = 0x28; p.id = 0xbeef },
		"FIN":            func(p *tcpPkt) { p.flags = fACK | 0x01 },
	}
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			p := ack(client, clientPort)
			shape(&p)
			before := counters(t, k)
			v, out := e.runRepeat(t, harness, p.frame(), repeat)
			after := counters(t, k)
			if v != 4 {
				t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
			}
			if want := encap(p.ip(), macBE1, macBE, encapSrc, be1Addr); !bytes.Equal(out, want) {
				t.Errorf("output differs\n got %x\nwant %x", out, want)
			}
			assertDelta(t, before, after, map[CounterKind]uint64{Steered: repeat})
			if got := after.Backend(1).Steered.Packets - before.Backend(1).Steered.Packets; got != repeat {
				t.Errorf("backend 1 steered %d packets, want %d", got, repeat)
			}
			if got, want := after.Backend(1).Steered.Bytes-before.Backend(1).Steered.Bytes, uint64(repeat*len(p.frame())); got != want {
				t.Errorf("backend 1 steered %d bytes, want %d", got, want)
			}
		})
	}

	t.Run("poisoned slot", func(t *testing.T) {
		p := ack(client, clientPort)
		fake := mac("02:00:00:00:02:99")
		// A poisoned copy is used only within the tick the slot was
		// checked in: try until one attempt lands inside one tick.
		const attempts = 50
		used := 0
		for range attempts {
			// One run (a repeat > 1 costs the test runner milliseconds
			// after the packets ran): the full path refills the headers.
			if v, _ := e.run(t, k.objs.Steer, p.frame()); v != 4 {
				t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
			}
			idx, per := readySlot(t, k, p.frame())
			good := per[0]
			if good.Tick == 0 {
				t.Fatal("ready slot holds no headers after a steered packet")
			}
			poison := func(mod func(s *bpf.WarmpathReadySlot)) []byte {
				s := good
				s.Eth0 = binary.NativeEndian.Uint16(fake[0:])
				s.Eth1 = binary.NativeEndian.Uint32(fake[2:])
				mod(&s)
				per[0] = s
				if err := k.objs.Ready.Put(idx, per); err != nil {
					t.Fatal(err)
				}
				v, out := e.run(t, k.objs.Steer, p.frame())
				if v != 4 {
					t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
				}
				return out[:6]
			}
			if got := poison(func(s *bpf.WarmpathReadySlot) { s.Epoch++ }); !bytes.Equal(got, mac(macBE1)) {
				t.Fatalf("slot of another epoch used: destination MAC %x", got)
			}
			if got := poison(func(s *bpf.WarmpathReadySlot) { s.Tick-- }); !bytes.Equal(got, mac(macBE1)) {
				t.Fatalf("ready headers of an earlier tick used: destination MAC %x", got)
			}
			if got := poison(func(s *bpf.WarmpathReadySlot) {}); bytes.Equal(got, fake) {
				used++
			}
		}
		if used == 0 {
			t.Fatalf("ready headers never used in %d attempts", attempts)
		}
	})

	// Writing the flow's flow cache copy clears its ready headers, so none
	// outlive the decision they were built from (checked in the map: the
	// next packet may fall in another tick either way).
	t.Run("flow cache refill clears", func(t *testing.T) {
		p := ack(client, clientPort)
		if v, _ := e.run(t, k.objs.Steer, p.frame()); v != 4 {
			t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
		}
		if _, per := readySlot(t, k, p.frame()); per[0].Tick == 0 {
			t.Fatal("no ready headers after a steered packet that hit the flow cache")
		}
		// Void CPU 0's flow cache copy: the next packet refills it from
		// the flow table, which must clear the headers and not rebuild
		// them (only a flow cache hit does).
		var slots []bpf.WarmpathFlowCacheSlot
		for i := range k.objs.FlowCache.MaxEntries() {
			if err := k.objs.FlowCache.Lookup(i, &slots); err != nil {
				t.Fatal(err)
			}
			if slots[0].Key == (bpf.WarmpathFlowKey{}) {
				continue
			}
			slots[0].Epoch++
			if err := k.objs.FlowCache.Put(i, slots); err != nil {
				t.Fatal(err)
			}
		}
		if v, _ := e.run(t, k.objs.Steer, p.frame()); v != 4 {
			t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
		}
		if _, per := readySlot(t, k, p.frame()); per[0].Tick != 0 {
			t.Fatalf("ready headers of tick %d kept across a flow cache refill", per[0].Tick)
		}
	})

	t.Run("re-decided flow clears", func(t *testing.T) {
		p := ack(client, clientPort)
		if v, _ := e.run(t, k.objs.Steer, p.frame()); v != 4 {
			t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
		}
		if v, _ := e.run(t, k.objs.Steer, p.frame()); v != 4 {
			t.Fatalf("verdict %s, want XDP_REDIRECT", xdpVerdicts[v])
		}
		if _, per := readySlot(t, k, p.frame()); per[0].Tick == 0 {
			t.Fatal("no ready headers after steered packets that hit the flow cache")
		}
		// The backend goes away: a retransmitted SYN is decided again
		// (LOCAL), and the flow's next packet must follow that.
		if err := k.SetBackends([]Backend{{ID: 1, Addr: be1Addr, Healthy: false, Generation: 1}}); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, k.objs.Steer, syn(client, clientPort).frame()); v != 2 {
			t.Fatalf("re-decided SYN verdict %s, want XDP_PASS", xdpVerdicts[v])
		}
		if _, per := readySlot(t, k, p.frame()); per[0].Tick != 0 {
			t.Fatalf("ready headers of tick %d kept across the re-decision", per[0].Tick)
		}
		if v, _ := e.run(t, k.objs.Steer, p.frame()); v != 2 {
			t.Fatalf("ACK after the re-decision: verdict %s, want XDP_PASS", xdpVerdicts[v])
		}
	})
}
