//go:build !linux

package fastpath

import (
	"fmt"
	"log/slog"
	"runtime"
)

func openKernel(Options, *slog.Logger) (Datapath, error) {
	return nil, fmt.Errorf("%w: XDP needs linux, this is %s", ErrUnavailable, runtime.GOOS)
}

// Uninstall returns ErrUnavailable: nothing can be pinned off Linux.
func Uninstall(string) error {
	return fmt.Errorf("%w: XDP needs linux, this is %s", ErrUnavailable, runtime.GOOS)
}
