package turn

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// GSO limits. One GSO send is one UDP datagram to the kernel until the
// device (or the kernel, in software) cuts it into segments, so the whole
// run must fit an unfragmented IP packet's 65,535 bytes, and each segment
// the path's MTU: a segment bigger than the route allows is refused
// (EINVAL), not fragmented.
const (
	// gsoMaxBytes is a run's payload: 65,535 less IPv4's and UDP's headers.
	gsoMaxBytes = 65535 - 20 - 8
	// gsoMaxSegment4 and gsoMaxSegment6 are the biggest segments tried:
	// an Ethernet MTU (1,500) less the IP and UDP headers. A WebRTC
	// datagram (about 1,240 bytes with its ChannelData header) fits;
	// bigger frames go one by one.
	gsoMaxSegment4 = 1500 - 20 - 8
	gsoMaxSegment6 = 1500 - 40 - 8
	// gsoSafeSegment fits every path (IPv6's minimum MTU, 1,280, less the
	// headers): EINVAL for a segment this small is the kernel refusing
	// GSO itself; for a bigger one, most likely a smaller MTU on the way.
	gsoSafeSegment = 1280 - 40 - 8
)

// gsoState is whether the kernel takes UDP_SEGMENT, shared by every
// socket the server sends from (the listener, the relay sockets): the
// kernel and the devices are the same for all.
type gsoState struct {
	// on is cleared for good when the kernel refuses UDP_SEGMENT.
	on atomic.Bool
	// segCap is the biggest segment size still sent as GSO; lowered past
	// a size refused as bigger than the path's MTU.
	segCap  atomic.Int32
	log     *slog.Logger
	offOnce sync.Once
}

// refused handles the kernel refusing a GSO run of segment size seg with e.
func (g *gsoState) refused(e syscall.Errno, seg int) {
	if e == syscall.EINVAL && seg > gsoSafeSegment {
		for {
			c := g.segCap.Load()
			if int(c) < seg || g.segCap.CompareAndSwap(c, int32(seg-1)) {
				return
			}
		}
	}
	g.on.Store(false)
	g.offOnce.Do(func() {
		g.log.Warn("turn: the kernel refused UDP GSO; relaying with sendmmsg from now on", "err", e)
	})
}

// gsoRefusal reports whether e is the kernel refusing UDP_SEGMENT (an old
// kernel, a device without checksum offload: EIO) rather than the
// datagrams.
func gsoRefusal(e syscall.Errno) bool {
	return e == syscall.EINVAL || e == syscall.EIO || e == syscall.ENOPROTOOPT || e == syscall.EOPNOTSUPP
}

// udpOut is the UDP listener socket as the relay sockets' readers send
// from it (to the clients' five-tuples), batched: runs of equal-size
// frames as one sendmsg with a UDP_SEGMENT control message (the last of a
// run may be shorter, as the kernel allows), or, where the kernel refuses
// GSO, a batch as one sendmmsg. The per-batch state is each batch's
// sendQueue.
type udpOut struct {
	rc  syscall.RawConn
	v6  bool // an AF_INET6 socket (IPv6, or dual stack: IPv4 peers are mapped)
	gso *gsoState
}

// newUDPOut probes the listener socket for UDP_SEGMENT (Linux 4.18):
// where getsockopt does not know it, GSO is off from the start, as it is
// with Config.noGSO.
func newUDPOut(c *net.UDPConn, cfg Config) (*udpOut, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("turn: UDP listener: %w", err)
	}
	v6, err := socketIsV6(rc)
	if err != nil {
		return nil, fmt.Errorf("turn: UDP listener: %w", err)
	}
	o := &udpOut{rc: rc, v6: v6, gso: &gsoState{log: cfg.Log}}
	o.gso.segCap.Store(gsoMaxSegment4)
	var gerr error
	if err := rc.Control(func(fd uintptr) { _, gerr = unix.GetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT) }); err != nil {
		return nil, fmt.Errorf("turn: UDP listener: %w", err)
	}
	switch {
	case cfg.noGSO:
	case gerr != nil:
		o.gso.log.Info("turn: no UDP GSO in this kernel; relaying with sendmmsg", "err", gerr)
	default:
		o.gso.on.Store(true)
	}
	return o, nil
}

