// Command warmpath is the inference-aware router: `warmpath serve` runs the
// OpenAI-compatible L7 router (slowpath/), `warmpath serve --demo` runs it in
// front of three in-process simulated engines.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(exitCode(run(context.Background(), os.Args[1:], stdEnv()), os.Stderr))
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
	fmt.Fprintln(stderr, "warmpath:", err)
	return 1
}
