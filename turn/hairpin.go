package turn

import "net/netip"

// Relaying between two allocations of this server.
//
// When both ends of a call are relay-only through this server (two
// browsers behind NATs that allow nothing else, the case a TURN server
// exists for), every datagram is relayed twice: client A's relay socket
// sends it to B's relayed address, the kernel carries it across loopback,
// B's relay socket reads it and B's reader sends it on to client B. The
// middle costs a send, a receive and a wake of B's reader per datagram,
// for nothing a client can see.
//
// So a datagram for a relayed address of this server is handed to that
// allocation here, as if its relay socket had read it from the sender's
// relayed address: the receiving allocation's channel bindings and
// permissions apply as they would (a datagram it has no permission for is
// dropped, as its reader would drop it), both allocations count it, and
// client B receives byte for byte what the kernel's way would have
// brought. Only the advertised relay IP is taken for this server's: a
// port there with no allocation of ours may be another program's, and
// the datagram goes to the kernel as before. Config.NoHairpin turns it
// off (for the benchmark's comparison).

// hairpinTarget reports whether peer is the relayed address of an
// allocation of this server (ours: the kernel carries nothing) and which
// one takes a datagram of n bytes for it: nil when n is past what the
// relay socket's send would take (the datagram is dropped).
func (r *relayConn) hairpinTarget(peer netip.AddrPort, n int) (to *relayConn, ours bool) {
	s := r.srv
	if s.cfg.NoHairpin || peer.Addr() != s.relayIP {
		return nil, false
	}
	if to = s.relays.atPort(int(peer.Port())); to == nil {
		return nil, false
	}
	if n > maxPeerDatagram(s.relayIP) {
		return nil, true
	}
	return to, true
}

// handedOver counts a datagram of n bytes that r sent to another
// allocation of this server.
func (r *relayConn) handedOver(n int) {
	r.upPackets.Add(1)
	r.upBytes.Add(uint64(n))
	r.hairpins.Add(1)
}

// relayedAddr is r's relayed transport address, the source its datagrams
// have at a peer.
func (r *relayConn) relayedAddr() netip.AddrPort {
	return netip.AddrPortFrom(r.srv.relayIP, uint16(r.port))
}

// hairpin delivers payload to the allocation whose relayed address is
// peer, from r's relayed address, and reports whether peer is one; the
// caller then sends nothing. r has checked its own permission for peer
// (a channel is bound, or the Send indication's permission held). The
// listener's batches take the batched way instead (upQueue.handOver).
func (r *relayConn) hairpin(payload []byte, peer netip.AddrPort) bool {
	to, ours := r.hairpinTarget(peer, len(payload))
	if to == nil {
		return ours // dropped when ours: the relay socket's send would have refused it
	}
	r.handedOver(len(payload))
	to.deliverCopy(payload, r.relayedAddr())
	return true
}

// deliverCopy delivers payload from peer as the relay socket's reader
// would, framed in a buffer of the server's pool.
func (r *relayConn) deliverCopy(payload []byte, peer netip.AddrPort) {
	s := r.srv
	bp := s.hairpinBufs.Get().(*[]byte)
	b := *bp
	n := copy(b[relayHeadroom:], payload)
	r.deliver(b, n, peer)
	s.hairpinBufs.Put(bp)
}

// maxPeerDatagram is the biggest datagram a relay socket on ip can send.
func maxPeerDatagram(ip netip.Addr) int {
	if ip.Is4() {
		return maxIPv4Datagram
	}
	return maxDatagram
}

// hairpinBuffer makes a buffer a hairpinned datagram is framed in (the
// server's hairpinBufs): a relay buffer, with room for a Data
// indication's header in front.
func hairpinBuffer() any {
	b := make([]byte, relayBufSize)
	return &b
}
