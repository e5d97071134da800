//go:build !linux

package turn

import "net"

// listenerBuffer is the UDP listener's socket buffer size (see the Linux
// variant).
const listenerBuffer = 4 << 20

// growBuffers enlarges the socket's buffers as far as the system allows.
func growBuffers(c *net.UDPConn, size int) {
	_ = c.SetReadBuffer(size)
	_ = c.SetWriteBuffer(size)
}
