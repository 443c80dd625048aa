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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(exitCode(run(context.Background(), os.Args[1:], env{stdout: os.Stdout, stderr: os.Stderr}), os.Stderr))
}

// env is what run needs from the process; tests substitute it.
type env struct {
	stdout, stderr io.Writer
}

// command is one subcommand. The list is explicit (no init side effects).
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, e env) error
}

var commands = []command{
	{"sim", "the cluster simulator: every workload x load x policy on the real affinity code, beside the anchors' policies", runSim},
	{"live", "real processes over loopback: warmpath vs nginx vs direct, on enginesim and real llama.cpp fleets", runLive},
	{"analyze", "should this workload use prefix-aware routing? (trace or request log)", runAnalyze},
}

var errUsage = errors.New("usage")

// flagError is a bad command line the flag package has already printed,
// with the command's flags: main exits 2 without printing it again.
type flagError struct{ err error }

func (e flagError) Error() string        { return e.err.Error() }
func (e flagError) Unwrap() error        { return e.err }
func (e flagError) Is(target error) bool { return target == errUsage }

// parseFlags parses args into fs; a bad flag is a flagError, -h is
// flag.ErrHelp (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return flagError{err}
}

// exitCode is the process's exit status for run's error: 2 for a usage
// error (already printed with the usage), 1 for any other (printed here).
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintln(stderr, "warmpath-bench:", err)
	return 1
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: warmpath-bench <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "`warmpath-bench <command> -h` lists the command's flags.")
}

func run(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		usage(e.stderr)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(e.stdout)
		return nil
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], e)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	fmt.Fprintf(e.stderr, "warmpath-bench: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return errUsage
}
