package turn

import (
	"bytes"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRecvSlotsFindsTheSocketEmpty: a read that brings fewer datagrams
// than it asked for has emptied the socket (the reader waits without
// another system call); one that brings all it asked for leaves the rest
// to the next reads, each datagram whole, in its slot, with its sender.
func TestRecvSlotsFindsTheSocketEmpty(t *testing.T) {
	rx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	from := tx.LocalAddr().(*net.UDPAddr).AddrPort()
	rc, err := rx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sr segReader
	const at, stride, room = 10, 3000, 2048
	arena := make([]byte, at+readVec*stride)
	read := func(f func(fd uintptr)) {
		// Control: the socket's fd without the poller's wait.
		if err := rc.Control(f); err != nil {
			t.Fatal(err)
		}
	}
	send := func(sizes ...int) {
		for _, n := range sizes {
			if _, err := tx.Write(bytes.Repeat([]byte{byte(n)}, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(what string, got int, e syscall.Errno, want ...int) {
		t.Helper()
		if e != 0 || got != len(want) {
			t.Fatalf("%s: %d read (%v), want %d", what, got, e, len(want))
		}
		for i, n := range want {
			r, slot := sr.res[i], arena[at+i*stride:]
			if r.n != n || r.from != from || !bytes.Equal(slot[:n], bytes.Repeat([]byte{byte(n)}, n)) || slot[n] != 0 {
				t.Fatalf("%s: datagram %d %+v, want %d bytes from %v in its slot", what, i, r, n, from)
			}
		}
		clear(arena)
	}
	send(100)
	waitReadable(t, rx)
	read(func(fd uintptr) {
		got, e := sr.recvSlots(fd, arena, at, stride, room, readVec)
		check("one queued", got, e, 100)
	})
	sizes := []int{300, 0, 7, 1500, 2048}
	send(sizes[:readVec+1]...)
	waitReadable(t, rx)
	read(func(fd uintptr) {
		got, e := sr.recvSlots(fd, arena, at, stride, room, readVec)
		check("one more than a read asks for", got, e, sizes[:readVec]...)
		got, e = sr.recvSlots(fd, arena, at, stride, room, 1)
		check("the last, asking for one", got, e, sizes[readVec])
		if got, e := sr.recvSlots(fd, arena, at, stride, room, readVec); e != syscall.EAGAIN {
			t.Fatalf("after all: %d read (%v), want EAGAIN", got, e)
		}
	})
}

// waitReadable waits up to 2 s until c has a datagram queued.
func waitReadable(t *testing.T, c *net.UDPConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = rc.Control(func(fd uintptr) {
		n, err = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 2000)
	})
	if err != nil || n != 1 {
		t.Fatalf("poll: %d ready, %v", n, err)
	}
}
