package turn

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/pion/stun/v3"
)

// errNoRelayPort is the relay port range running out; pion answers it with
// 508 (Insufficient Capacity).
var errNoRelayPort = errors.New("turn: no free relay port in the configured range")

// errTCPRelay refuses RFC 6062 TCP allocations, which pion's server does
// not implement either.
var errTCPRelay = errors.New("turn: TCP relay allocations are not supported")

// tuple identifies an allocation the way pion's five-tuple does: the
// client's transport address, the server address it reached, and whether
// it came over a stream (TCP or TLS). pion labels every five-tuple "UDP"
// whatever the transport, so stream is ours.
type tuple struct {
	stream         bool
	client, server netip.AddrPort
}

// addrPort converts the net.Addr values pion hands back to us into the
// comparable form our tables use. IPv4-mapped addresses are unmapped so
// that a dual-stack socket and an IPv4 one name a client alike.
func addrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.UDPAddr:
		ap = a.AddrPort()
	case *net.TCPAddr:
		ap = a.AddrPort()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// tupleOf builds the tuple for an event's source and destination.
func tupleOf(src, dst net.Addr) tuple {
	_, stream := src.(*net.TCPAddr)
	return tuple{stream: stream, client: addrPort(src), server: addrPort(dst)}
}

// routes is one allocation's channel bindings, both ways, and the peer
// IPs it holds permissions for, mirrored from pion's events. It is
// replaced, never changed, so the relay paths read it with one atomic load.
type routes struct {
	byNumber map[uint16]netip.AddrPort
	byPeer   map[netip.AddrPort]uint16
	perms    map[netip.Addr]bool
}

// downstream is where an allocation's traffic to its client goes: the UDP
// listener socket and the client's address, or the client's TCP/TLS
// connection.
type downstream struct {
	client netip.AddrPort
	udp    *net.UDPConn
	stream *streamConn
}

// relayConn is an allocation's relayed transport address: the UDP socket
// peers send to. pion's per-allocation goroutine calls ReadFrom, where we
// relay every datagram to the client ourselves.
type relayConn struct {
	*net.UDPConn
	srv    *Server
	port   int
	addr   *net.UDPAddr // advertised relayed address (XOR-RELAYED-ADDRESS)
	reader *datagramReader

	down     atomic.Pointer[downstream]
	routes   atomic.Pointer[routes]
	username atomic.Pointer[string]
	routeMu  sync.Mutex // serializes replacing routes

	// Per-allocation counters (the client socket's reader counts
	// upPackets; this socket's reader downPackets, and so do the readers of
	// allocations that hand datagrams over to this one: hairpin.go),
	// folded into the server's totals when the allocation closes.
	upPackets, upBytes, downPackets, downBytes atomic.Uint64
	// hairpins counts the datagrams this allocation sent to another of
	// this server's, handed over in the process (hairpin.go; also counted
	// in upPackets), for tests.
	hairpins atomic.Uint64
	// downRuns and upRuns are the GSO sends that carried some of those
	// datagrams (Linux), and downRuns also the writes of ChannelData
	// batches to a stream client; tests read them to see which batched
	// path ran.
	downRuns, upRuns atomic.Uint64
	// finalDrops is the kernel's drop count of the socket, read just
	// before it closes (a closed socket's count cannot be read), for the
	// totals.
	finalDrops atomic.Uint64

	closeOnce sync.Once
}

// Relay buffers: room for the biggest datagram, a header in front (a Data
// indication's, the biggest) and padding behind (streams pad to 4).
const (
	// maxDatagram is the biggest UDP payload (65,535 less the 8-byte UDP
	// header; IPv4's header leaves 65,507, IPv6's 65,527).
	maxDatagram = 65535 - 8
	// maxIPv4Datagram is the biggest UDP payload over IPv4 (its 20-byte
	// header less).
	maxIPv4Datagram = 65535 - 20 - 8
	// relayHeadroom is a Data indication's header: 20 bytes of STUN header,
	// XOR-PEER-ADDRESS for IPv6 (4 + 20) and DATA's attribute header (4).
	relayHeadroom = 20 + 24 + 4
	relayBufSize  = relayHeadroom + maxDatagram + 1 + 3
)

