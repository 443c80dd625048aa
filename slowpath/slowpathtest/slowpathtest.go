// Package slowpathtest has test helpers for packages that run a
// slowpath.Server (slowpath's external tests, slowpath/cluster,
// cmd/warmpath). slowpath's internal tests keep their own copy (an
// internal test cannot import a package that imports slowpath).
package slowpathtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/warmpath/warmpath/slowpath"
)

// Serve runs s on a loopback listener until the test ends, then shuts it
// down gracefully (10 s bound) and fails the test if Shutdown or Serve
// report an error. It returns the API base URL ("http://127.0.0.1:port").
func Serve(t testing.TB, s *slowpath.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}
