package ws

import (
	"net"
	"syscall"
	"unsafe"
)

// unacked is how many bytes written to tc its peer has not acknowledged
// yet (SIOCOUTQ: sent or not, the FIN included); false when it cannot be
// asked.
func unacked(tc *net.TCPConn) (int, bool) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n int32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil || errno != 0 {
		return 0, false
	}
	return int(n), true
}
