package turn

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// A relay socket's reader drains what the kernel has queued, up to
// maxBatch datagrams, into one arena, frames each in place and sends the
// ChannelData frames for a UDP client as GSO runs (gso_linux.go): one
// sendmsg for up to 64 datagrams, where the kernel's send path, most of a
// relay's CPU, runs once per run instead of once per datagram (issue 17).
const (
	// maxBatch is the datagrams read per batch; also UDP_MAX_SEGMENTS, the
	// kernel's cap on segments per GSO send.
	maxBatch = 64
	// maxSlots is the datagrams a batch may hold: reads stop at maxBatch,
	// and the last read may bring readVec GRO-coalesced runs of up to 64
	// each.
	maxSlots = (1 + readVec) * maxBatch
	// groSlack is the room a coalesced read's segments take beyond the
	// read itself once spread into slots of their own.
	groSlack = maxBatch * (relayHeadroom + 3)
	// batchArenaSize holds a full batch of datagrams of typical WebRTC
	// size (1,300 bytes with their headroom) behind which readVec
	// datagrams of the biggest size still fit: a read is only made into
	// room for the biggest, so nothing is ever truncated for want of room;
	// big datagrams just make smaller batches.
	batchArenaSize = maxBatch*(relayHeadroom+1300) + readVec*(relayBufSize+groSlack)
)

// relayBatch is one batch of datagrams read from a relay socket, each in
// its slot of arena: relayHeadroom bytes for a header, the datagram, 3
// bytes of room for a stream's padding. Batches come from a pool shared by
// every relay socket and are held only while being read and relayed: a
// parked reader (one per allocation) holds none.
type relayBatch struct {
	arena []byte
	count int
	off   [maxSlots]int32 // slot start in arena
	n     [maxSlots]int32 // datagram length; maxDatagram+1: too big, dropped
	from  [maxSlots]netip.AddrPort
	q     sendQueue // the frames of this batch to a UDP client
}

// slot is datagram i's slot: its headroom, the datagram, the padding room.
func (b *relayBatch) slot(i int) []byte {
	off := int(b.off[i])
	return b.arena[off : off+relayHeadroom+int(b.n[i])+3]
}

// newRelayBufPool makes the relay sockets' shared pool of batches.
func newRelayBufPool() *sync.Pool {
	return &sync.Pool{New: func() any {
		b := &relayBatch{arena: make([]byte, batchArenaSize)}
		b.q.init()
		return b
	}}
}

// ReadFrom implements net.PacketConn for pion's relay loop, which is only
// kept for its exit: every datagram is relayed here, as ChannelData to a
// channel-bound peer's client or as a Data indication to one with only a
// permission, and dropped for a peer with neither. pion's loop reads into
// a 1,600-byte buffer of its own (rtpMTU) and drops anything bigger, so
// its Data indications cannot carry what a peer may send (up to 65,507
// bytes over IPv4); ReadFrom returns only the socket's error, on which pion
// ends the allocation.
func (r *relayConn) ReadFrom([]byte) (int, net.Addr, error) {
	if h := r.srv.cfg.holdRelayReads; h != nil {
		<-h // tests only: once, before the first read, never per datagram
	}
	return 0, nil, r.reader.run(r.deliverBatch)
}

