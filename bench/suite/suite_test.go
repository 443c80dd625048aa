package suite

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The smoke suite runs every bench mode of the simulator at tiny sizes and
// writes a complete report.
func TestSmokeSuite(t *testing.T) {
	dir := t.TempDir()
	res, err := Run(Options{Out: dir, Smoke: true, Replicas: 3, Parallel: 2, Command: "go test ./bench/suite"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Points {
		r := p.Result
		if r == nil || r.Completed+r.Failed != r.Requests || r.Completed == 0 {
			t.Fatalf("point %+v: requests not conserved", p)
		}
	}
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Headline", "shared-prefix", "b2b-saas", "multi-turn", "no-sharing", "mixed",
		"Replica sweep", "KV cache size sweep", "sglang-cache-aware", "llm-d", "dynamo-kv", "Where warmpath stands",
		"## Scale-out", "cost, synced (5ms)", "cost, unsynced", "### Propagation delay (4 routers"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	svgs, _ := filepath.Glob(filepath.Join(dir, "*.svg"))
	if len(svgs) < 3*5+2 {
		t.Errorf("only %d plots", len(svgs))
	}
	for _, s := range svgs {
		b, _ := os.ReadFile(s)
		if !strings.HasPrefix(string(b), "<svg") || !strings.Contains(string(b), "polyline") {
			t.Errorf("%s is not a line plot", s)
		}
	}
	var back Results
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &back); err != nil || len(back.Points) != len(res.Points) {
		t.Fatalf("results.json: %v (%d points)", err, len(back.Points))
	}
}
