package slowpath

import (
	"encoding/binary"
	"syscall"
)

// tcpCloseWait is Linux's TCP_CLOSE_WAIT state: the peer sent its FIN.
const tcpCloseWait = 8

// peerClosed reports whether the peer of socket fd has sent its FIN: the
// first byte of struct tcp_info is the connection's state (the kernel
// copies as much of the struct as asked for: here 4 bytes).
func peerClosed(fd int) bool {
	v, err := syscall.GetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_INFO)
	if err != nil {
		return false
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(v))
	return b[0] == tcpCloseWait
}
