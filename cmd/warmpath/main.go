// Command warmpath is the inference-aware router: `warmpath serve` runs the
// OpenAI-compatible L7 router (slowpath/), `warmpath serve --demo` runs it in
// front of three in-process simulated engines. The benches are
// warmpath-bench's (cmd/warmpath-bench), so this binary links no simulator.
//
// serve is a small app (serve.go): each thing it starts (demo engines, fast
// path, server, request recorder, listeners) pushes its cleanup on one
// stack (closers.go), run last in, first out, once, on every exit path; a
// signal drains the server first (drain), a second one cuts the drain.
package main

import (
	"context"
	"io"
	"os"

	"github.com/warmpath/warmpath/cmd/internal/cli"
)

func main() {
	os.Exit(exitCode(run(context.Background(), os.Args[1:], stdEnv()), os.Stderr))
}

// exitCode is the process's exit status for run's error: 2 for a usage
// error (already printed with the usage), 1 for any other (printed here).
func exitCode(err error, stderr io.Writer) int { return cli.ExitCode("warmpath", err, stderr) }
