package enginesim

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		// Fuzzing (make fuzz) runs no test: the fuzz engine's own
		// goroutines may still be winding down at exit, and leaks are
		// checked on the test runs.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
