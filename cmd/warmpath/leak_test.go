package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if serve leaves goroutines behind after its
// context ends or SIGTERM. fasthttp's process-wide and self-terminating
// helpers are expected.
//
// With WARMPATH_E2E_CHILD=1 the test binary is warmpath itself (os.Args[1:]
// are warmpath's arguments): the end-to-end test runs the edge's warmpath
// as a child process in a network namespace and kills it with SIGKILL.
// childEnv makes the test binary run warmpath itself (see TestMain).
const childEnv = "WARMPATH_E2E_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		err := run(context.Background(), os.Args[1:], stdEnv())
		switch {
		case errors.Is(err, errUsage):
			os.Exit(2)
		case err != nil:
			fmt.Fprintln(os.Stderr, "warmpath:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}
