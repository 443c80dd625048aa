package fastpath

import (
	"errors"
	"os"
	"testing"
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
