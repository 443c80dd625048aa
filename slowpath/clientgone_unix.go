//go:build unix

package slowpath

import (
	"crypto/tls"
	"net"
	"syscall"
)

// clientGone reports whether the client closed (or reset) c, without
// consuming anything from it: a non-blocking MSG_PEEK read of one byte that
// finds the end of the stream or an error. Bytes waiting (a pipelined
// request) or none yet mean the client is there. A connection that is not
// a socket counts as there.
//
// Under TLS, bytes waiting are ambiguous: a client that closes sends a
// close_notify record before its FIN, which the peek sees as data. There
// the socket's own state decides: a peer that sent its FIN (CLOSE_WAIT) is
// gone (peerClosed; Linux only, elsewhere such a client counts as there).
func clientGone(c net.Conn) bool {
	_, isTLS := c.(*tls.Conn)
	for {
		if u, ok := c.(interface{ NetConn() net.Conn }); ok {
			c = u.NetConn()
			continue
		}
		break
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
		case err != nil:
			gone = true
		case n == 0:
			gone = true
		case isTLS:
			gone = peerClosed(int(fd))
		}
	})
	return gone || err != nil
}
