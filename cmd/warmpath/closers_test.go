package main

import (
	"errors"
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
