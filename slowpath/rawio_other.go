//go:build !linux

package slowpath

import (
	"errors"
	"net"
)

// rawIO is Linux's raw socket reader and writer (rawio_linux.go); elsewhere
// connections use their own Read and Write.
type rawIO struct{}

func newRawIO(net.Conn) *rawIO { return nil }

func (*rawIO) read([]byte) (int, error)  { panic("slowpath: rawIO without Linux") }
func (*rawIO) write([]byte) (int, error) { panic("slowpath: rawIO without Linux") }
func (*rawIO) session(func() bool) error { panic("slowpath: rawIO without Linux") }
func (*rawIO) peerClosed() bool          { panic("slowpath: rawIO without Linux") }

var errWouldBlock = errors.New("rawio: nothing to read now")
