package main

import (
	"fmt"
	"net"
	"os"
)

// sdNotify sends one state message ("READY=1", "STOPPING=1", ...) to the
// service manager's notification socket, $NOTIFY_SOCKET (systemd
// Type=notify): a single datagram on a unix socket, a path or, with a
// leading '@', an abstract name. Without $NOTIFY_SOCKET it does nothing.
// The protocol is small enough that a dependency is not worth it
// (sd_notify(3)).
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] != '/' && path[0] != '@' {
		return fmt.Errorf("sd_notify: NOTIFY_SOCKET %q is not a unix socket path (vsock is not supported)", path)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}
