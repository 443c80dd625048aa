package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
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

// command is one subcommand. The list is explicit (no init side effects).
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, e env) error
}

var commands = []command{
	{"serve", "run the router (--demo: in front of 3 simulated engines)", runServe},
	{"status", "show the pinned fast-path state (services, backends, affinity, counters)", runStatus},
	{"detach", "remove the XDP program and the pinned fast-path state", runDetach},
	{"decap", "GPU host: attach the IPIP decap program for the VIP(s) and exit", runDecap},
	{"check", "validate a config file without serving: every error with its line and field", runCheck},
	{"version", "print version, commit, Go version, build date (--json: as JSON)", runVersion},
}

// benchCommands are warmpath-bench's: the router binary does not link the
// simulator or the nginx orchestration, and points there instead.
var benchCommands = []string{"bench", "analyze"}

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

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: warmpath <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "`warmpath <command> -h` lists the command's flags.")
	fmt.Fprintln(w, "The benches and the workload analysis are warmpath-bench (sim, live, analyze).")
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
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], e)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
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
