package live

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a run leaves goroutines behind (process
// waiters, load generator workers, the fast backend). fasthttp's
// process-wide helpers are expected.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.init.func1"),
		// Exits on its own after a sleep once its server is closed.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}