// datagramRoom is the part of a relay buffer a datagram is read into: one
// byte past the biggest, so a full read means one that was too big.
func datagramRoom(buf []byte) []byte { return buf[relayHeadroom : relayHeadroom+maxDatagram+1] }

// deliver relays the datagram in b[relayHeadroom:relayHeadroom+n] from peer
// to the client, writing its header in front of it in b: the one-by-one
// path of systems other than Linux (which relays batches: deliverBatch).
func (r *relayConn) deliver(b []byte, n int, peer netip.AddrPort) {
	peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	rt := r.routes.Load()
	d := r.down.Load()
	if rt == nil || d == nil {
		return
	}
	if number, ok := rt.byPeer[peer]; ok {
		r.sendDown(d, b[relayHeadroom-4:], number, n)
		return
	}
	if rt.perms[peer.Addr()] {
		r.sendIndication(d, b, n, peer)
	}
}

// sendDown frames p[4:4+n] as ChannelData for channel number and writes it
// to the client. A failed write drops the datagram, as a full socket
// buffer would; for a stream, the connection's reader will see the error.
func (r *relayConn) sendDown(d *downstream, p []byte, number uint16, n int) {
	end := putChannelFrame(p, number, n, d.stream != nil)
	if d.write(p[:end]) != nil {
		return
	}
	r.downPackets.Add(1)
	r.downBytes.Add(uint64(n))
}

// putChannelFrame frames p[4:4+n] as ChannelData for channel number, in
// place, and returns the frame's length: over a stream padded to a
// multiple of 4 bytes (RFC 8656 §12.5), the padding zeroed.
func putChannelFrame(p []byte, number uint16, n int, stream bool) int {
	putChannelHeader(p, number, n)
	if !stream {
		return 4 + n
	}
	end := (4 + n + 3) &^ 3
	clear(p[4+n : end])
	return end
}

// putChannelHeader writes a ChannelData header for channel number and an
// n-byte payload into p[0:4].
func putChannelHeader(p []byte, number uint16, n int) {
	binary.BigEndian.PutUint16(p[0:2], number)
	binary.BigEndian.PutUint16(p[2:4], uint16(n))
}

// sendIndication sends the datagram in b[relayHeadroom:relayHeadroom+n] to
// the client as a Data indication (RFC 8656 §11.3), built in front of it.
func (r *relayConn) sendIndication(d *downstream, b []byte, n int, peer netip.AddrPort) {
	m := putDataIndication(b, n, peer)
	if m == nil || d.write(m) != nil {
		return
	}
	r.downPackets.Add(1)
	r.downBytes.Add(uint64(n))
}

// putDataIndication frames the datagram in b[relayHeadroom:relayHeadroom+n]
// from peer as a Data indication, in place (its header in front, its
// padding behind), and returns the message; nil for one too big to frame,
// which only comes over IPv6.
func putDataIndication(b []byte, n int, peer netip.AddrPort) []byte {
	addrLen := 8
	if peer.Addr().Is6() {
		addrLen = 20
	}
	pad := (4 - n%4) % 4
	length := 4 + addrLen + 4 + n + pad
	if length > 0xFFFF {
		return nil
	}
	m := b[relayHeadroom-(20+4+addrLen+4) : relayHeadroom+n+pad]
	binary.BigEndian.PutUint16(m[0:2], dataIndication)
	binary.BigEndian.PutUint16(m[2:4], uint16(length))
	binary.BigEndian.PutUint32(m[4:8], magicCookie)
	_, _ = crand.Read(m[8:20]) // a transaction ID, random as RFC 8489 §6 wants
	putXORPeerAddress(m[20:24+addrLen], m[4:20], peer)
	a := m[24+addrLen:]
	binary.BigEndian.PutUint16(a[0:2], uint16(stun.AttrData))
	binary.BigEndian.PutUint16(a[2:4], uint16(n))
	clear(a[4+n:])
	return m
}

