package fastpath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/warmpath/warmpath/bpf"
)

// TestProbe: as root on this kernel the probe passes; without privileges it
// must say "unavailable" (so auto mode falls back) rather than fail hard.
func TestProbe(t *testing.T) {
	err := Probe()
	if os.Geteuid() == 0 {
		if err != nil {
			t.Fatalf("probe as root: %v", err)
		}
		return
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("probe without privileges: %v, want ErrUnavailable", err)
	}
	t.Logf("unprivileged probe: %v", err)
}

// TestProbeCoversEveryHelper: the probe checks each helper the compiled
// programs call (bpf_ktime_get_coarse_ns and bpf_xdp_adjust_tail too); a kernel
// without one of them is "unavailable" (auto falls back), naming it.
func TestProbeCoversEveryHelper(t *testing.T) {
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		t.Fatal(err)
	}
	probed := map[asm.BuiltinFunc]bool{}
	if err := probeHelpers(spec, func(pt ebpf.ProgramType, fn asm.BuiltinFunc) error {
		if pt != ebpf.XDP {
			t.Errorf("helper %v probed for program type %v", fn, pt)
		}
		probed[fn] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, fn := range []asm.BuiltinFunc{asm.FnKtimeGetCoarseNs, asm.FnXdpAdjustTail, asm.FnFibLookup, asm.FnXdpAdjustHead,
		asm.FnRedirect, asm.FnJiffies64, asm.FnMapLookupElem, asm.FnMapUpdateElem} {
		if !probed[fn] {
			t.Errorf("helper %v used by the programs but not probed", fn)
		}
	}
	err = probeHelpers(spec, func(_ ebpf.ProgramType, fn asm.BuiltinFunc) error {
		if fn == asm.FnKtimeGetCoarseNs {
			return fmt.Errorf("%w: helper %v", ebpf.ErrNotSupported, fn)
		}
		return nil
	})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "FnKtimeGetCoarseNs") {
		t.Fatalf("missing helper: %v, want ErrUnavailable naming it", err)
	}
}

// TestOpenAutoWithoutBPFFS: auto mode whose pin path is not on bpffs (not
// mounted) falls back to userspace with one log line instead of failing;
// kernel mode still fails.
func TestOpenAutoWithoutBPFFS(t *testing.T) {
	pin := filepath.Join(t.TempDir(), "warmpath")
	var logs bytes.Buffer
	dp, err := Open(Options{Mode: ModeAuto, PinPath: pin, Probe: func() error { return nil },
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("auto without bpffs: %v", err)
	}
	defer dp.Close()
	if dp.Mode() != ModeUserspace || !strings.Contains(logs.String(), "is not a bpffs mount") {
		t.Fatalf("mode %s, log %q", dp.Mode(), logs.String())
	}
	if dp, err := Open(Options{Mode: ModeKernel, PinPath: pin, Probe: func() error { return nil }}); err == nil {
		dp.Close()
		t.Fatal("kernel mode without bpffs succeeded")
	}
}
