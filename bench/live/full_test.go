//go:build livefull

package live

import (
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"
)

// The full live bench is not a CI test; it runs only with the livefull tag:
//
//	go test -tags livefull -run TestFull -timeout 30m -v ./bench/live -live.out ../results/live
//
// The report records the command with the -live flags given.
var (
	fullOut = flag.String("live.out", "", "directory for live.md and live.json (relative to bench/live)")
	fullRPS = flag.Float64("live.rps", 0, "routing workloads' cluster arrival rate (0 = default)")
	noOver  = flag.Bool("live.skip-overhead", false, "calibration: routing part only")
	fullPol = flag.String("live.policies", "", "comma-separated warmpath policies (\"\" = default)")
	noNginx = flag.Bool("live.skip-nginx", false, "leave the nginx rows out")
	fullTS  = flag.Float64("live.time-scale", 0, "engines' time scale (0 = default)")
	fullWP  = flag.String("live.warmpath", "", "warmpath binary (\"\" = go build)")
	fullES  = flag.String("live.enginesim", "", "enginesim binary (\"\" = go build)")
	fullC   = flag.String("live.commit", "", "commit the binaries were built from (\"\" = git in the working directory)")
	fullCmd = flag.String("live.command", "", "command recorded in the report (\"\" = this test's)")
	fullFl  = flag.String("live.fleets", "", "comma-separated fleets (\"\" = all)")
	perfOne = flag.Bool("live.perf-only", false, "only the proxy-cost bench: perf.md and perf.json")
	perfBL  = flag.String("live.baseline", "", "a second warmpath binary for the proxy-cost bench")
	perfBLN = flag.String("live.baseline-label", "", "its label in the report (\"\" = baseline)")
	fullRds = flag.Int("live.rounds", 0, "overhead and perf rounds (0 = default)")
	fullRR  = flag.Int("live.routing-rounds", 0, "rounds of every routing point (0 = default)")
	perfShp = flag.String("live.perf-shapes", "", "comma-separated proxy-cost shapes (\"\" = all)")
	fullWl  = flag.String("live.workloads", "", "comma-separated routing workloads (\"\" = all)")
)

// fullCommand is the go test command line of this run: the package and
// every -live flag set on it (paths as given).
func fullCommand() string {
	cmd := "go test -tags livefull -run TestFull -v ./bench/live"
	if f := flag.Lookup("test.timeout"); f != nil && f.Value.String() != "0s" {
		cmd = "go test -tags livefull -run TestFull -timeout " + f.Value.String() + " -v ./bench/live"
	}
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "live.") && f.Name != "live.command" {
			cmd += " -" + f.Name + " " + f.Value.String()
		}
	})
	return cmd
}

func TestFull(t *testing.T) {
	var rps []float64
	if *fullRPS > 0 {
		rps = []float64{*fullRPS}
	}
	var pols []string
	if *fullPol != "" {
		pols = strings.Split(*fullPol, ",")
	}
	var fleets []string
	if *fullFl != "" {
		fleets = strings.Split(*fullFl, ",")
	}
	var wls []string
	if *fullWl != "" {
		wls = strings.Split(*fullWl, ",")
	}
	var shapes []string
	if *perfShp != "" {
		shapes = strings.Split(*perfShp, ",")
	}
	opts := Options{PerfShapes: shapes, Workloads: wls, Out: *fullOut, Fleets: fleets, RPS: rps, Progress: testWriter{t}, RoutingOnly: *noOver, Policies: pols, SkipNginx: *noNginx, TimeScale: *fullTS,
		WarmpathBin: *fullWP, EnginesimBin: *fullES, Commit: *fullC,
		PerfOnly: *perfOne, BaselineWarmpathBin: *perfBL, BaselineLabel: *perfBLN, Rounds: *fullRds, RoutingRounds: *fullRR,
		Command: fullCommand()}
	if *fullCmd != "" {
		opts.Command = *fullCmd
	}
	// The bench stops a minute before the test's own deadline (-timeout),
	// so that a long run writes what it has instead of being killed.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	if dl, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), dl.Add(-time.Minute))
	}
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.WriteMarkdown(os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// TestFullCommand: the recorded command carries the -live flags the run
// was given.
func TestFullCommand(t *testing.T) {
	if err := flag.Set("live.workloads", "no-sharing"); err != nil {
		t.Fatal(err)
	}
	defer flag.Set("live.workloads", "")
	cmd := fullCommand()
	if !strings.Contains(cmd, " -live.workloads no-sharing") || !strings.HasPrefix(cmd, "go test -tags livefull -run TestFull") {
		t.Fatalf("command %q", cmd)
	}
}
