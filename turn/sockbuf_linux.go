package turn

import (
	"net"
	"syscall"
	"unsafe"
)

// growBuffers sets the socket's receive and send buffers to size: past
// net.core.rmem_max and wmem_max where the process may (CAP_NET_ADMIN, as
// coturn does when run as root), else up to those limits (the kernel caps
// SO_RCVBUF and SO_SNDBUF there silently). The kernel doubles the value
// for its bookkeeping: getsockopt reports 2*size.
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

// socketDropsCounted: this system reports socketDrops.
const socketDropsCounted = true

// soMeminfo is SO_MEMINFO (Linux 4.7): the socket's memory counters, an
// array of u32 indexed by SK_MEMINFO_*; skMeminfoDrops is the datagrams
// the kernel dropped on the socket (a full receive buffer, mostly): the
// same counter as the drops column of /proc/net/udp.
const (
	soMeminfo      = 55
	skMeminfoDrops = 8
	skMeminfoVars  = 9
)

// socketDrops reads the kernel's count of datagrams dropped on c; ok is
// false when it cannot (a closed socket, an older kernel). One getsockopt,
// made when /metrics is scraped and when a relay socket closes, never per
// datagram.
func socketDrops(c *net.UDPConn) (drops uint64, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info [skMeminfoVars]uint32
	var errno syscall.Errno
	cerr := rc.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(info))
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_SOCKET, soMeminfo,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0)
	})
	if cerr != nil || errno != 0 {
		return 0, false
	}
	return uint64(info[skMeminfoDrops]), true
}
