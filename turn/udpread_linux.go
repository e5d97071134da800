package turn

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
)

// udpConn is the UDP listener socket as pion sees it. Its ReadFrom reads
// what the kernel has queued in batches, relays ChannelData and Send
// indications itself and screens requests (see Server.screen); only the
// rest of the control traffic reaches pion's read loop, one message at a
// time and in order. A batch's ChannelData payloads are sent on per
// allocation, each relay socket's as GSO runs to its peers (or one
// sendmmsg), before anything else of the batch is handled: a control
// message (a ChannelBind, a Refresh ending the allocation) comes after the
// data that came before it.
type udpConn struct {
	*net.UDPConn
	srv   *Server
	local netip.AddrPort
	// b is the batch being handled. One reader: pion's read loop for this
	// socket.
	b    *upBatch
	recv func(fd uintptr) bool // made once: a closure per read would allocate
	sr   segReader
	// groReads counts coalesced reads (tests read it).
	groReads atomic.Uint64
	// p is pion's buffer while the callback runs; resN and resAddr the
	// message for pion the callback found (resAddr nil: none).
	p       []byte
	resN    int
	resAddr net.Addr
}

// upArenaSize holds a full batch of datagrams of typical WebRTC size
// behind which readVec of the biggest still fit (see batchArenaSize).
const upArenaSize = maxBatch*1300 + readVec*(maxDatagram+1)

// upBatch is one batch of datagrams read from the listener, and its
// ChannelData payloads queued by allocation.
type upBatch struct {
	arena       []byte
	count, next int // datagrams read; the next to handle
	off, n      [maxSlots]int32
	from        [maxSlots]netip.AddrPort
	errno       syscall.Errno // what ended the read, reported once the batch is handled

	up upQueue
}

// upQueue is ChannelData payloads for relay sockets' peers, queued in the
// order they came and sent on at a flush, each relay socket's in one go.
// The listener's batch has one; a stream connection borrows one from the
// server's pool while it relays what one read brought.
type upQueue struct {
	ups [maxSlots]upEntry
	n   int
	q   sendQueue
}

func newUpQueue() *upQueue {
	u := &upQueue{}
	u.q.init()
	return u
}

// upEntry is a ChannelData frame from r's client for a peer (its header,
// then its payload): the payload is sent from r's relay socket, or, when
// the peer is the relayed address of another allocation of this server
// (to), handed over to it (hairpin.go), framed in place over the header.
type upEntry struct {
	r     *relayConn
	peer  netip.AddrPort
	frame []byte
	to    *relayConn
}

func (e *upEntry) payload() []byte { return e.frame[4:] }

func newUDPConn(c *net.UDPConn, s *Server) *udpConn {
	u := &udpConn{UDPConn: c, srv: s, local: addrPort(c.LocalAddr()), b: &upBatch{arena: make([]byte, upArenaSize)}}
	if !s.cfg.NoGRO {
		enableGRO(s.out.rc)
	}
	u.b.up.q.init()
	u.recv = u.recvBatches
	return u
}

// ReadFrom implements net.PacketConn for pion's read loop. Relayed bytes
// are sent on from the batch's arena without a copy; the control messages
// left for pion are copied into p. Batches are handled inside the socket's
// RawConn callback, so that the read that finds the socket empty is the
// one the goroutine parks on; a message for pion ends the callback, and
// the rest of its batch is handled at the next call.
func (c *udpConn) ReadFrom(p []byte) (int, net.Addr, error) {
	b := c.b
	for {
		if c.handle(p) {
			return c.resN, c.resAddr, nil
		}
		if b.errno != 0 {
			e := b.errno
			b.errno = 0
			return 0, nil, fmt.Errorf("turn: UDP listener recvfrom: %w", e)
		}
		c.p = p
		err := c.srv.out.rc.Read(c.recv)
		c.p = nil
		if err != nil {
			return 0, nil, err
		}
		if c.resAddr != nil {
			return c.resN, c.resAddr, nil
		}
	}
}

