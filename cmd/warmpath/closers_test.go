package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

func TestClosersLIFOOnceJoined(t *testing.T) {
	var c closers
	var order []string
	errB := errors.New("b failed")
	errD := errors.New("d failed")
	for _, n := range []string{"a", "b", "c", "d"} {
		c.push(n, func() error {
			order = append(order, n)
			switch n {
			case "b":
				return errB
			case "d":
				return errD
			}
			return nil
		})
	}
	err := c.close()
	if got := strings.Join(order, ","); got != "d,c,b,a" {
		t.Fatalf("close order %s, want d,c,b,a (every cleanup runs after a failure)", got)
	}
	if !errors.Is(err, errB) || !errors.Is(err, errD) {
		t.Fatalf("close error %v: want both failures joined", err)
	}
	if !strings.Contains(err.Error(), "d: d failed") || !strings.Contains(err.Error(), "b: b failed") {
		t.Fatalf("close error %q: want each failure named", err)
	}
	if err := c.close(); err != nil || len(order) != 4 {
		t.Fatalf("second close: %v, %d cleanups run in all; want nil and 4 (each once)", err, len(order))
	}
	var empty closers
	if err := empty.close(); err != nil {
		t.Fatalf("empty close: %v", err)
	}
}

// TestServeStartFailureCleansUp: serve that fails at its last start-up
// step (the admin port is taken) stops what it had started: the API port
// it had bound is free again, and the demo engines, the server and the
// recorder are closed (TestMain's goleak fails the package on a leaked
// goroutine).
func TestServeStartFailureCleansUp(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := free.Addr().String()
	free.Close()
	sample := filepath.Join(t.TempDir(), "sample.jsonl")
	var errb bytes.Buffer
	err = run(context.Background(), []string{"serve", "--demo", "--listen", api, "--admin", busy.Addr().String(), "--record", sample},
		env{stdout: io.Discard, stderr: &errb})
	if err == nil || !strings.Contains(err.Error(), "listen admin "+busy.Addr().String()) {
		t.Fatalf("err = %v, want the admin listen error\n%s", err, errb.String())
	}
	ln, err := net.Listen("tcp", api)
	if err != nil {
		t.Fatalf("the API port is still bound after the failed start: %v", err)
	}
	ln.Close()
	if strings.Contains(errb.String(), "level=WARN msg=shutdown") {
		t.Errorf("a cleanup failed:\n%s", errb.String())
	}
}