// STUN wire constants (RFC 8489 §5, RFC 8656 §17): the magic cookie, and
// the message types of a Data indication (method Data 0x007) and a Send
// indication (method Send 0x006), class indication.
const (
	magicCookie    = 0x2112A442
	dataIndication = 0x0017
	sendIndication = 0x0016
)

// putXORPeerAddress writes an XOR-PEER-ADDRESS attribute for peer into a
// (its full length), XORed with cookieAndID, the message's bytes 4-20
// (RFC 8489 §14.2).
func putXORPeerAddress(a, cookieAndID []byte, peer netip.AddrPort) {
	binary.BigEndian.PutUint16(a[0:2], uint16(stun.AttrXORPeerAddress))
	binary.BigEndian.PutUint16(a[2:4], uint16(len(a)-4))
	a[4] = 0
	binary.BigEndian.PutUint16(a[6:8], peer.Port()^uint16(magicCookie>>16))
	if peer.Addr().Is4() {
		a[5] = 0x01
		ip := peer.Addr().As4()
		for i := range ip {
			a[8+i] = ip[i] ^ cookieAndID[i]
		}
		return
	}
	a[5] = 0x02
	ip := peer.Addr().As16()
	for i := range ip {
		a[8+i] = ip[i] ^ cookieAndID[i]
	}
}

// write sends one whole frame to the client.
func (d *downstream) write(frame []byte) error {
	var err error
	if d.udp != nil {
		_, err = d.udp.WriteToUDPAddrPort(frame, d.client)
	} else {
		_, err = d.stream.Write(frame)
	}
	return err
}

// sendUp relays a ChannelData payload to the peer bound to number. It
// reports false when number is not bound, so the datagram is dropped.
func (r *relayConn) sendUp(number uint16, payload []byte) bool {
	rt := r.routes.Load()
	if rt == nil {
		return false
	}
	peer, ok := rt.byNumber[number]
	if !ok {
		return false
	}
	if r.hairpin(payload, peer) {
		return true
	}
	if _, err := r.UDPConn.WriteToUDPAddrPort(payload, peer); err != nil {
		return true // dropped like any UDP datagram the kernel would not take
	}
	r.upPackets.Add(1)
	r.upBytes.Add(uint64(len(payload)))
	return true
}

// WriteTo is pion's path for Send indications (clients that have not
// bound a channel); pion has checked the permission, we count.
func (r *relayConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	if r.hairpin(p, addrPort(addr)) {
		return len(p), nil
	}
	n, err := r.UDPConn.WriteTo(p, addr)
	if err == nil {
		r.upPackets.Add(1)
		r.upBytes.Add(uint64(n))
	}
	return n, err
}

// updateRoutes replaces the routes with a changed copy. Bindings change a
// few times per allocation lifetime; datagrams are relayed millions of
// times, so copying here keeps the relay paths free of locks.
func (r *relayConn) updateRoutes(change func(*routes)) {
	r.routeMu.Lock()
	defer r.routeMu.Unlock()
	next := &routes{byNumber: make(map[uint16]netip.AddrPort), byPeer: make(map[netip.AddrPort]uint16), perms: make(map[netip.Addr]bool)}
	if old := r.routes.Load(); old != nil {
		maps.Copy(next.byNumber, old.byNumber)
		maps.Copy(next.byPeer, old.byPeer)
		maps.Copy(next.perms, old.perms)
	}
	change(next)
	r.routes.Store(next)
}

// bindChannel mirrors a channel binding pion has made.
func (r *relayConn) bindChannel(number uint16, peer netip.AddrPort) {
	r.updateRoutes(func(rt *routes) {
		if old, ok := rt.byNumber[number]; ok {
			delete(rt.byPeer, old)
		}
		rt.byNumber[number] = peer
		rt.byPeer[peer] = number
	})
}

