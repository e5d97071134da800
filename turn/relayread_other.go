//go:build !linux

package turn

import (
	"net"
	"net/netip"
	"sync"
)

// datagramReader reads a relay socket's datagrams. Elsewhere than Linux it
// keeps a buffer of its own (64 KiB per allocation); the Linux one borrows
// from a shared pool only while a datagram is being read.
type datagramReader struct {
	c   *net.UDPConn
	buf *[]byte
}

func newDatagramReader(c *net.UDPConn, pool *sync.Pool) (*datagramReader, error) {
	return &datagramReader{c: c, buf: pool.Get().(*[]byte)}, nil
}

func (d *datagramReader) next() (buf *[]byte, n int, from netip.AddrPort, err error) {
	n, from, err = d.c.ReadFromUDPAddrPort(datagramRoom(*d.buf))
	return d.buf, n, from, err
}

func (d *datagramReader) release(*[]byte) {}