// recvBatches reads and handles batches until the socket is empty (false:
// park until readable), a message is for pion or the read failed (true).
func (c *udpConn) recvBatches(fd uintptr) bool {
	b := c.b
	c.resAddr = nil
	for {
		if h := c.srv.cfg.beforeUpRead; h != nil {
			h() // tests only
		}
		empty := c.readBatch(fd)
		if c.handle(c.p) {
			return true
		}
		if b.errno != 0 {
			return true
		}
		if empty {
			return false
		}
	}
}

// handle relays the batch's datagrams from b.next on, and flushes the
// queued payloads at its end. It reports true, with the message copied
// into p (c.resN, c.resAddr), at a message for pion.
func (c *udpConn) handle(p []byte) bool {
	b := c.b
	for b.next < b.count {
		i := b.next
		b.next++
		n := int(b.n[i])
		if n > maxDatagram {
			continue // possibly truncated: not a datagram any client sends us
		}
		off := int(b.off[i])
		pkt, src := b.arena[off:off+n:off+n], b.from[i]
		t := tuple{client: src, server: c.local}
		if isChannelData(pkt) {
			b.up.add(c.srv, t, pkt)
			continue
		}
		if isSendIndication(pkt) {
			b.up.addSend(c.srv, t, pkt)
			continue
		}
		b.up.flush(c.srv) // what came before is relayed before what pion does next
		if c.srv.screen(t, pkt, func(m []byte) { _, _ = c.UDPConn.WriteToUDPAddrPort(m, src) }) {
			continue
		}
		if n >= len(p) {
			continue // pion would take it for truncated; no request is this big
		}
		c.resN, c.resAddr = copy(p, pkt), net.UDPAddrFromAddrPort(src)
		return true
	}
	b.up.flush(c.srv)
	return false
}

// readBatch reads a new batch until the socket is found empty (reported
// true), a full batch, an arena with no room left for the biggest
// datagram, or an error. A read asks for as many datagrams as the arena
// has room for the biggest behind off (at most readVec), each behind the
// room of the one before; each is then moved up behind its predecessors.
func (c *udpConn) readBatch(fd uintptr) (empty bool) {
	const stride = maxDatagram + 1
	b := c.b
	b.count, b.next = 0, 0
	off := 0
	for b.count < maxBatch {
		k := min(readVec, (len(b.arena)-off)/stride)
		if k == 0 {
			return false
		}
		at := off
		count, e := c.sr.recvSlots(fd, b.arena, at, stride, stride, k)
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return true
		default:
			b.errno = e
			return false
		}
		for i, r := range c.sr.res[:count] {
			if i > 0 {
				from := at + i*stride
				copy(b.arena[off:], b.arena[from:from+r.n])
			}
			off = c.take(off, r)
		}
		if count < k {
			return true
		}
	}
	return false
}

// take adds the datagram read at off to the batch (a coalesced run's
// segments as datagrams of their own, in place: nothing is written in
// front of them on this path) and returns the offset behind it.
func (c *udpConn) take(off int, r readResult) int {
	b, n, seg := c.b, r.n, r.seg
	if seg <= 0 || n <= seg || n > maxDatagram {
		b.off[b.count], b.n[b.count], b.from[b.count] = int32(off), int32(n), r.from
		b.count++
		return off + n
	}
	if (n+seg-1)/seg > maxBatch {
		return off // more segments than the kernel coalesces: never seen
	}
	for s := 0; s < n; s += seg {
		b.off[b.count], b.n[b.count], b.from[b.count] = int32(off+s), int32(min(seg, n-s)), r.from
		b.count++
	}
	c.groReads.Add(1)
	return off + n
}

// add queues a ChannelData frame's payload for the peer bound to its
// channel; frames for no allocation or an unbound channel are dropped, as
// RFC 8656 §12.6 says (pion would drop them too, after logging). The
// payload stays where it is until the flush.
func (u *upQueue) add(s *Server, t tuple, frame []byte) {
	if len(frame) < 4 {
		return
	}
	length := int(binary.BigEndian.Uint16(frame[2:4]))
	if 4+length > len(frame) {
		return
	}
	r := s.relays.lookup(t)
	if r == nil {
		return
	}
	rt := r.routes.Load()
	if rt == nil {
		return
	}
	peer, ok := rt.byNumber[binary.BigEndian.Uint16(frame[0:2])]
	if !ok {
		return
	}
	u.queue(r, peer, frame[:4+length])
}

