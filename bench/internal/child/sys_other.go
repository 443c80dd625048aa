//go:build !linux

package child

import (
	"errors"
	"syscall"
)

// The live bench reads /proc and uses process groups with a parent-death
// signal: Linux only. Supported is false elsewhere.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(pid int, sig syscall.Signal) error { return errors.ErrUnsupported }

const Supported = false
