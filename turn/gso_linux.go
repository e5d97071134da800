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

// udpOut sends relayed frames to UDP clients on the listener socket (the
// client's five-tuple) in batches: runs of equal-size frames as one
// sendmsg with a UDP_SEGMENT control message (the last of a run may be
// shorter, as the kernel allows), or, where the kernel refuses GSO, the
// batch as one sendmmsg. Shared by every relay socket's reader; the
// per-batch state is each batch's sendQueue.
type udpOut struct {
	rc syscall.RawConn
	v6 bool // an AF_INET6 socket (IPv6, or dual stack: IPv4 clients are mapped)
	// gso is cleared for good when the kernel refuses UDP_SEGMENT.
	gso atomic.Bool
	// segCap is the biggest segment size still sent as GSO; lowered past
	// a size refused as bigger than the path's MTU.
	segCap  atomic.Int32
	log     *slog.Logger
	offOnce sync.Once
}

// newUDPOut probes the listener socket for UDP_SEGMENT (Linux 4.18):
// where getsockopt does not know it, GSO is off from the start, as it is
// with Config.noGSO.
func newUDPOut(c *net.UDPConn, cfg Config) (*udpOut, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("turn: UDP listener: %w", err)
	}
	o := &udpOut{rc: rc, log: cfg.Log}
	var domain int
	var derr, gerr error
	if err := rc.Control(func(fd uintptr) {
		domain, derr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
		_, gerr = unix.GetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT)
	}); err != nil {
		return nil, fmt.Errorf("turn: UDP listener: %w", err)
	}
	if derr != nil {
		return nil, fmt.Errorf("turn: UDP listener's address family: %w", derr)
	}
	o.v6 = domain == unix.AF_INET6
	o.segCap.Store(gsoMaxSegment4)
	switch {
	case cfg.noGSO:
	case gerr != nil:
		o.log.Info("turn: no UDP GSO in this kernel; relaying to UDP clients with sendmmsg", "err", gerr)
	default:
		o.gso.Store(true)
	}
	return o, nil
}

// refused handles the kernel refusing a GSO run of segment size seg with e.
func (o *udpOut) refused(e syscall.Errno, seg int) {
	if e == syscall.EINVAL && seg > gsoSafeSegment {
		for {
			c := o.segCap.Load()
			if int(c) < seg || o.segCap.CompareAndSwap(c, int32(seg-1)) {
				return
			}
		}
	}
	o.gso.Store(false)
	o.offOnce.Do(func() {
		o.log.Warn("turn: the kernel refused UDP GSO; relaying to UDP clients with sendmmsg from now on", "err", e)
	})
}

// gsoRefusal reports whether e is the kernel refusing UDP_SEGMENT (an old
// kernel, a device without checksum offload: EIO) rather than the
// datagrams.
func gsoRefusal(e syscall.Errno) bool {
	return e == syscall.EINVAL || e == syscall.EIO || e == syscall.ENOPROTOOPT || e == syscall.EOPNOTSUPP
}

// sent is what a flush sent: datagrams, their payload bytes (without the
// ChannelData headers) and the GSO sends among the calls.
type sent struct{ packets, bytes, runs uint64 }

func (s *sent) add(o sent) {
	s.packets, s.bytes, s.runs = s.packets+o.packets, s.bytes+o.bytes, s.runs+o.runs
}

// sendQueue is one batch's ChannelData frames for one UDP client, in
// order, and the syscall arguments to send them. It lives in a pooled
// relayBatch; one goroutine uses it at a time, and nothing in it is
// allocated per batch.
type sendQueue struct {
	out    *udpOut
	iov    [maxBatch]unix.Iovec
	count  int
	sa     unix.RawSockaddrInet6 // or a RawSockaddrInet4 in its first bytes
	saLen  uint32
	segMax int // the client's family's gsoMaxSegment

	hdr  unix.Msghdr
	cmsg [4]uint64 // a UDP_SEGMENT control message (uint64s: aligned for its header)
	mm   [maxBatch]unix.Mmsghdr

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

// start empties the queue for frames to client; false when they cannot be
// batched (no batched sender, a scoped address), and go one by one.
func (q *sendQueue) start(out *udpOut, client netip.AddrPort) bool {
	a := client.Addr()
	if out == nil || a.Zone() != "" || (!out.v6 && !a.Is4()) {
		return false
	}
	q.out, q.count = out, 0
	q.segMax = gsoMaxSegment6
	if a.Is4() {
		q.segMax = gsoMaxSegment4
	}
	if out.v6 {
		q.sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()} // IPv4 as ::ffff:a.b.c.d
		q.saLen = unix.SizeofSockaddrInet6
	} else {
		*(*unix.RawSockaddrInet4)(unsafe.Pointer(&q.sa)) = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
		q.saLen = unix.SizeofSockaddrInet4
	}
	port := (*[2]byte)(unsafe.Pointer(&q.sa.Port)) // the same offset in both; network byte order
	port[0], port[1] = byte(client.Port()>>8), byte(client.Port())
	return true
}

