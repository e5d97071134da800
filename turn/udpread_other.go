//go:build !linux

package turn

import (
	"net"
	"net/netip"
)

// udpConn is the UDP listener socket as pion sees it. Its ReadFrom relays
// ChannelData and Send indications itself and screens requests (see
// Server.screen); only the rest of the control traffic reaches pion's read
// loop. On this system one datagram at a time (Linux reads and relays
// batches: udpread_linux.go).
type udpConn struct {
	*net.UDPConn
	srv   *Server
	local netip.AddrPort
	// buf takes any datagram (pion's own buffer is 1,600 bytes, its
	// InboundMTU, and pion drops what does not fit). One reader: pion's
	// read loop for this socket.
	buf []byte
}

func newUDPConn(c *net.UDPConn, s *Server) *udpConn {
	return &udpConn{UDPConn: c, srv: s, local: addrPort(c.LocalAddr()), buf: make([]byte, maxDatagram+1)}
}

// ReadFrom implements net.PacketConn for pion's read loop. Relayed bytes
// are sent on from our buffer without a copy; the control messages left
// for pion are copied into p.
func (c *udpConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, src, err := c.UDPConn.ReadFromUDPAddrPort(c.buf)
		if err != nil {
			return 0, nil, err
		}
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		pkt := c.buf[:n]
		if n == len(c.buf) {
			continue // possibly truncated: not a datagram any client sends us
		}
		t := tuple{client: src, server: c.local}
		if isChannelData(pkt) {
			c.srv.relayUp(t, pkt)
			continue
		}
		if c.srv.relaySend(t, pkt) {
			continue
		}
		if c.srv.screen(t, pkt, func(b []byte) { _, _ = c.UDPConn.WriteToUDPAddrPort(b, src) }) {
			continue
		}
		if n >= len(p) {
			continue // pion would take it for truncated; no request is this big
		}
		return copy(p, pkt), net.UDPAddrFromAddrPort(src), nil
	}
}
