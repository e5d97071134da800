package turn

import (
	"encoding/binary"
	"net/netip"

	"github.com/pion/stun/v3"
)

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

// relaySend relays the data of a Send indication (RFC 8656 §11.2) from a
// client to a peer it holds a permission for, a datagram at a time (the
// Linux listener and TCP connections queue them with ChannelData:
// upQueue.addSend). It reports whether msg was a Send indication, which
// pion then must not see: pion would drop one bigger than its 1,600-byte
// read buffer, and this path, unlike pion's, allocates nothing.
func (s *Server) relaySend(t tuple, msg []byte) bool {
	if !isSendIndication(msg) {
		return false
	}
	r, peer, frame := s.sendTarget(t, msg)
	if r == nil || r.hairpin(frame[4:], peer) {
		return true
	}
	if _, err := r.UDPConn.WriteToUDPAddrPort(frame[4:], peer); err == nil {
		r.upPackets.Add(1)
		r.upBytes.Add(uint64(len(frame) - 4))
	}
	return true
}

// isSendIndication reports whether msg is a Send indication, which pion
// must not see: its data is relayed here (relaySend, upQueue.addSend).
func isSendIndication(msg []byte) bool {
	return len(msg) >= 20 && binary.BigEndian.Uint16(msg[0:2]) == sendIndication
}

// sendTarget finds where a Send indication's data goes: the allocation of
// t and the peer, which it holds a permission for. frame is the data with
// the 4 bytes in front of it, the DATA attribute's header, which a
// hand-over may overwrite with a ChannelData header (the message is not
// read again). Indications carry no credentials; as in pion, the
// permission is what authorizes the datagram, and one for no allocation,
// without a permission or malformed is dropped (r nil).
func (s *Server) sendTarget(t tuple, msg []byte) (r *relayConn, peer netip.AddrPort, frame []byte) {
	if r = s.relays.lookup(t); r == nil {
		return nil, netip.AddrPort{}, nil
	}
	peer, at, n, ok := parseSend(msg)
	if !ok {
		return nil, netip.AddrPort{}, nil
	}
	if rt := r.routes.Load(); rt == nil || !rt.perms[peer.Addr()] {
		return nil, netip.AddrPort{}, nil
	}
	return r, peer, msg[at-4 : at+n]
}

// parseSend finds a Send indication's XOR-PEER-ADDRESS (the first valid
// one) and DATA (the first), as pion's decoder would: the data is msg[at:at+n].
// ok is false when either is missing or the message is malformed.
func parseSend(msg []byte) (peer netip.AddrPort, at, n int, ok bool) {
	if len(msg) < 20 {
		return netip.AddrPort{}, 0, 0, false
	}
	end := min(20+int(binary.BigEndian.Uint16(msg[2:4])), len(msg))
	hasData := false
	for off := 20; off+4 <= end; {
		typ := binary.BigEndian.Uint16(msg[off:])
		size := int(binary.BigEndian.Uint16(msg[off+2:]))
		if off+4+size > end {
			return netip.AddrPort{}, 0, 0, false // truncated attribute
		}
		switch typ {
		case uint16(stun.AttrXORPeerAddress):
			if !peer.IsValid() {
				peer = xorPeerAddress(msg[off+4:off+4+size], msg[4:20])
			}
		case uint16(stun.AttrData):
			if !hasData {
				at, n, hasData = off+4, size, true
			}
		}
		off += 4 + (size+3)&^3
	}
	return peer, at, n, peer.IsValid() && hasData
}

// xorPeerAddress decodes an XOR-PEER-ADDRESS value (RFC 8489 §14.2), XORed
// with cookieAndID (the message's bytes 4-20); the zero AddrPort if
// malformed. A v4-mapped IPv6 address is unmapped, as the permissions are.
func xorPeerAddress(v, cookieAndID []byte) netip.AddrPort {
	if len(v) < 8 {
		return netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(v[2:4]) ^ uint16(magicCookie>>16)
	switch {
	case v[1] == 0x01 && len(v) == 8:
		var ip [4]byte
		for i := range ip {
			ip[i] = v[4+i] ^ cookieAndID[i]
		}
		return netip.AddrPortFrom(netip.AddrFrom4(ip), port)
	case v[1] == 0x02 && len(v) == 20:
		var ip [16]byte
		for i := range ip {
			ip[i] = v[4+i] ^ cookieAndID[i]
		}
		return netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), port)
	}
	return netip.AddrPort{}
}
