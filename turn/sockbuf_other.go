//go:build !linux

package turn

import "net"

// growBuffers enlarges the socket's buffers as far as the system allows.
func growBuffers(c *net.UDPConn, size int) {
	_ = c.SetReadBuffer(size)
	_ = c.SetWriteBuffer(size)
}

// socketDropsCounted: no drop series here (see the Linux variant).
const socketDropsCounted = false

// socketDrops is Linux only (SO_MEMINFO): elsewhere nothing is reported.
func socketDrops(*net.UDPConn) (uint64, bool) { return 0, false }
