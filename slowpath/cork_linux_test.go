package slowpath

import (
	"net"
	"syscall"
)

// corkForFIN holds c's writes (TCP_CORK) until its CloseWrite, which then
// sends the last bytes and the FIN in one segment: a peer that has read
// the answer's end has the FIN queued behind it, as when an engine's close
// arrives with its last write, and no scheduling gap can let a request go
// out in between.
func corkForFIN(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	if rc, err := tc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 1)
		})
	}
}
