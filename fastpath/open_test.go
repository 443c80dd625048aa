package fastpath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestOpenModeSelection(t *testing.T) {
	unavailable := func() error { return fmt.Errorf("%w: simulated: no BPF here", ErrUnavailable) }
	broken := func() error { return errors.New("probe exploded") }
	mustNotRun := func() error { t.Error("probe called in userspace mode"); return nil }
	tests := []struct {
		name     string
		mode     Mode
		probe    func() error
		wantMode Mode
		wantErr  error  // errors.Is target; nil = no error
		wantLog  string // substring of the single log line
	}{
		{name: "auto falls back when BPF is unavailable", mode: ModeAuto, probe: unavailable,
			wantMode: ModeUserspace, wantLog: "simulated: no BPF here"},
		{name: "zero mode is auto", mode: "", probe: unavailable,
			wantMode: ModeUserspace, wantLog: "reason="},
		{name: "forced userspace never probes", mode: ModeUserspace, probe: mustNotRun,
			wantMode: ModeUserspace, wantLog: "forced"},
		{name: "forced kernel where impossible is an error", mode: ModeKernel, probe: unavailable,
			wantErr: ErrUnavailable},
		{name: "auto does not hide a broken probe", mode: ModeAuto, probe: broken,
			wantErr: errors.New("probe exploded")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			dp, err := Open(Options{Mode: tc.mode, Probe: tc.probe, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if tc.wantErr != nil {
				if err == nil {
					dp.Close()
					t.Fatalf("Open succeeded, want error %v", tc.wantErr)
				}
				if !errors.Is(err, tc.wantErr) && !strings.Contains(err.Error(), tc.wantErr.Error()) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = dp.Close() })
			if dp.Mode() != tc.wantMode {
				t.Errorf("mode %s, want %s", dp.Mode(), tc.wantMode)
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.wantLog) {
				t.Errorf("want one log line containing %q, got %q", tc.wantLog, logs.String())
			}
		})
	}
}

// TestFallbackBehavesLikeKernelAPI: with the probe failing, Open yields a
// datapath that honours the whole API contract.
func TestFallbackBehavesLikeKernelAPI(t *testing.T) {
	clk := &fakeClock{}
	dp, err := Open(Options{
		Probe:  func() error { return fmt.Errorf("%w: simulated", ErrUnavailable) },
		Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
		Now:    clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	if dp.Mode() != ModeUserspace {
		t.Fatalf("mode %s", dp.Mode())
	}
	testContract(t, dp, clk)
}

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		err  bool
	}{{"", ModeAuto, false}, {"auto", ModeAuto, false}, {"kernel", ModeKernel, false},
		{"userspace", ModeUserspace, false}, {"xdp", "", true}} {
		got, err := ParseMode(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("ParseMode(%q) = %q, %v", tc.in, got, err)
		}
	}
}
