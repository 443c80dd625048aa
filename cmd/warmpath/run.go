package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/warmpath/warmpath/cmd/internal/cli"
)

// env is what run needs from the process; tests substitute it.
type env struct {
	stdout, stderr io.Writer
	// ready, if set, is called once the listeners are bound.
	ready func(api, admin net.Addr)
	// probe, if set, replaces the fast path's capability probe (tests).
	probe func() error
}

func stdEnv() env { return env{stdout: os.Stdout, stderr: os.Stderr} }

// commands is the explicit list of subcommands (no init side effects).
var commands = []cli.Command[env]{
	{Name: "serve", Summary: "run the router (--demo: in front of 3 simulated engines)", Run: runServe},
	{Name: "status", Summary: "show the pinned fast-path state (services, backends, affinity, counters)", Run: runStatus},
	{Name: "detach", Summary: "remove the XDP program and the pinned fast-path state", Run: runDetach},
	{Name: "decap", Summary: "GPU host: attach the IPIP decap program for the VIP(s) and exit", Run: runDecap},
	{Name: "check", Summary: "validate a config file without serving: every error with its line and field", Run: runCheck},
	{Name: "version", Summary: "print version, commit, Go version, build date (--json: as JSON)", Run: runVersion},
}

// benchCommands are warmpath-bench's: the router binary does not link the
// simulator or the nginx orchestration, and points there instead.
var benchCommands = []string{"bench", "analyze"}

var errUsage = cli.ErrUsage

// flagError is a bad command line the flag package has already printed.
type flagError = cli.FlagError

// parseFlags parses args into fs; a bad flag is a flagError, -h is
// flag.ErrHelp (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error { return cli.ParseFlags(fs, args) }

func usage(w io.Writer) {
	cli.Usage(w, "warmpath", commands, "The benches and the workload analysis are warmpath-bench (sim, live, analyze).")
}

func run(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		usage(e.stderr)
		return errUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		usage(e.stdout)
		return nil
	case "--version", "-version":
		fmt.Fprintln(e.stdout, currentBuild().line())
		return nil
	}
	if slices.Contains(benchCommands, args[0]) {
		fmt.Fprintf(e.stderr, "warmpath %s is in its own binary, warmpath-bench (make build puts it beside warmpath in bin/): warmpath-bench %s\n",
			args[0], strings.Join(benchArgs(args), " "))
		return errUsage
	}
	if found, err := cli.Run(ctx, commands, args, e); found {
		return err
	}
	usage(e.stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

// benchArgs is the warmpath-bench command line for a `warmpath bench` or
// `warmpath analyze` one: `bench sim ...` is `sim ...`.
func benchArgs(args []string) []string {
	if args[0] == "bench" {
		if len(args) == 1 {
			return []string{"-h"}
		}
		return args[1:]
	}
	return args
}

// hostPort turns a bound listener address into something curl can reach.
func hostPort(a net.Addr) string {
	s := a.String()
	if h, p, err := net.SplitHostPort(s); err == nil && (h == "::" || h == "0.0.0.0" || h == "") {
		return "127.0.0.1:" + p
	}
	return strings.TrimSpace(s)
}
