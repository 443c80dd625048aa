package slowpath

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a TCP connection's socket with raw system calls
// (syscall.RawSyscall) inside its syscall.RawConn, which still waits on
// the runtime's network poller when the socket has nothing to read or no
// room to write, and still honours the connection's deadlines and Close.
//
// Why: net.Conn's Read and Write go through syscall.Syscall, whose
// entersyscall/exitsyscall bracket costs about as much as a short read of
// loopback data, and wakes the runtime's sysmon thread whenever it sleeps
// because every P was idle. A relayed stream makes a few such calls per
// event at an LLM's pace, so a stream's process spends a sixth of its CPU
// in sysmon waking, polling at 20 µs and sleeping again. A read or write
// of a non-blocking socket returns at once (EAGAIN when it would block), so
// it needs no bracket: the P is not held any longer than by the call
// itself.
//
// Reads and writes have their own state: one goroutine may read while
// another writes, as on a net.Conn; two concurrent reads (or writes) are
// not allowed, which no caller does (fasthttp and the relay read a
// connection from one goroutine at a time).
type rawIO struct {
	rc    syscall.RawConn
	laddr net.Addr
	raddr net.Addr

	rbuf []byte
	rn   int
	rerr syscall.Errno
	rfn  func(uintptr) bool // rawIO.readFD, bound once (no allocation per read)

	wbuf []byte
	wn   int
	werr syscall.Errno
	wfn  func(uintptr) bool // rawIO.writeFD

	// A read session (session): reads inside it are single system calls on
	// sfd, and one that would block returns errWouldBlock.
	inSession bool
	sfd       uintptr
	sf        func() bool        // the session's step
	sfn       func(uintptr) bool // rawIO.sessionFD, bound once: a closure per session would be garbage per request

	pclosed bool          // peekFD's answer
	pfn     func(uintptr) // rawIO.peekFD, bound once
}

// newRawIO returns c's raw reader and writer, or nil when c is not a TCP
// connection (callers then use c's own Read and Write).
func newRawIO(c net.Conn) *rawIO {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawIO{rc: rc, laddr: tc.LocalAddr(), raddr: tc.RemoteAddr()}
	r.rfn, r.wfn, r.sfn, r.pfn = r.readFD, r.writeFD, r.sessionFD, r.peekFD
	return r
}

// read is net.Conn.Read: at least one byte, io.EOF at the peer's FIN, or
// an error (*net.OpError, as net's: deadlines, a closed connection,
// ECONNRESET all test as they do there).
func (r *rawIO) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.inSession {
		return r.sessionRead(p)
	}
	r.rbuf, r.rn, r.rerr = p, 0, 0
	err := r.rc.Read(r.rfn)
	r.rbuf = nil
	switch {
	case err != nil:
		return 0, err
	case r.rerr != 0:
		return 0, r.opError("read", r.rerr)
	case r.rn == 0:
		return 0, io.EOF
	}
	return r.rn, nil
}

func (r *rawIO) readFD(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&r.rbuf[0])), uintptr(len(r.rbuf)))
		switch e {
		case 0:
			r.rn = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait on the poller, then again
		}
		r.rerr = e
		return true
	}
}

// session calls f until it returns true, with the connection's read lock
// held throughout; between calls (f returned false) it waits on the poller
// until the socket is readable, without clearing a readiness that came
// during f. Inside f, read makes one system call and returns errWouldBlock
// when the socket has nothing. So f may write a request and return false
// at once: the answer cannot arrive before the request, and it wakes the
// session when it does (firstByteSession), where a net.Conn read would
// first make a read that only learns EAGAIN. (A short read is no sign
// that the socket is empty: a FIN that came with the data stays readable
// without a new wake-up, so f never waits without a read that said so.)
// session returns what waiting returns: nil once f returned true, else a
// deadline, a closed connection.
func (r *rawIO) session(f func() bool) error {
	r.sf = f
	err := r.rc.Read(r.sfn)
	r.inSession, r.sf = false, nil
	return err
}

func (r *rawIO) sessionFD(fd uintptr) bool {
	r.inSession, r.sfd = true, fd
	done := r.sf()
	r.inSession = false
	return done
}

// errWouldBlock: a read session's socket has nothing to read now.
var errWouldBlock = errors.New("rawio: nothing to read now")

func (r *rawIO) sessionRead(p []byte) (int, error) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, r.sfd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			if n == 0 {
				return 0, io.EOF
			}
			return int(n), nil
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, errWouldBlock
		}
		return 0, r.opError("read", e)
	}
}

// peerClosed reports whether the peer has closed the connection: its FIN
// (or a reset) waits to be read. One non-blocking peek, through Control:
// it neither clears the poller's readiness nor meets a deadline in force.
// Bytes waiting are not a close (a TLS peer may send a session ticket).
//
// Why: llama.cpp's server (cpp-httplib) closes a connection after each
// streamed answer, though its headers offer keep-alive, and keeps it
// half-closed for about 100 ms. A request sent on such a pooled
// connection meets no reset: its wait for the first byte found the FIN's
// readiness already consumed and slept until the client poll (100 ms)
// before the stale connection was seen and the request sent again.
func (r *rawIO) peerClosed() bool {
	r.pclosed = false
	err := r.rc.Control(r.pfn)
	return r.pclosed || err != nil
}

func (r *rawIO) peekFD(fd uintptr) {
	var b [1]byte
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		r.pclosed = e == 0 && n == 0 || e != 0 && e != syscall.EAGAIN
		return
	}
}

// write is net.Conn.Write: all of p, or the bytes written and an error.
// A peer that closed answers EPIPE (the runtime ignores the SIGPIPE of a
// socket write, as for net.Conn's).
func (r *rawIO) write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.wbuf, r.wn, r.werr = p, 0, 0
	err := r.rc.Write(r.wfn)
	r.wbuf = nil
	switch {
	case err != nil:
		return r.wn, err
	case r.werr != 0:
		return r.wn, r.opError("write", r.werr)
	}
	return r.wn, nil
}

func (r *rawIO) writeFD(fd uintptr) bool {
	for r.wn < len(r.wbuf) {
		b := r.wbuf[r.wn:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		switch e {
		case 0:
			r.wn += int(n)
			continue
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		r.werr = e
		return true
	}
	return true
}

// opError wraps errno as net does: errors.Is(err, syscall.ECONNRESET) and
// the like hold. Error path only.
func (r *rawIO) opError(op string, e syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: r.laddr, Addr: r.raddr, Err: os.NewSyscallError(op, e)}
}
