package live

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmokeTenants runs the tenants scenario alone at smoke sizes: four
// rows, every quiet request answered, the flood running beside it in the
// two flood rows, tenants.md and tenants.json written and live.md not.
func TestSmokeTenants(t *testing.T) {
	trackChildren(t)
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{Smoke: true, Out: out, Scenario: ScenarioTenants, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tenants == nil || len(res.Tenants.Rows) != 4 || len(res.Workloads) != 0 || len(res.Overhead) != 0 {
		t.Fatalf("result %+v", res)
	}
	for i, r := range res.Tenants.Rows {
		if r.Quiet.OK != r.Quiet.Sent || r.Quiet.Sent == 0 || r.Quiet.TTFT.P99 <= 0 {
			t.Fatalf("row %s: quiet %+v", r.Config, r.Quiet)
		}
		if (r.Flood != nil) != (i > 0) || (r.Flood != nil && r.Flood.OK == 0) {
			t.Fatalf("row %s: flood %+v", r.Config, r.Flood)
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
