//go:build !linux

package turn

import (
	"net"
	"net/netip"
	"sync"
)

// ReadFrom implements net.PacketConn for pion's relay loop, which is only
// kept for its exit: every datagram is relayed here (see deliver), one at a
// time on this system (Linux batches them: relayread_linux.go). pion's loop
// reads into a 1,600-byte buffer of its own and drops anything bigger;
// ReadFrom returns only the socket's error, on which pion ends the
// allocation.
func (r *relayConn) ReadFrom([]byte) (int, net.Addr, error) {
	if h := r.srv.cfg.holdRelayReads; h != nil {
		<-h // tests only: once, before the first read, never per datagram
	}
	for {
		buf, n, peer, err := r.reader.next()
		if err != nil {
			return 0, nil, err
		}
		if n < maxDatagram+1 { // a full buffer may have been truncated
			r.deliver(*buf, n, peer)
		}
	}
}

// newRelayBufPool makes the relay sockets' buffer pool.
func newRelayBufPool() *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]byte, relayBufSize)
		return &b
	}}
}

// datagramReader reads a relay socket's datagrams. Elsewhere than Linux it
// keeps a buffer of its own (64 KiB per allocation); the Linux one borrows
// from a shared pool only while a batch is read and relayed.
type datagramReader struct {
	c   *net.UDPConn
	buf *[]byte
}

func newDatagramReader(c *net.UDPConn, pool *sync.Pool, _ bool) (*datagramReader, error) {
	return &datagramReader{c: c, buf: pool.Get().(*[]byte)}, nil
}

func (d *datagramReader) next() (buf *[]byte, n int, from netip.AddrPort, err error) {
	n, from, err = d.c.ReadFromUDPAddrPort(datagramRoom(*d.buf))
	return d.buf, n, from, err
}

// udpOut is the Linux batched sender's state; nothing here.
type udpOut struct{}

func newUDPOut(*net.UDPConn, Config) (*udpOut, error) { return &udpOut{}, nil }
