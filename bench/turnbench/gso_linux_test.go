package turnbench

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestGSOSenderCoalesces checks how the GRO load is made: a run of k
// datagrams sent by gsoSender reaches a loopback socket with UDP_GRO on as
// one read of k segments (the control message says the segment size), and
// one without it (coturn's) as k reads of one datagram each.
func TestGSOSenderCoalesces(t *testing.T) {
	const k, seg = 16, 124
	for _, gro := range []bool{true, false} {
		rx, rc := loopbackSocket(t, gro)
		tx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Close()
		g, err := newGSOSender(tx, rx.LocalAddr().(*net.UDPAddr).AddrPort())
		if err != nil {
			t.Skipf("no GSO: %v", err)
		}
		run := make([]byte, k*seg)
		for i := range k {
			binary.BigEndian.PutUint32(run[i*seg:], uint32(i))
		}
		if err := g.send(run, seg); err != nil {
			t.Fatalf("send: %v", err)
		}
		var reads, bytes, segs int
		for bytes < k*seg {
			n, segSize := recvSeg(t, rx, rc)
			reads++
			bytes += n
			if segSize > 0 {
				segs += (n + segSize - 1) / segSize
				if segSize != seg {
					t.Errorf("GRO segment size %d, want %d", segSize, seg)
				}
			} else {
				segs++
			}
		}
		if segs != k || bytes != k*seg {
			t.Errorf("gro=%v: %d datagrams, %d bytes; want %d, %d", gro, segs, bytes, k, k*seg)
		}
		if want := map[bool]int{true: 1, false: k}[gro]; reads != want {
			t.Errorf("gro=%v: %d reads, want %d", gro, reads, want)
		}
	}
}

// loopbackSocket is a UDP socket on 127.0.0.1, closed when t ends, with
// UDP_GRO on if gro (t is skipped where the kernel lacks it).
func loopbackSocket(t *testing.T, gro bool) (*net.UDPConn, syscall.RawConn) {
	t.Helper()
	rx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rx.Close() })
	rc, err := rx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if gro {
		var serr error
		_ = rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1) })
		if serr != nil {
			t.Skipf("no UDP_GRO in this kernel: %v", serr)
		}
	}
	return rx, rc
}

// recvSeg reads one datagram (or a coalesced run) from rx within 2 s: its
// length and the UDP_GRO segment size (0 for a datagram alone).
func recvSeg(t *testing.T, rx *net.UDPConn, rc syscall.RawConn) (n, seg int) {
	t.Helper()
	buf := make([]byte, 1<<16)
	oob := make([]byte, unix.CmsgSpace(4))
	_ = rx.SetReadDeadline(time.Now().Add(2 * time.Second))
	var oobn int
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN // false: wait until readable
	})
	if err != nil || rerr != nil {
		t.Fatalf("recvmsg: %v %v", err, rerr)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
			seg = int(*(*int32)(unsafe.Pointer(&m.Data[0])))
		}
	}
	return n, seg
}

// TestRunPeerEchoesInRuns checks how the both-legs GRO load is made: the
// run peer sends back datagrams sent to it one by one as GSO runs of its
// run length (one coalesced read at a socket with UDP_GRO on), a run that
// does not fill after runFlushAfter, and a datagram of another size
// after the run before it, in the order they came.
func TestRunPeerEchoesInRuns(t *testing.T) {
	const run, seg = 16, 120
	p, err := newRunPeer(netip.MustParseAddrPort("127.0.0.1:0"), run)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rx, rc := loopbackSocket(t, true)
	if _, err := newGSOSender(rx, p.Addr().AddrPort()); err != nil {
		t.Skipf("no GSO: %v", err)
	}
	to := p.Addr().AddrPort()
	send := func(size, k int) {
		b := make([]byte, size)
		for i := range k {
			binary.BigEndian.PutUint32(b, uint32(i))
			if _, err := rx.WriteToUDPAddrPort(b, to); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A full run, then three that wait for the flush, then one of another
	// size behind two of the run's size.
	send(seg, run)
	if n, s := recvSeg(t, rx, rc); n != run*seg || s != seg {
		t.Errorf("a full run came back as %d bytes in segments of %d, want %d in %d", n, s, run*seg, seg)
	}
	send(seg, 3)
	if n, s := recvSeg(t, rx, rc); n != 3*seg || s != seg {
		t.Errorf("a short run came back as %d bytes in segments of %d, want %d in %d", n, s, 3*seg, seg)
	}
	send(seg, 2)
	send(seg+4, 1)
	if n, s := recvSeg(t, rx, rc); n != 2*seg || s != seg {
		t.Errorf("the run before another size came back as %d bytes in segments of %d, want %d in %d", n, s, 2*seg, seg)
	}
	if n, s := recvSeg(t, rx, rc); n != seg+4 || s != 0 {
		t.Errorf("the datagram of another size came back as %d bytes (segments of %d), want %d alone", n, s, seg+4)
	}
	if got := p.Received(); got != run+3+3 {
		t.Errorf("the peer counted %d datagrams, want %d", got, run+3+3)
	}
}
