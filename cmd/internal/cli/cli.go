// Package cli is the command-line plumbing warmpath and warmpath-bench
// share: a list of subcommands, their usage, flag parsing that reports a
// bad flag once, and the exit status (0, 1 for an error, 2 for a usage
// error).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage is a usage error already printed with the usage: exit 2.
var ErrUsage = errors.New("usage")

// FlagError is a bad command line the flag package has already printed,
// with the command's flags: the process exits 2 without printing it again.
type FlagError struct{ Err error }

func (e FlagError) Error() string        { return e.Err.Error() }
func (e FlagError) Unwrap() error        { return e.Err }
func (e FlagError) Is(target error) bool { return target == ErrUsage }

// ParseFlags parses args into fs; a bad flag is a FlagError, -h is
// flag.ErrHelp (exit 0).
func ParseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return FlagError{err}
}

// ExitCode is the process's exit status for err: 2 for a usage error
// (already printed), 1 for any other, printed here after "prog: ".
func ExitCode(prog string, err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return 1
}

// Command is one subcommand; E is what it needs from the process (its
// output streams, and whatever tests substitute).
type Command[E any] struct {
	Name, Summary string
	Run           func(ctx context.Context, args []string, e E) error
}

// Usage prints prog's usage: the commands with their summaries, then the
// extra lines.
func Usage[E any](w io.Writer, prog string, cmds []Command[E], extra ...string) {
	fmt.Fprintf(w, "usage: %s <command> [flags]\n\ncommands:\n", prog)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-8s %s\n", c.Name, c.Summary)
	}
	fmt.Fprintf(w, "\n`%s <command> -h` lists the command's flags.\n", prog)
	for _, l := range extra {
		fmt.Fprintln(w, l)
	}
}

// Run runs the command args[0] names with the rest of args; found is false
// when no command has that name. A command's -h (flag.ErrHelp) is success.
func Run[E any](ctx context.Context, cmds []Command[E], args []string, e E) (found bool, err error) {
	for _, c := range cmds {
		if c.Name == args[0] {
			err := c.Run(ctx, args[1:], e)
			if errors.Is(err, flag.ErrHelp) {
				return true, nil
			}
			return true, err
		}
	}
	return false, nil
}
