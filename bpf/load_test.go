package bpf

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// loadObjects loads every program and map of the embedded object (maps
// unpinned), each program with flags added to its load flags.
func loadObjects(t *testing.T, flags uint32) *WarmpathObjects {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	spec, err := LoadWarmpath()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	for _, p := range spec.Programs {
		p.Flags |= flags
	}
	var objs WarmpathObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load (program flags %#x): %+v", flags, err)
	}
	t.Cleanup(func() { _ = objs.Close() })
	return &objs
}

// TestLoad loads every program and map of the embedded object, so a
// verifier rejection of the committed object fails here first.
func TestLoad(t *testing.T) {
	objs := loadObjects(t, 0)
	for name, p := range map[string]*ebpf.Program{
		"xdp_steer": objs.XdpSteer, "xdp_decap": objs.XdpDecap,
		"xdp_pass": objs.XdpPass,
	} {
		if p.Type() != ebpf.XDP {
			t.Errorf("%s: type %v, want XDP", name, p.Type())
		}
	}
}

// TestLoadStrictAlignment loads the programs as the verifier checks them on
// architectures without efficient unaligned access (BPF_F_STRICT_ALIGNMENT:
// every packet access aligned to its size, the frame at NET_IP_ALIGN), so
// a wide unaligned load or store fails here, not on such a machine.
func TestLoadStrictAlignment(t *testing.T) {
	loadObjects(t, unix.BPF_F_STRICT_ALIGNMENT)
}
