package turn

import (
	"net"
	"syscall"
)

// listenerBuffer is the UDP listener's socket buffer size. Every client's
// datagrams queue in this one socket; at the kernel's default (about 200
// KiB, under a hundred full-size datagrams) a burst from a few busy
// clients while the reader is descheduled is dropped.
const listenerBuffer = 4 << 20

// growBuffers enlarges the socket's buffers: past net.core.rmem_max and
// wmem_max where the process may (CAP_NET_ADMIN, as coturn does when run
// as root), else up to those limits.
func growBuffers(c *net.UDPConn, size int) {
	rc, err := c.SyscallConn()
	if err == nil {
		var rerr, werr error
		_ = rc.Control(func(fd uintptr) {
			rerr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, size)
			werr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, size)
		})
		if rerr == nil && werr == nil {
			return
		}
	}
	_ = c.SetReadBuffer(size)
	_ = c.SetWriteBuffer(size)
}