// socketIsV6 reports whether the socket is AF_INET6 (SO_DOMAIN).
func socketIsV6(rc syscall.RawConn) (bool, error) {
	var domain int
	var derr error
	if err := rc.Control(func(fd uintptr) { domain, derr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN) }); err != nil {
		return false, err
	}
	if derr != nil {
		return false, fmt.Errorf("address family: %w", derr)
	}
	return domain == unix.AF_INET6, nil
}

// The data path's syscalls (sendmsg, sendmmsg, recvmsg, recvmmsg) are
// made raw, without telling the scheduler: every socket is non-blocking,
// so none of them waits (EAGAIN parks the goroutine in the netpoller
// instead), and the scheduler's entry into a syscall is what wakes sysmon
// when the process had gone idle. A relay that real-time traffic wakes a
// few thousand times a second, finding a datagram or two each time, then
// woke sysmon every time: a futex wake, its 20 µs sleep and back, two
// context switches and more on the relay's core. In a profile of two
// Chromium pages' data channel relayed through the server that was 22% of
// its CPU (runtime.sysmon, futex, nanosleep, finish_task_switch). A raw
// syscall holds the P for its length, as the scheduler would not take it
// back from so short a call anyway.

// sent is what a flush sent: datagrams, their payload bytes (without the
// ChannelData headers) and the GSO sends among the calls.
type sent struct{ packets, bytes, runs uint64 }

func (s *sent) add(o sent) {
	s.packets, s.bytes, s.runs = s.packets+o.packets, s.bytes+o.bytes, s.runs+o.runs
}

// sendQueue is one batch's datagrams from one socket, in order, and the
// syscall arguments to send them. It lives in a batch owned by one
// goroutine at a time; nothing in it is allocated per batch.
type sendQueue struct {
	rc     syscall.RawConn
	v6     bool
	gso    *gsoState
	header int // bytes of a datagram not counted as payload, unless add says otherwise (a ChannelData header)

	iov   [maxSlots]unix.Iovec
	over  [maxSlots]uint16 // each datagram's bytes not counted as payload
	dst   [maxSlots]uint8  // index in names
	count int
	// names are the destinations, one per change of destination.
	names   [maxSlots]unix.RawSockaddrInet6 // or RawSockaddrInet4s in their first bytes
	nameLen [maxSlots]uint32
	segMax  [maxSlots]int32 // the destination's family's gsoMaxSegment
	last    netip.AddrPort  // names[nnames-1]
	nnames  int

	hdr  unix.Msghdr
	cmsg [4]uint64 // a UDP_SEGMENT control message (uint64s: aligned for its header)
	mm   [maxSlots]unix.Mmsghdr

	// The write callbacks' arguments and results.
	pos, end int
	errno    syscall.Errno
	done     sent
	writeGSO func(fd uintptr) bool // made once: a closure per send would allocate
	writeMM  func(fd uintptr) bool
}

func (q *sendQueue) init() {
	q.writeGSO = q.sendmsg
	q.writeMM = q.sendmmsg
	h := (*unix.Cmsghdr)(unsafe.Pointer(&q.cmsg[0]))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
}

// start empties the queue for datagrams sent from the socket rc (AF_INET6
// if v6); header is the bytes of each not counted as payload, unless
// addFramed says otherwise.
func (q *sendQueue) start(rc syscall.RawConn, v6 bool, gso *gsoState, header int) {
	q.rc, q.v6, q.gso, q.header = rc, v6, gso, header
	q.count, q.nnames = 0, 0
}

// add queues a datagram (in its batch's arena) to dst after the others.
// It reports false, queueing nothing, for a destination the socket cannot
// send to (another family) or one with a zone, left to the caller.
func (q *sendQueue) add(datagram []byte, dst netip.AddrPort) bool {
	return q.addFramed(datagram, dst, q.header)
}

