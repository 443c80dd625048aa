// Package natstest runs an embedded NATS server (github.com/nats-io/nats-server/v2
// as a library) for tests of the scale-out transport: on 127.0.0.1, no
// logs, no signal handlers, shut down at the test's end.
package natstest

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs a NATS server with opts (nil: defaults) on 127.0.0.1 until the
// test ends. opts.Port 0 means a random free port.
func Start(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	if opts == nil {
		opts = &server.Options{}
	}
	opts.Host, opts.NoLog, opts.NoSigs = "127.0.0.1", true, true
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats server not ready in 5s")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// URL is the nats:// URL of s.
func URL(s *server.Server) string {
	return "nats://" + s.Addr().(*net.TCPAddr).String()
}
