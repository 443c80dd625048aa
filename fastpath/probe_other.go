//go:build !linux

package fastpath

import (
	"fmt"
	"runtime"
)

// Probe always reports ErrUnavailable: XDP needs Linux.
func Probe() error {
	return fmt.Errorf("%w: XDP needs linux, this is %s", ErrUnavailable, runtime.GOOS)
}
