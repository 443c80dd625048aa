//go:build !linux

package live

import (
	"errors"
	"syscall"
)

// The live bench reads /proc and uses process groups with a parent-death
// signal: Linux only. Run returns errUnsupported elsewhere.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(pid int, sig syscall.Signal) error { return errors.ErrUnsupported }

const supported = false