// addFramed is add for a datagram of which over bytes are not payload (a
// Data indication's header and padding among ChannelData frames).
func (q *sendQueue) addFramed(datagram []byte, dst netip.AddrPort, over int) bool {
	if q.nnames == 0 || dst != q.last {
		a := dst.Addr()
		if a.Zone() != "" || (!q.v6 && !a.Is4()) {
			return false
		}
		k := q.nnames
		q.segMax[k] = gsoMaxSegment6
		if a.Is4() {
			q.segMax[k] = gsoMaxSegment4
		}
		if q.v6 {
			q.names[k] = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()} // IPv4 as ::ffff:a.b.c.d
			q.nameLen[k] = unix.SizeofSockaddrInet6
		} else {
			*(*unix.RawSockaddrInet4)(unsafe.Pointer(&q.names[k])) = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
			q.nameLen[k] = unix.SizeofSockaddrInet4
		}
		port := (*[2]byte)(unsafe.Pointer(&q.names[k].Port)) // the same offset in both; network byte order
		port[0], port[1] = byte(dst.Port()>>8), byte(dst.Port())
		q.last = dst
		q.nnames++
	}
	q.iov[q.count].Base = nil // an empty datagram is one too
	if len(datagram) > 0 {
		q.iov[q.count].Base = &datagram[0]
	}
	q.iov[q.count].SetLen(len(datagram))
	q.over[q.count] = uint16(over)
	q.dst[q.count] = uint8(q.nnames - 1)
	q.count++
	return true
}

// flush sends the queued frames, in order, and empties the queue. A frame
// the kernel does not take is dropped, as a full socket buffer would drop
// it.
func (q *sendQueue) flush() (s sent) {
	if q.count == 0 {
		return s
	}
	if q.gso.on.Load() {
		s = q.sendRuns()
	} else {
		s = q.sendEach(0, q.count)
	}
	q.count = 0
	return s
}

// sendRuns sends each run of equal-size datagrams to one destination
// (the last may be shorter) as one GSO send, a datagram alone with the
// others by sendmmsg.
func (q *sendQueue) sendRuns() (s sent) {
	segCap := int(q.gso.segCap.Load())
	single := -1 // the start of datagrams to go by sendmmsg, gathered
	for i := 0; i < q.count; {
		size, dst := int(q.iov[i].Len), q.dst[i]
		j, total := i+1, size
		if size > 0 && size <= min(segCap, int(q.segMax[dst])) { // a segment size of 0 would send the run as one datagram
			for j < q.count && j-i < maxBatch { // UDP_MAX_SEGMENTS
				l := int(q.iov[j].Len)
				if l > size || q.dst[j] != dst || total+l > gsoMaxBytes {
					break
				}
				total += l
				j++
				if l < size {
					break
				}
			}
		}
		if j-i == 1 {
			if single < 0 {
				single = i
			}
			i = j
			continue
		}
		if single >= 0 {
			s.add(q.sendEach(single, i))
			single = -1
		}
		s.add(q.sendRun(i, j, size, total))
		i = j
	}
	if single >= 0 {
		s.add(q.sendEach(single, q.count))
	}
	return s
}

// sendRun sends datagrams [i, j) (one destination) as one GSO send of
// segment size seg and total bytes.
func (q *sendQueue) sendRun(i, j, seg, total int) sent {
	dst := q.dst[i]
	q.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&q.names[dst])), Namelen: q.nameLen[dst], Iov: &q.iov[i]}
	q.hdr.SetIovlen(j - i)
	q.hdr.Control = (*byte)(unsafe.Pointer(&q.cmsg[0]))
	q.hdr.SetControllen(unix.CmsgSpace(2))
	*(*uint16)(unsafe.Pointer(uintptr(unsafe.Pointer(&q.cmsg[0])) + uintptr(unix.CmsgLen(0)))) = uint16(seg)
	q.errno = 0
	if err := q.rc.Write(q.writeGSO); err != nil {
		return sent{} // the socket is closed
	}
	switch {
	case q.errno == 0:
		for k := i; k < j; k++ {
			total -= int(q.over[k])
		}
		return sent{packets: uint64(j - i), bytes: uint64(total), runs: 1}
	case gsoRefusal(q.errno):
		q.gso.refused(q.errno, seg)
		return q.sendEach(i, j)
	}
	return sent{}
}

func (q *sendQueue) sendmsg(fd uintptr) bool {
	for {
		_, _, e := unix.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&q.hdr)), 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait until the socket is writable
		}
		q.errno = e
		return true
	}
}