// addSend queues a Send indication's data (RFC 8656 §11.2) for the peer it
// names, like ChannelData's, so that both leave in the order they came and
// in the same batches; dropped as sendTarget says. msg must be a Send
// indication (isSendIndication) and stay unchanged until the flush, which
// may write over the 4 bytes in front of the data.
func (u *upQueue) addSend(s *Server, t tuple, msg []byte) {
	if r, peer, frame := s.sendTarget(t, msg); r != nil {
		u.queue(r, peer, frame)
	}
}

// queue adds frame, a 4-byte header and the payload for peer from r's
// client, to be sent from r's relay socket or handed over.
func (u *upQueue) queue(r *relayConn, peer netip.AddrPort, frame []byte) {
	to, ours := r.hairpinTarget(peer, len(frame)-4)
	if ours && to == nil {
		return // dropped: the relay socket's send would have refused it
	}
	u.ups[u.n] = upEntry{r: r, peer: peer, frame: frame, to: to}
	u.n++
}

// flush sends the queued payloads, each relay socket's in one go, and
// hands those for another allocation of this server over, each
// allocation's in one go, in the order they came (relay sockets and
// allocations in the order of their first).
func (u *upQueue) flush(s *Server) {
	for k := range u.n {
		switch e := &u.ups[k]; {
		case e.r == nil:
			continue // sent with an earlier one of its relay or allocation
		case e.to != nil:
			u.handOver(s, k)
		default:
			u.sendUp(s.out.gso, k)
		}
	}
	u.n = 0
}

// sendUp sends the payloads for the relay socket of entry k, from k on,
// to their peers.
func (u *upQueue) sendUp(gso *gsoState, k int) {
	r := u.ups[k].r
	q := &u.q
	q.start(r.reader.rc, r.reader.v6, gso, 0)
	for m := k; m < u.n; m++ {
		e := &u.ups[m]
		if e.r != r || e.to != nil {
			continue
		}
		if !q.add(e.payload(), e.peer) {
			// Not batched (a zoned peer): on its own, after what is queued.
			r.countUp(q.flush())
			if _, err := r.UDPConn.WriteToUDPAddrPort(e.payload(), e.peer); err == nil {
				r.countUp(sent{packets: 1, bytes: uint64(len(e.payload()))})
			}
		}
		*e = upEntry{}
	}
	r.countUp(q.flush())
}

// handOver delivers the datagrams for the allocation of entry k, from k
// on, as its relay socket's reader would have had them from their
// senders' relayed addresses (hairpin.go). Those its client gets as
// ChannelData over UDP are framed in place, over the ChannelData header
// they came with, and leave from the listener as one batch (GSO runs);
// the others (Data indications, a stream client) are framed in a copy.
func (u *upQueue) handOver(s *Server, k int) {
	to := u.ups[k].to
	rt, d := to.routes.Load(), to.down.Load()
	batched := rt != nil && d != nil && d.udp != nil && s.out != nil
	q := &u.q
	if batched {
		q.start(s.out.rc, s.out.v6, s.out.gso, 4)
	}
	for m := k; m < u.n; m++ {
		e := &u.ups[m]
		if e.to != to {
			continue
		}
		n := len(e.payload())
		e.r.handedOver(n)
		from := e.r.relayedAddr()
		number, bound := uint16(0), false
		if batched {
			number, bound = rt.byPeer[from]
		}
		if bound {
			putChannelFrame(e.frame, number, n, false)
			if !q.add(e.frame, d.client) {
				to.sendDown(d, e.frame, number, n)
			}
		} else {
			to.deliverCopy(e.payload(), from)
		}
		*e = upEntry{}
	}
	if batched {
		to.countDown(q.flush())
	}
}

// countUp adds what a flush sent to the allocation's counters.
func (r *relayConn) countUp(s sent) {
	if s.packets == 0 {
		return
	}
	r.upPackets.Add(s.packets)
	r.upBytes.Add(s.bytes)
	if s.runs != 0 {
		r.upRuns.Add(s.runs)
	}
}
