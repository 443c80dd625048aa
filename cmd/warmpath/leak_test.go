package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if serve leaves goroutines behind after its
// context ends or SIGTERM. fasthttp's process-wide and self-terminating
// helpers are expected.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}
