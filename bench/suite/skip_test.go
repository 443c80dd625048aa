package suite

import (
	"strings"
	"testing"
)

// TestMooncakeSkippedSaysWhy: without a trace the Mooncake workload is left
// out with the places looked at and the flag to give one.
func TestMooncakeSkippedSaysWhy(t *testing.T) {
	saved := traceCandidates
	traceCandidates = []string{t.TempDir() + "/absent.jsonl"}
	t.Cleanup(func() { traceCandidates = saved })
	ws, skipped, err := workloads(Options{Smoke: true, Seed: 1, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if strings.Contains(w.Name, "mooncake") {
			t.Fatalf("workload %s present without a trace", w.Name)
		}
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "mooncake skipped: no trace") ||
		!strings.Contains(skipped[0], "absent.jsonl") || !strings.Contains(skipped[0], "--trace FILE") {
		t.Fatalf("skipped = %q", skipped)
	}
}
