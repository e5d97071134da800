package turn

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// udpConn is the UDP listener socket as pion sees it. Its ReadFrom relays
// ChannelData itself and screens requests (see Server.screen); only the
// rest of the control traffic reaches pion's read loop.
type udpConn struct {
	*net.UDPConn
	srv   *Server
	local netip.AddrPort
}

// ReadFrom implements net.PacketConn for pion's read loop, reading into
// pion's own buffer so relayed bytes are never copied.
func (c *udpConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, src, err := c.UDPConn.ReadFromUDPAddrPort(p)
		if err != nil {
			return 0, nil, err
		}
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		pkt := p[:n]
		if n == len(p) {
			continue // possibly truncated: not a datagram any client sends us
		}
		t := tuple{client: src, server: c.local}
		if isChannelData(pkt) {
			c.srv.relayUp(t, pkt)
			continue
		}
		if c.srv.screen(t, pkt, func(b []byte) { _, _ = c.UDPConn.WriteToUDPAddrPort(b, src) }) {
			continue
		}
		return n, net.UDPAddrFromAddrPort(src), nil
	}
}

// isChannelData reports whether b starts with a channel number: the first
// two bits are 01 (STUN messages start with 00). A short frame is treated
// as ChannelData too, so it is dropped rather than handed to pion.
func isChannelData(b []byte) bool {
	return len(b) >= 1 && b[0]&0xC0 == 0x40
}

// relayUp relays one ChannelData frame from a client to the peer bound to
// its channel. Frames for no allocation or an unbound channel are dropped,
// as RFC 8656 §12.6 says (pion would drop them too, after logging).
func (s *Server) relayUp(t tuple, frame []byte) {
	if len(frame) < 4 {
		return
	}
	length := int(binary.BigEndian.Uint16(frame[2:4]))
	if 4+length > len(frame) {
		return
	}
	if r := s.relays.lookup(t); r != nil {
		r.sendUp(binary.BigEndian.Uint16(frame[0:2]), frame[4:4+length])
	}
}