// unbindChannel mirrors a channel binding pion has removed.
func (r *relayConn) unbindChannel(number uint16) {
	r.updateRoutes(func(rt *routes) {
		if peer, ok := rt.byNumber[number]; ok {
			delete(rt.byPeer, peer)
			delete(rt.byNumber, number)
		}
	})
}

// permit and unpermit mirror pion's permissions, which are per peer IP.
func (r *relayConn) permit(ip netip.Addr) {
	r.updateRoutes(func(rt *routes) { rt.perms[ip] = true })
}

func (r *relayConn) unpermit(ip netip.Addr) {
	r.updateRoutes(func(rt *routes) { delete(rt.perms, ip) })
}

// Close releases the socket and its port. pion closes the relay socket
// when the allocation ends; our deletion of the allocation's table entries
// happens in the event that follows.
func (r *relayConn) Close() error {
	var err error
	r.closeOnce.Do(func() {
		if n, ok := socketDrops(r.UDPConn); ok {
			r.finalDrops.Store(n)
		}
		err = r.UDPConn.Close()
		r.srv.relays.remove(r)
		r.srv.ports.release(r.port)
	})
	return err
}

// portPool hands out relay ports: any port when the range is unset,
// otherwise each port of [min, max] in turn, starting at a random one, so
// that the last free port is found however full the range is (pion's own
// range generator tries a few random ports and gives up).
type portPool struct {
	bindIP   netip.Addr
	min, max int // 0, 0: any port

	mu    sync.Mutex
	next  int
	inUse map[int]bool
}

func newPortPool(bindIP netip.Addr, minPort, maxPort int) *portPool {
	p := &portPool{bindIP: bindIP, min: minPort, max: maxPort, inUse: make(map[int]bool)}
	if maxPort > minPort {
		p.next = rand.IntN(maxPort - minPort + 1)
	}
	return p
}

// bind opens a relay socket on requested (EVEN-PORT reservations ask for a
// port) or on a free one.
func (p *portPool) bind(requested int) (*net.UDPConn, int, error) {
	if p.min == 0 {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.bindIP, uint16(requested))))
		if err != nil {
			return nil, 0, fmt.Errorf("turn: relay socket: %w", err)
		}
		return c, c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	size := p.max - p.min + 1
	if requested != 0 {
		if requested < p.min || requested > p.max || p.inUse[requested] {
			return nil, 0, fmt.Errorf("%w: port %d not available", errNoRelayPort, requested)
		}
		c, err := p.listen(requested)
		if err != nil {
			return nil, 0, err
		}
		return c, requested, nil
	}
	for i := range size {
		port := p.min + (p.next+i)%size
		if p.inUse[port] {
			continue
		}
		c, err := p.listen(port)
		if err != nil {
			continue // taken by another process: try the next
		}
		p.next = (port - p.min + 1) % size
		return c, port, nil
	}
	return nil, 0, errNoRelayPort
}

func (p *portPool) listen(port int) (*net.UDPConn, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.bindIP, uint16(port))))
	if err != nil {
		return nil, fmt.Errorf("turn: relay socket on port %d: %w", port, err)
	}
	p.inUse[port] = true
	return c, nil
}

func (p *portPool) release(port int) {
	if p.min == 0 {
		return
	}
	p.mu.Lock()
	delete(p.inUse, port)
	p.mu.Unlock()
}

// relayAddressGenerator is pion's hook for making relay sockets.
type relayAddressGenerator struct{ srv *Server }

func (g relayAddressGenerator) Validate() error { return nil }

