// Command warmpath is the inference-aware router: `warmpath serve` runs the
// OpenAI-compatible L7 router (slowpath/), `warmpath serve --demo` runs it in
// front of three in-process simulated engines.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

func main() {
	err := run(context.Background(), os.Args[1:], stdEnv())
	switch {
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "warmpath:", err)
		os.Exit(1)
	}
}
