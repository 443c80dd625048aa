package fastpath

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"github.com/warmpath/warmpath/bpf"
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
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		return fmt.Errorf("probe: load bpf spec: %w", err)
	}
	return probeHelpers(spec, features.HaveProgramHelper)
}

// probeHelpers checks every helper each program of spec calls, read from
// the compiled instructions so the list cannot fall behind the C source: a
// helper the kernel lacks must make the probe fail (auto mode then falls
// back), not the program load.
func probeHelpers(spec *ebpf.CollectionSpec, have func(ebpf.ProgramType, asm.BuiltinFunc) error) error {
	for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
		ps := spec.Programs[name]
		for _, fn := range helpersOf(ps) {
			if err := have(ps.Type, fn); err != nil {
				return classify(fmt.Sprintf("%v helper %v (used by %s)", ps.Type, fn, name), err)
			}
		}
	}
	return nil
}

// helpersOf lists the helpers a program calls, sorted, once each.
func helpersOf(ps *ebpf.ProgramSpec) []asm.BuiltinFunc {
	var out []asm.BuiltinFunc
	for _, ins := range ps.Instructions {
		if ins.IsBuiltinCall() {
			if fn := asm.BuiltinFunc(ins.Constant); !slices.Contains(out, fn) {
				out = append(out, fn)
			}
		}
	}
	slices.Sort(out)
	return out
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
