package turnbench

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// gsoSender sends a run of equal-size datagrams from a UDP socket to one
// address as one sendmsg with a UDP_SEGMENT control message (Linux 4.18),
// as the TURN server's relay path does (turn/gso_linux.go). The syscall's
// arguments live here, so a send allocates nothing; one sender at a time
// (the stream's lock).
type gsoSender struct {
	rc    syscall.RawConn
	name  unix.RawSockaddrInet6 // or a RawSockaddrInet4 in its first bytes
	nlen  uint32
	hdr   unix.Msghdr
	iov   unix.Iovec
	cmsg  [4]uint64 // a UDP_SEGMENT control message (uint64s: aligned for its header)
	errno syscall.Errno
	write func(fd uintptr) bool // made once: a closure per send would allocate
}

// errNoGSO is the kernel refusing UDP_SEGMENT: this load cannot be made.
var errNoGSO = errors.New("turnbench: the kernel refuses UDP GSO (UDP_SEGMENT); GRO-coalesced input cannot be made here")

func newGSOSender(c *net.UDPConn, dst netip.AddrPort) (*gsoSender, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("turnbench: GSO sender: %w", err)
	}
	var gerr error
	if err := rc.Control(func(fd uintptr) { _, gerr = unix.GetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT) }); err != nil {
		return nil, fmt.Errorf("turnbench: GSO sender: %w", err)
	}
	if gerr != nil {
		return nil, fmt.Errorf("%w: %v", errNoGSO, gerr)
	}
	g := &gsoSender{rc: rc}
	local := c.LocalAddr().(*net.UDPAddr)
	a := dst.Addr()
	switch {
	case local.IP.To4() != nil && a.Unmap().Is4():
		*(*unix.RawSockaddrInet4)(unsafe.Pointer(&g.name)) = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.Unmap().As4()}
		g.nlen = unix.SizeofSockaddrInet4
	default:
		g.name = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		g.nlen = unix.SizeofSockaddrInet6
	}
	port := (*[2]byte)(unsafe.Pointer(&g.name.Port)) // the same offset in both; network byte order
	port[0], port[1] = byte(dst.Port()>>8), byte(dst.Port())
	h := (*unix.Cmsghdr)(unsafe.Pointer(&g.cmsg[0]))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	g.write = g.sendmsg
	return g, nil
}

// send sends buf as datagrams of seg bytes each (the last may be shorter),
// one sendmsg.
func (g *gsoSender) send(buf []byte, seg int) error {
	g.iov.Base = &buf[0]
	g.iov.SetLen(len(buf))
	g.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&g.name)), Namelen: g.nlen, Iov: &g.iov}
	g.hdr.SetIovlen(1)
	g.hdr.Control = (*byte)(unsafe.Pointer(&g.cmsg[0]))
	g.hdr.SetControllen(unix.CmsgSpace(2))
	*(*uint16)(unsafe.Pointer(uintptr(unsafe.Pointer(&g.cmsg[0])) + uintptr(unix.CmsgLen(0)))) = uint16(seg)
	g.errno = 0
	if err := g.rc.Write(g.write); err != nil {
		return fmt.Errorf("turnbench: GSO send: %w", err)
	}
	switch g.errno {
	case 0:
		return nil
	case syscall.EINVAL, syscall.EIO, syscall.ENOPROTOOPT, syscall.EOPNOTSUPP:
		return fmt.Errorf("%w: %v", errNoGSO, g.errno)
	}
	return fmt.Errorf("turnbench: GSO send: %w", g.errno)
}

func (g *gsoSender) sendmsg(fd uintptr) bool {
	for {
		_, _, e := unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&g.hdr)), 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait until the socket is writable
		}
		g.errno = e
		return true
	}
}
