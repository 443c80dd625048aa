//go:build !linux

package fastpath

import "time"

var start = time.Now()

// monoNow is a monotonic clock in nanoseconds since process start.
func monoNow() int64 { return int64(time.Since(start)) }
