//go:build unix

package slowpath

import "syscall"

// RaiseFDLimit raises the soft limit on open files to the hard limit and
// returns both as they are afterwards. (The Go runtime already raises it at
// start on most systems; a child process or a changed limit may not have it.)
func RaiseFDLimit() (soft, hard uint64, err error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, 0, err
	}
	if l.Cur < l.Max {
		want := l
		want.Cur = want.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
			l = want
		}
	}
	return l.Cur, l.Max, nil
}

// fdSoftLimit is the current soft limit on open files, 0 if unknown.
func fdSoftLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}