// add queues a frame (in its batch's arena) after the others.
func (q *sendQueue) add(frame []byte) {
	q.iov[q.count].Base = &frame[0]
	q.iov[q.count].SetLen(len(frame))
	q.count++
}

// flush sends the queued frames, in order, and empties the queue. A frame
// the kernel does not take is dropped, as a full socket buffer would drop
// it.
func (q *sendQueue) flush() (s sent) {
	if q.count == 0 {
		return s
	}
	if q.out.gso.Load() {
		s = q.sendRuns()
	} else {
		s = q.sendEach(0, q.count)
	}
	q.count = 0
	return s
}

// sendRuns sends each run of equal-size frames (the last may be shorter)
// as one GSO send, a frame alone with the others by sendmmsg.
func (q *sendQueue) sendRuns() (s sent) {
	segCap := min(q.segMax, int(q.out.segCap.Load()))
	single := -1 // the start of frames to go by sendmmsg, gathered
	for i := 0; i < q.count; {
		size := int(q.iov[i].Len)
		j, total := i+1, size
		if size <= segCap {
			for j < q.count {
				l := int(q.iov[j].Len)
				if l > size || total+l > gsoMaxBytes {
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

// sendRun sends frames [i, j) as one GSO send of segment size seg and
// total payload bytes.
func (q *sendQueue) sendRun(i, j, seg, total int) sent {
	q.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&q.sa)), Namelen: q.saLen, Iov: &q.iov[i]}
	q.hdr.SetIovlen(j - i)
	q.hdr.Control = (*byte)(unsafe.Pointer(&q.cmsg[0]))
	q.hdr.SetControllen(unix.CmsgSpace(2))
	*(*uint16)(unsafe.Pointer(uintptr(unsafe.Pointer(&q.cmsg[0])) + uintptr(unix.CmsgLen(0)))) = uint16(seg)
	q.errno = 0
	if err := q.out.rc.Write(q.writeGSO); err != nil {
		return sent{} // the listener is closed: shutting down
	}
	switch {
	case q.errno == 0:
		return sent{packets: uint64(j - i), bytes: uint64(total - 4*(j-i)), runs: 1}
	case gsoRefusal(q.errno):
		q.out.refused(q.errno, seg)
		return q.sendEach(i, j)
	}
	return sent{}
}

func (q *sendQueue) sendmsg(fd uintptr) bool {
	for {
		_, _, e := unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&q.hdr)), 0)
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

// sendEach sends frames [i, j) as datagrams of their own, by sendmmsg.
func (q *sendQueue) sendEach(i, j int) sent {
	for k := i; k < j; k++ {
		m := &q.mm[k].Hdr
		m.Name, m.Namelen, m.Iov = (*byte)(unsafe.Pointer(&q.sa)), q.saLen, &q.iov[k]
		m.SetIovlen(1)
	}
	q.pos, q.end, q.done = i, j, sent{}
	if err := q.out.rc.Write(q.writeMM); err != nil {
		return sent{}
	}
	return q.done
}

func (q *sendQueue) sendmmsg(fd uintptr) bool {
	for q.pos < q.end {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&q.mm[q.pos])), uintptr(q.end-q.pos), 0, 0, 0)
		switch e {
		case 0:
			if n == 0 {
				q.pos++ // cannot happen; never spin
				continue
			}
			for k := q.pos; k < q.pos+int(n); k++ {
				q.done.bytes += q.iov[k].Len - 4
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