// sendEach sends datagrams [i, j), each on its own, by sendmmsg.
func (q *sendQueue) sendEach(i, j int) sent {
	for k := i; k < j; k++ {
		m, dst := &q.mm[k].Hdr, q.dst[k]
		m.Name, m.Namelen, m.Iov = (*byte)(unsafe.Pointer(&q.names[dst])), q.nameLen[dst], &q.iov[k]
		m.SetIovlen(1)
	}
	q.pos, q.end, q.done = i, j, sent{}
	if err := q.rc.Write(q.writeMM); err != nil {
		return sent{}
	}
	return q.done
}

func (q *sendQueue) sendmmsg(fd uintptr) bool {
	for q.pos < q.end {
		n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&q.mm[q.pos])), uintptr(q.end-q.pos), 0, 0, 0)
		switch e {
		case 0:
			if n == 0 {
				q.pos++ // cannot happen; never spin
				continue
			}
			for k := q.pos; k < q.pos+int(n); k++ {
				q.done.bytes += q.iov[k].Len - uint64(q.over[k])
			}
			q.done.packets += uint64(n)
			q.pos += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			q.pos++ // the kernel refused this datagram: dropped
		}
	}
	return true
}

// segReader reads datagrams with recvmmsg, up to readVec at once, and
// the segment size of a GRO-coalesced one (UDP_GRO on the socket: the
// kernel hands a run of equal-size datagrams from one sender over as one
// buffer, the last segment possibly shorter). Its fields are the
// syscalls' arguments, kept so that nothing is allocated per read; one
// reader at a time.
//
// Why several at once: a socket's reader must read until the socket is
// empty before it waits (Go's poller is edge-triggered), and a read that
// brings fewer datagrams than it asked for has found the socket empty:
// whatever arrives after it raises a new readiness event. Asking for one
// at a time, every wake would end in a read that finds nothing, a system
// call of its own; a wake that finds fewer than readVec datagrams costs
// one system call in all.
type segReader struct {
	msgs [readVec]unix.Mmsghdr
	iov  [readVec]unix.Iovec
	cmsg [readVec][4]uint64 // room for a UDP_GRO control message (an int) each
	rsa  [readVec]syscall.RawSockaddrAny
	res  [readVec]readResult // the last read's datagrams
}

// readVec is the most datagrams one read asks for. Each needs room for
// the biggest datagram (or coalesced run) until it is read, so a batch's
// arena holds readVec such rooms behind its typical content.
const readVec = 4

// readResult is one datagram a segReader read: its length, its segment
// size (0 unless coalesced) and its sender.
type readResult struct {
	n, seg int
	from   netip.AddrPort
}

// prepare points message i's header at room.
func (r *segReader) prepare(i int, room []byte) {
	r.iov[i].Base = &room[0]
	r.iov[i].SetLen(len(room))
	h := &r.msgs[i].Hdr
	*h = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.rsa[i])), Namelen: syscall.SizeofSockaddrAny, Iov: &r.iov[i]}
	h.SetIovlen(1)
	h.Control = (*byte)(unsafe.Pointer(&r.cmsg[i][0]))
	h.SetControllen(int(unsafe.Sizeof(r.cmsg[i])))
	r.msgs[i].Len = 0
}

// result decodes message i after a read of n bytes into it.
func (r *segReader) result(i, n int) readResult {
	res := readResult{n: n, from: sockaddrAddrPort(&r.rsa[i])}
	if int(r.msgs[i].Hdr.Controllen) >= unix.CmsgLen(4) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&r.cmsg[i][0]))
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO {
			res.seg = int(*(*int32)(unsafe.Pointer(uintptr(unsafe.Pointer(&r.cmsg[i][0])) + uintptr(unix.CmsgLen(0)))))
		}
	}
	return res
}

// recvSlots reads up to k (at most readVec) datagrams in one recvmmsg,
// datagram i into arena[at+i*stride:] with room bytes of room, and
// reports how many came (their results in r.res): fewer than k means the
// socket was found empty.
func (r *segReader) recvSlots(fd uintptr, arena []byte, at, stride, room, k int) (int, syscall.Errno) {
	for i := range k {
		r.prepare(i, arena[at+i*stride:at+i*stride+room])
	}
	got, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(k), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	for i := range int(got) {
		r.res[i] = r.result(i, int(r.msgs[i].Len))
	}
	return int(got), 0
}

// enableGRO asks the kernel to hand coalesced runs to this socket
// (UDP_GRO, Linux 5.0); where it cannot, datagrams come one by one as
// before.
func enableGRO(rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1) })
}
