package turnbench

import (
	"encoding/binary"
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
// as the TURN server's relay path does (turn/gso_linux.go), through the
// net package's WriteMsgUDPAddrPort. One sender at a time (the stream's
// lock): the control message is reused.
type gsoSender struct {
	c   *net.UDPConn
	dst netip.AddrPort
	oob []byte // the UDP_SEGMENT control message; its value is set per send
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
	oob := make([]byte, unix.CmsgSpace(2)) // a fresh slice: aligned for the header
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	return &gsoSender{c: c, dst: dst, oob: oob}, nil
}

// send sends buf as datagrams of seg bytes each (the last may be shorter),
// one sendmsg.
func (g *gsoSender) send(buf []byte, seg int) error {
	binary.NativeEndian.PutUint16(g.oob[unix.CmsgLen(0):], uint16(seg))
	_, _, err := g.c.WriteMsgUDPAddrPort(buf, g.oob, g.dst)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EIO), errors.Is(err, syscall.ENOPROTOOPT), errors.Is(err, syscall.EOPNOTSUPP):
		return fmt.Errorf("%w: %v", errNoGSO, err)
	}
	return fmt.Errorf("turnbench: GSO send: %w", err)
}
