//go:build !linux

package slowpath

import "net"

// corkForFIN is Linux's TCP_CORK (cork_linux_test.go); elsewhere a no-op.
func corkForFIN(net.Conn) {}