// deliverBatch relays a batch in the order read. ChannelData and Data
// indications for a UDP client are framed in place, queued and sent
// batched. For a TCP or TLS client the frames,
// framed and padded in place, are moved together in the arena and written
// at once, so that a batch costs one send (over TLS, one record per 16 KiB
// instead of one per datagram, and one send per record); each frame moves
// towards the arena's start, never past the start of its own slot (a slot
// is longer than its padded frame), so the moves overwrite only frames
// already moved and no slot still to be read. A Data indication for a
// stream client first sends what came before it, so the client gets every
// datagram in the order the socket read them.
func (r *relayConn) deliverBatch(b *relayBatch) {
	rt, d := r.routes.Load(), r.down.Load()
	if rt == nil || d == nil {
		return
	}
	q, out := &b.q, r.srv.out
	batched := d.udp != nil && out != nil
	if batched {
		q.start(out.rc, out.v6, out.gso, 4)
	}
	var run streamRun
	for i := range b.count {
		n := int(b.n[i])
		if n > maxDatagram {
			continue // a full room: possibly truncated
		}
		slot, peer := b.slot(i), b.from[i]
		if number, ok := rt.byPeer[peer]; ok {
			at := int(b.off[i]) + relayHeadroom - 4
			size := putChannelFrame(b.arena[at:], number, n, d.stream != nil)
			switch {
			case d.stream != nil:
				run.add(b.arena, at, size, n)
				continue
			case batched && q.add(b.arena[at:at+size], d.client):
				continue
			}
			r.sendDown(d, b.arena[at:], number, n)
			continue
		}
		if !rt.perms[peer.Addr()] {
			continue
		}
		if batched {
			if m := putDataIndication(slot, n, peer); m != nil && q.addFramed(m, d.client, len(m)-n) {
				continue
			}
		}
		r.flushDown(d, b, &run, batched)
		r.sendIndication(d, slot, n, peer)
	}
	r.flushDown(d, b, &run, batched)
}

// flushDown sends what the batch holds for the client: the UDP queue (when
// batched), the stream run.
func (r *relayConn) flushDown(d *downstream, b *relayBatch, run *streamRun, batched bool) {
	if batched {
		r.countDown(b.q.flush())
	}
	r.writeRun(d, b.arena, run)
}

// streamRun is the frames of a batch gathered for one stream write:
// arena[start:end], carrying packets datagrams of bytes payload bytes.
type streamRun struct {
	start, end     int
	packets, bytes uint64
}

// add appends the size-byte frame at arena[at:] (payload n bytes) to the
// run, moving it behind the run's last frame.
func (s *streamRun) add(arena []byte, at, size, n int) {
	if s.packets == 0 {
		s.start, s.end = at, at
	}
	if at != s.end {
		copy(arena[s.end:s.end+size], arena[at:at+size])
	}
	s.end += size
	s.packets++
	s.bytes += uint64(n)
}

// writeRun writes the run's frames to the stream client and empties it.
// A failed write drops them, as a full socket buffer would; the
// connection's reader will see the error.
func (r *relayConn) writeRun(d *downstream, arena []byte, s *streamRun) {
	if s.packets == 0 {
		return
	}
	if d.write(arena[s.start:s.end]) == nil {
		r.downPackets.Add(s.packets)
		r.downBytes.Add(s.bytes)
		r.downRuns.Add(1)
	}
	*s = streamRun{}
}

// countDown adds what a flush sent to the allocation's counters.
func (r *relayConn) countDown(s sent) {
	if s.packets == 0 {
		return
	}
	r.downPackets.Add(s.packets)
	r.downBytes.Add(s.bytes)
	if s.runs != 0 {
		r.downRuns.Add(s.runs)
	}
}

// datagramReader reads a relay socket's datagrams in batches into arenas
// borrowed from a pool shared by every relay, and relays each batch from
// inside the socket's RawConn callback: Go's net package reads only into a
// buffer handed to it before it parks, and the callback takes a batch when
// the socket is readable and gives it back before the goroutine parks.
// Relaying inside the callback also lets the read that found the socket
// empty (EAGAIN) be the one the goroutine parks on: a wake-up costs one
// empty read, not two.
type datagramReader struct {
	rc      syscall.RawConn
	v6      bool // an AF_INET6 socket, for the batched sends to peers (udpread_linux.go)
	pool    *sync.Pool
	recv    func(fd uintptr) bool // made once: a closure per read would allocate
	deliver func(*relayBatch)

	// The callback's result and the reads' arguments; one goroutine
	// (pion's, for this allocation) reads.
	errno syscall.Errno
	sr    segReader
	// groReads counts coalesced reads (tests read it; one add per read of
	// a run, by this socket's reader only).
	groReads atomic.Uint64
}

func newDatagramReader(c *net.UDPConn, pool *sync.Pool, gro bool) (*datagramReader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("turn: relay socket: %w", err)
	}
	v6, err := socketIsV6(rc)
	if err != nil {
		return nil, fmt.Errorf("turn: relay socket: %w", err)
	}
	if gro {
		enableGRO(rc)
	}
	d := &datagramReader{rc: rc, v6: v6, pool: pool}
	d.recv = d.recvBatches
	return d, nil
}

