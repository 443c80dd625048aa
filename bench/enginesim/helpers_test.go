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

// prefixCase is a second request after a cold one with the shared prompt:
// the tokens its prefix should find cached.
type prefixCase struct {
	name    string
	second  []byte
	adapter string
	salt    string
	want    int
}

// prefixCases is a 10-block shared prompt and the second requests that
// share all, some or none of it (adapter and cache_salt included).
func prefixCases() (shared []byte, cases []prefixCase) {
	shared = prompt("sys", 160) // 10 blocks
	return shared, []prefixCase{
		{"identical prompt reuses all but the last block", shared, "", "", 144},
		{"shared 10 blocks then divergent tail", append(append([]byte(nil), shared...), prompt("user", 40)...), "", "", 160},
		{"divergence inside block 3 keeps 3 blocks", append(append([]byte(nil), shared[:4*(48+5)]...), prompt("other", 100)...), "", "", 48},
		{"different first token shares nothing", append([]byte("XXXX"), shared[4:]...), "", "", 0},
		{"other LoRA adapter shares nothing", shared, "lora-a", "", 0},
		{"other cache_salt shares nothing", shared, "", "salt", 0},
	}
}

// fuzzServer is the small fast engine the HTTP fuzz targets drive.
func fuzzServer(f *testing.F, lora ...string) *Server {
	cfg := DefaultConfig()
	cfg.ServedModelNames = []string{"m"}
	cfg.LoRAModules = lora
	cfg.TimeScale = 1e-6
	cfg.MaxModelLen = 512
	cfg.NumGPUBlocks = 64
	cfg.OutputLen.Max = 16
	cfg.Logger = discardLogger()
	s, err := NewServer(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	return s
}
