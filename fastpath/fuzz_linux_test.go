package fastpath

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/warmpath/warmpath/fastpath/testbed"
)

// validEncap reports whether out is in (from its IP header on) behind an
// Ethernet header and a 20-byte IPv4 header of protocol 4 whose total
// length and checksum are right.
func validEncap(in, out []byte) bool {
	if len(out) != len(in)+20 || len(in) < 14 {
		return false
	}
	outer := out[14:34]
	if outer[0] != 0x45 || outer[9] != 4 || csumFold(csumAdd(0, outer)) != 0 {
		return false
	}
	return bytes.Equal(out[34:], in[14:])
}

// validFragNeeded reports whether out is an ICMP "fragmentation needed"
// answering in: 70 bytes, ICMP type 3 code 4, both checksums right, quoting
// in's IP header and first 8 bytes of TCP.
func validFragNeeded(in, out []byte) bool {
	if len(out) != 70 || len(in) < 14+28 {
		return false
	}
	ip, icmp := out[14:34], out[34:]
	return ip[0] == 0x45 && ip[9] == 1 && csumFold(csumAdd(0, ip)) == 0 &&
		icmp[0] == 3 && icmp[1] == 4 && csumFold(csumAdd(0, icmp)) == 0 &&
		bytes.Equal(icmp[8:], in[14:42])
}

// FuzzSteer feeds arbitrary frames to xdp_steer (a service, a backend and
// an affinity for 10.1.0.2 are set, so VIP traffic can be steered). The
// program must never abort, never pass a modified packet other than a
// well-formed encapsulation, and only ever emit well-formed encapsulations.
func FuzzSteer(f *testing.F) {
	f.Add(syn("10.1.0.2", clientPort).frame())
	f.Add(ack("10.1.0.2", clientPort).frame())
	f.Add(syn("10.1.0.3", clientPort).frame())
	f.Add(ipv6Frame(macIn, macClient))
	opts := syn("10.1.0.2", 1234)
	opts.ipOpts = []byte{1, 1, 1, 0, 1, 1, 1, 0}
	f.Add(opts.frame())
	f.Add(syn("10.1.0.2", clientPort).frame()[:40])
	e := newEdgeEnv(f)
	e.steerClient(f, 0)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 14 || len(in) > 1500 {
			t.Skip("test runner needs an Ethernet header; keep frames MTU-sized")
		}
		verdict, out := e.run(t, e.k.objs.Steer, in)
		switch verdict {
		case 2: // PASS: untouched, or encapsulated for the stack to forward
			if !bytes.Equal(out, in) && !validEncap(in, out) {
				t.Fatalf("passed a modified packet\n in %x\nout %x", in, out)
			}
		case 3: // TX: encapsulation back out, or ICMP "fragmentation needed"
			if !validEncap(in, out) && !validFragNeeded(in, out) {
				t.Fatalf("transmitted a bad packet\n in %x\nout %x", in, out)
			}
		case 4: // REDIRECT
			if !validEncap(in, out) {
				t.Fatalf("emitted a bad encapsulation\n in %x\nout %x", in, out)
			}
		case 1: // DROP: only established steered flows that cannot be forwarded
		default:
			t.Fatalf("verdict %d for %x", verdict, in)
		}
	})
}

// FuzzDecap: xdp_decap always passes, and either leaves the frame alone or
// removes exactly the 20 bytes after the Ethernet header.
func FuzzDecap(f *testing.F) {
	inner := ack("10.1.0.2", clientPort).ip()
	f.Add(encap(inner, macBE1, macBE, encapSrc, be1Addr))
	f.Add(syn("10.1.0.2", clientPort).frame())
	f.Add(encap(inner, macBE1, macBE, encapSrc, be1Addr)[:50])
	testbed.RequireRoot(f)
	d := openDecapVIP(f, netip.Addr{})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 14 || len(in) > 1500 {
			t.Skip("test runner needs an Ethernet header; keep frames MTU-sized")
		}
		opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)}
		verdict, err := d.objs.Decap.Run(&opts)
		if err != nil {
			t.Fatal(err)
		}
		out := opts.DataOut
		if verdict != 2 {
			t.Fatalf("verdict %d", verdict)
		}
		stripped := len(in) >= 34 && bytes.Equal(out[:14], in[:14]) && bytes.Equal(out[14:], in[34:])
		if !bytes.Equal(out, in) && !stripped {
			t.Fatalf("bad rewrite\n in %x\nout %x", in, out)
		}
	})
}

// FuzzSteerReady: with the next-hop cache on and the steered flow's ready
// headers in CPU 0's flow cache slot (a packet of the flow has just been
// steered), an arbitrary frame gets exactly the verdict and bytes it gets
// from the full path (the same frame again after a settings write, which
// voids every slot's headers). Mutations of the flow's own packets reach
// steer_fast's checks: header lengths, flags, fragments, options, the MTU.
func FuzzSteerReady(f *testing.F) {
	f.Add(ack("10.1.0.2", clientPort).frame())
	big := ack("10.1.0.2", clientPort)
	big.payload = make([]byte, 1000)
	big.fragOff = 0x4000
	f.Add(big.frame())
	fin := ack("10.1.0.2", clientPort)
	fin.flags |= 0x01
	f.Add(fin.frame())
	f.Add(syn("10.1.0.2", clientPort).frame())
	opts := ack("10.1.0.2", clientPort)
	opts.ipOpts = []byte{1, 1, 1, 0}
	f.Add(opts.frame())
	frag := ack("10.1.0.2", clientPort)
	frag.fragOff = 0x2000
	f.Add(frag.frame())
	f.Add(ack("10.1.0.2", clientPort).frame()[:60])
	e := newEdgeEnvOpts(f, Options{NextHopTTL: time.Hour})
	// The wpbe MTU is 1400, so frames past 1380 bytes of IP take the
	// frag-needed answer (rate-limited: frames stay below it).
	e.ns.Run("ip", "link", "set", "wpbe", "mtu", "1400")
	e.steerClient(f, 0)
	if v, _ := e.run(f, e.k.objs.Steer, syn("10.1.0.2", clientPort).frame()); v != 4 {
		f.Fatalf("SYN verdict %d, want 4", v)
	}
	prime := ack("10.1.0.2", clientPort).frame()
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 14 || len(in) > 1450 {
			t.Skip("test runner needs an Ethernet header; keep frames MTU-sized")
		}
		if v, _ := e.run(t, e.k.objs.Steer, prime); v != 4 {
			t.Fatalf("priming ack verdict %d, want 4", v)
		}
		v1, out1 := e.run(t, e.k.objs.Steer, in)
		if err := e.k.setSettings(encapSrc, time.Hour); err != nil {
			t.Fatal(err)
		}
		v2, out2 := e.run(t, e.k.objs.Steer, in)
		if v1 != v2 || !bytes.Equal(out1, out2) {
			t.Fatalf("ready headers: verdict %d\n%x\nfull path: verdict %d\n%x\nin %x", v1, out1, v2, out2, in)
		}
	})
}
