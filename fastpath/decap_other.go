//go:build !linux

package fastpath

import (
	"fmt"
	"runtime"
)

// Decap is the GPU-host decapsulator; it needs Linux.
type Decap struct{}

// OpenDecap returns ErrUnavailable: XDP needs Linux.
func OpenDecap(DecapOptions) (*Decap, error) {
	return nil, fmt.Errorf("%w: XDP needs linux, this is %s", ErrUnavailable, runtime.GOOS)
}

// SetServices returns ErrUnavailable.
func (*Decap) SetServices([]Service) error { return ErrUnavailable }

// Services returns ErrUnavailable.
func (*Decap) Services() ([]Service, error) { return nil, ErrUnavailable }

// Counters returns ErrUnavailable.
func (*Decap) Counters() (Counters, error) { return Counters{}, ErrUnavailable }

// Close does nothing.
func (*Decap) Close() error { return nil }

// Detach returns ErrUnavailable.
func (*Decap) Detach() error { return ErrUnavailable }
