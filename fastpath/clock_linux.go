package fastpath

import "golang.org/x/sys/unix"

// monoNow reads CLOCK_MONOTONIC, the clock bpf_ktime_get_coarse_ns is a
// tick-grained view of.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
