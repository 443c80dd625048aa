package fastpath

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
)

var probeOnce = sync.OnceValue(probeKernel)

// Probe reports whether the kernel datapath can run: nil, an error wrapping
// ErrUnavailable with the reason (no permission, feature missing), or
// another error (the probe itself failed). The checks run once per process.
func Probe() error { return probeOnce() }

func probeKernel() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return classify("raise memlock rlimit", err)
	}
	for _, pt := range []ebpf.ProgramType{ebpf.XDP} {
		if err := features.HaveProgramType(pt); err != nil {
			return classify(fmt.Sprintf("program type %v", pt), err)
		}
	}
	for _, mt := range []ebpf.MapType{ebpf.Hash, ebpf.Array, ebpf.PerCPUArray, ebpf.LRUHash} {
		if err := features.HaveMapType(mt); err != nil {
			return classify(fmt.Sprintf("map type %v", mt), err)
		}
	}
	for _, fn := range []asm.BuiltinFunc{asm.FnFibLookup, asm.FnXdpAdjustHead, asm.FnRedirect, asm.FnKtimeGetNs} {
		if err := features.HaveProgramHelper(ebpf.XDP, fn); err != nil {
			return classify(fmt.Sprintf("xdp helper %v", fn), err)
		}
	}
	return nil
}

// classify wraps err in ErrUnavailable when it means "this host cannot run
// BPF" (unsupported, or not permitted); other errors pass through.
func classify(what string, err error) error {
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("%w: %s not supported by the kernel: %v", ErrUnavailable, what, err)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: %s: not permitted (need root, or CAP_BPF and CAP_NET_ADMIN): %v", ErrUnavailable, what, err)
	}
	return fmt.Errorf("probe %s: %w", what, err)
}
