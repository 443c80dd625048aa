package child

import "syscall"

// sysProcAttr puts a child in its own process group and kills it if the
// runner dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup signals the process group led by pid.
func killGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }

// Supported: process groups and Pdeathsig work here.
const Supported = true