// run reads and relays with deliver until the socket fails (closed).
func (d *datagramReader) run(deliver func(*relayBatch)) error {
	d.deliver = deliver
	if err := d.rc.Read(d.recv); err != nil {
		return err
	}
	return fmt.Errorf("turn: relay socket recvfrom: %w", d.errno)
}

// recvBatches reads batches and relays them until the socket is empty
// (false: park until readable) or fails (true, with errno set).
func (d *datagramReader) recvBatches(fd uintptr) bool {
	b := d.pool.Get().(*relayBatch)
	defer d.pool.Put(b)
	for {
		empty := d.readBatch(fd, b)
		if b.count > 0 {
			d.deliver(b)
		}
		if d.errno != 0 {
			return true
		}
		if empty {
			return false
		}
	}
}

// readBatch reads into b until the socket is found empty (reported
// true), a full batch, an arena with no room left for the biggest
// datagram, or an error (errno). A read asks for as many datagrams as the
// arena has room for the biggest behind off (at most readVec): each lands
// one stride further than the one before, past anything its predecessors
// can spread into, and is moved up behind them.
func (d *datagramReader) readBatch(fd uintptr, b *relayBatch) (empty bool) {
	const stride = relayBufSize + groSlack
	b.count = 0
	off := 0
	for b.count < maxBatch {
		k := min(readVec, (len(b.arena)-off)/stride)
		if k == 0 {
			return false
		}
		at := off + relayHeadroom
		count, e := d.sr.recvSlots(fd, b.arena, at, stride, maxDatagram+1, k)
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return true
		default:
			d.errno = e
			return false
		}
		for i, r := range d.sr.res[:count] {
			if i > 0 {
				from := at + i*stride
				copy(b.arena[off+relayHeadroom:], b.arena[from:from+r.n])
			}
			off = d.take(b, off, r)
		}
		if count < k {
			return true
		}
	}
	return false
}

// take adds the datagram read into the slot at off to the batch (a
// coalesced run spread into slots of its own) and returns the offset
// behind it.
func (d *datagramReader) take(b *relayBatch, off int, r readResult) int {
	n, seg := r.n, r.seg
	if seg <= 0 || n <= seg || n > maxDatagram {
		b.off[b.count], b.n[b.count], b.from[b.count] = int32(off), int32(n), r.from
		b.count++
		return off + relayHeadroom + n + 3
	}
	if (n+seg-1)/seg > maxBatch {
		return off // more segments than the kernel coalesces: never seen
	}
	d.groReads.Add(1)
	return b.spread(off, n, seg, r.from)
}

// spread splits a coalesced read of n bytes at off (segments of seg bytes,
// the last possibly shorter) into slots of their own, moving each segment
// behind its own headroom, the last first, and returns the offset after
// the last slot.
func (b *relayBatch) spread(off, n, seg int, from netip.AddrPort) int {
	k := (n + seg - 1) / seg
	stride := relayHeadroom + seg + 3
	for i := k - 1; i >= 0; i-- {
		l := min(seg, n-i*seg)
		src := off + relayHeadroom + i*seg
		dst := off + i*stride
		copy(b.arena[dst+relayHeadroom:dst+relayHeadroom+l], b.arena[src:src+l])
		b.off[b.count+i], b.n[b.count+i], b.from[b.count+i] = int32(dst), int32(l), from
	}
	b.count += k
	last := n - (k-1)*seg
	return off + (k-1)*stride + relayHeadroom + last + 3
}

// sockaddrAddrPort decodes a sender's address, IPv4-mapped ones unmapped.
func sockaddrAddrPort(rsa *syscall.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case syscall.AF_INET:
		sa := (*syscall.RawSockaddrInet4)(unsafe.Pointer(rsa))
		port := (*[2]byte)(unsafe.Pointer(&sa.Port)) // network byte order
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(port[0])<<8|uint16(port[1]))
	case syscall.AF_INET6:
		sa := (*syscall.RawSockaddrInet6)(unsafe.Pointer(rsa))
		port := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(port[0])<<8|uint16(port[1]))
	}
	return netip.AddrPort{}
}
