package turn

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"
)

// datagramReader reads a relay socket's datagrams into buffers borrowed
// from a pool shared by every relay, only for the length of the recvfrom
// call: a datagram may be up to 64 KiB, and one such buffer held by every
// parked reader (one per allocation) would cost 640 MiB at 10,000
// allocations. Go's net package reads only into a buffer handed to it
// before it parks, so the receive goes through the socket's RawConn: the
// callback takes a buffer when the socket is readable and gives it back at
// EAGAIN, before the goroutine parks.
type datagramReader struct {
	rc   syscall.RawConn
	pool *sync.Pool
	recv func(fd uintptr) bool // made once: a closure per read would allocate

	// The callback's results; one goroutine (pion's, for this allocation)
	// reads.
	buf   *[]byte
	n     int
	errno syscall.Errno
	rsa   syscall.RawSockaddrAny
}

func newDatagramReader(c *net.UDPConn, pool *sync.Pool) (*datagramReader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("turn: relay socket: %w", err)
	}
	d := &datagramReader{rc: rc, pool: pool}
	d.recv = d.recvfrom
	return d, nil
}

func (d *datagramReader) recvfrom(fd uintptr) bool {
	buf := d.pool.Get().(*[]byte)
	b := datagramRoom(*buf)
	for {
		rsaLen := uint32(syscall.SizeofSockaddrAny)
		n, _, e := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
			uintptr(unsafe.Pointer(&d.rsa)), uintptr(unsafe.Pointer(&rsaLen)))
		switch e {
		case 0:
			d.buf, d.n = buf, int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			d.pool.Put(buf)
			return false // park until readable
		}
		d.pool.Put(buf)
		d.errno = e
		return true
	}
}

// next returns the next datagram, in datagramRoom(*buf)[:n], and its
// sender; release gives the buffer back.
func (d *datagramReader) next() (buf *[]byte, n int, from netip.AddrPort, err error) {
	d.buf, d.errno = nil, 0
	if err := d.rc.Read(d.recv); err != nil {
		return nil, 0, netip.AddrPort{}, err
	}
	if d.errno != 0 {
		return nil, 0, netip.AddrPort{}, fmt.Errorf("turn: relay socket recvfrom: %w", d.errno)
	}
	switch d.rsa.Addr.Family {
	case syscall.AF_INET:
		sa := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&d.rsa))
		port := (*[2]byte)(unsafe.Pointer(&sa.Port)) // network byte order
		from = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(port[0])<<8|uint16(port[1]))
	case syscall.AF_INET6:
		sa := (*syscall.RawSockaddrInet6)(unsafe.Pointer(&d.rsa))
		port := (*[2]byte)(unsafe.Pointer(&sa.Port))
		from = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(port[0])<<8|uint16(port[1]))
	}
	return d.buf, d.n, from, nil
}

func (d *datagramReader) release(buf *[]byte) { d.pool.Put(buf) }
