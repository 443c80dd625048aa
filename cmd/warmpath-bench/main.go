// Command warmpath-bench runs the benches and the workload analysis:
// `warmpath-bench sim` (the cluster simulator on the real affinity code),
// `warmpath-bench live` (real processes: warmpath vs nginx vs direct) and
// `warmpath-bench analyze` (should this workload use prefix-aware
// routing?). It is its own binary so the router does not link the
// simulator and the nginx orchestration; `make build` puts it in bin/
// beside warmpath, which `live` measures.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/warmpath/warmpath/cmd/internal/cli"
)

func main() {
	os.Exit(exitCode(run(context.Background(), os.Args[1:], env{stdout: os.Stdout, stderr: os.Stderr}), os.Stderr))
}

// env is what run needs from the process; tests substitute it.
type env struct {
	stdout, stderr io.Writer
}

// commands is the explicit list of subcommands (no init side effects).
var commands = []cli.Command[env]{
	{Name: "sim", Summary: "the cluster simulator: every workload x load x policy on the real affinity code, beside the anchors' policies", Run: runSim},
	{Name: "live", Summary: "real processes over loopback: warmpath vs nginx vs direct, on enginesim and real llama.cpp fleets", Run: runLive},
	{Name: "analyze", Summary: "should this workload use prefix-aware routing? (trace or request log)", Run: runAnalyze},
}

func parseFlags(fs *flag.FlagSet, args []string) error { return cli.ParseFlags(fs, args) }

func exitCode(err error, stderr io.Writer) int { return cli.ExitCode("warmpath-bench", err, stderr) }

func usage(w io.Writer) { cli.Usage(w, "warmpath-bench", commands) }

func run(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		usage(e.stderr)
		return cli.ErrUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(e.stdout)
		return nil
	}
	if found, err := cli.Run(ctx, commands, args, e); found {
		return err
	}
	fmt.Fprintf(e.stderr, "warmpath-bench: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return cli.ErrUsage
}
