package live

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmokeTenants runs the tenants scenario alone at smoke sizes: nine
// rows, every quiet request answered in the six with the quiet tenant,
// the flood running in every row but the first, each policy row's flood
// compared with its base, tenants.md and tenants.json written and live.md
// not.
func TestSmokeTenants(t *testing.T) {
	trackChildren(t)
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{Smoke: true, Out: out, Scenario: ScenarioTenants, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tenants == nil || len(res.Tenants.Rows) != 9 || len(res.Workloads) != 0 || len(res.Overhead) != 0 {
		t.Fatalf("result %+v", res)
	}
	for i, r := range res.Tenants.Rows {
		if withQuiet := i < 6; r.Quiet.OK != r.Quiet.Sent || (r.Quiet.Sent > 0) != withQuiet || withQuiet && r.Quiet.TTFT.P99 <= 0 {
			t.Fatalf("row %s: quiet %+v", r.Config, r.Quiet)
		}
		if (r.Flood != nil) != (i > 0) || (r.Flood != nil && r.Flood.OK == 0) {
			t.Fatalf("row %s: flood %+v", r.Config, r.Flood)
		}
		if hasBase := i >= 2 && i != 6; (r.FloodVs > 0) != hasBase {
			t.Fatalf("row %s: flood vs %q %.2f", r.Config, r.FloodBase, r.FloodVs)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tenants.md"))
	if err != nil || !strings.Contains(string(md), "flood + quiet, fair queue") {
		t.Fatalf("tenants.md: %v\n%s", err, md)
	}
	if _, err := os.Stat(filepath.Join(out, "tenants.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "live.md")); !os.IsNotExist(err) {
		t.Fatalf("the scenario wrote live.md: %v", err)
	}
	if _, err := Run(ctx, Options{Smoke: true, Scenario: "nope"}); err == nil || !strings.Contains(err.Error(), "unknown scenario") {
		t.Fatalf("unknown scenario: %v", err)
	}
}
