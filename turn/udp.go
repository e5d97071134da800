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
// client to a peer it holds a permission for. It reports whether msg was a
// Send indication, which pion then must not see: pion would drop one
// bigger than its 1,600-byte read buffer, and this path, unlike pion's,
// allocates nothing. Indications carry no credentials; as in pion, the
// permission is what authorizes the datagram, and one for no allocation,
// without a permission or malformed is dropped.
func (s *Server) relaySend(t tuple, msg []byte) bool {
	if len(msg) < 20 || binary.BigEndian.Uint16(msg[0:2]) != sendIndication {
		return false
	}
	r := s.relays.lookup(t)
	if r == nil {
		return true
	}
	peer, data, ok := parseSend(msg)
	if !ok {
		return true
	}
	if rt := r.routes.Load(); rt == nil || !rt.perms[peer.Addr()] {
		return true
	}
	if r.hairpin(data, peer) {
		return true
	}
	if _, err := r.UDPConn.WriteToUDPAddrPort(data, peer); err == nil {
		r.upPackets.Add(1)
		r.upBytes.Add(uint64(len(data)))
	}
	return true
}

// parseSend finds a Send indication's XOR-PEER-ADDRESS (the first valid
// one) and DATA (the first), as pion's decoder would; ok is false when either is missing or the message is malformed.
// data is a slice of msg.
func parseSend(msg []byte) (peer netip.AddrPort, data []byte, ok bool) {
	if len(msg) < 20 {
		return netip.AddrPort{}, nil, false
	}
	end := min(20+int(binary.BigEndian.Uint16(msg[2:4])), len(msg))
	hasData := false
	for off := 20; off+4 <= end; {
		typ := binary.BigEndian.Uint16(msg[off:])
		n := int(binary.BigEndian.Uint16(msg[off+2:]))
		if off+4+n > end {
			return netip.AddrPort{}, nil, false // truncated attribute
		}
		v := msg[off+4 : off+4+n]
		switch typ {
		case uint16(stun.AttrXORPeerAddress):
			if !peer.IsValid() {
				peer = xorPeerAddress(v, msg[4:20])
			}
		case uint16(stun.AttrData):
			if !hasData {
				data, hasData = v, true
			}
		}
		off += 4 + (n+3)&^3
	}
	return peer, data, peer.IsValid() && hasData
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