func (g relayAddressGenerator) AllocatePacketConn(_ string, requestedPort int) (net.PacketConn, net.Addr, error) {
	s := g.srv
	c, port, err := s.ports.bind(requestedPort)
	if err != nil {
		if errors.Is(err, errNoRelayPort) {
			s.metrics.refused(quotaPorts)
		}
		return nil, nil, err
	}
	// Relayed traffic arrives in bursts (a browser's SCTP sends a window
	// at once); the kernel's default buffer drops them while the reader
	// is descheduled, and every drop costs a retransmission.
	growBuffers(c, s.cfg.SocketBuffer)
	reader, err := newDatagramReader(c, s.relayBufs, !s.cfg.NoGRO)
	if err != nil {
		_ = c.Close()
		s.ports.release(port)
		return nil, nil, err
	}
	r := &relayConn{
		UDPConn: c,
		srv:     s,
		port:    port,
		addr:    net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.relayIP, uint16(port))),
		reader:  reader,
	}
	s.relays.add(r)
	return r, r.addr, nil
}

func (g relayAddressGenerator) AllocateConn(string, int) (net.Conn, net.Addr, error) {
	return nil, nil, errTCPRelay
}

// relayTable finds relay sockets by port (pion's events name an allocation
// by its relayed address) and allocations by tuple (the client sockets'
// fast path), and keeps the totals of closed allocations for the metrics.
type relayTable struct {
	mu       sync.RWMutex
	byPort   map[int]*relayConn
	byTuple  map[tuple]*relayConn
	closedUp [2]uint64 // packets, bytes
	closedDn [2]uint64
	// closedDrops is the kernel's drop counts of closed relay sockets.
	closedDrops uint64
}

func newRelayTable() *relayTable {
	return &relayTable{byPort: make(map[int]*relayConn), byTuple: make(map[tuple]*relayConn)}
}

func (t *relayTable) add(r *relayConn) {
	t.mu.Lock()
	t.byPort[r.port] = r
	t.mu.Unlock()
}

// remove forgets a closed relay socket and folds its counters into the
// totals, under the lock the metrics read with, so no scrape counts it
// twice or not at all.
func (t *relayTable) remove(r *relayConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byPort[r.port] != r {
		return
	}
	delete(t.byPort, r.port)
	t.closedUp[0] += r.upPackets.Load()
	t.closedUp[1] += r.upBytes.Load()
	t.closedDn[0] += r.downPackets.Load()
	t.closedDn[1] += r.downBytes.Load()
	t.closedDrops += r.finalDrops.Load()
}

func (t *relayTable) byRelayAddr(a net.Addr) *relayConn {
	return t.atPort(int(addrPort(a).Port()))
}

// atPort is the relay socket on port, or nil.
func (t *relayTable) atPort(port int) *relayConn {
	t.mu.RLock()
	r := t.byPort[port]
	t.mu.RUnlock()
	return r
}

func (t *relayTable) attach(tu tuple, r *relayConn) {
	t.mu.Lock()
	t.byTuple[tu] = r
	t.mu.Unlock()
}

func (t *relayTable) detach(tu tuple) *relayConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byTuple[tu]
	delete(t.byTuple, tu)
	return r
}

// lookup is the per-datagram path from a client socket.
func (t *relayTable) lookup(tu tuple) *relayConn {
	t.mu.RLock()
	r := t.byTuple[tu]
	t.mu.RUnlock()
	return r
}

// totals sums every relay's counters: up and down packets and bytes.
func (t *relayTable) totals() (upP, upB, dnP, dnB uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	upP, upB, dnP, dnB = t.closedUp[0], t.closedUp[1], t.closedDn[0], t.closedDn[1]
	for _, r := range t.byPort {
		upP += r.upPackets.Load()
		upB += r.upBytes.Load()
		dnP += r.downPackets.Load()
		dnB += r.downBytes.Load()
	}
	return
}

// drops sums the kernel's drop counts of every relay socket, open and
// closed: one getsockopt per open socket, at scrape time. It holds the
// read lock throughout, so a socket closing meanwhile is counted once,
// either live or in closedDrops. A socket closed but not yet removed
// gives its final count.
func (t *relayTable) drops() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := t.closedDrops
	for _, r := range t.byPort {
		if d, ok := socketDrops(r.UDPConn); ok {
			n += d
		} else {
			n += r.finalDrops.Load()
		}
	}
	return n
}
