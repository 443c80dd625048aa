package slowpath

import "net"

// connRead reads c through raw (rawIO: raw system calls) when set, else
// through c itself.
func connRead(c net.Conn, raw *rawIO, p []byte) (int, error) {
	if raw != nil {
		return raw.read(p)
	}
	return c.Read(p)
}

// connWrite writes c through raw when set, else through c itself.
func connWrite(c net.Conn, raw *rawIO, p []byte) (int, error) {
	if raw != nil {
		return raw.write(p)
	}
	return c.Write(p)
}
