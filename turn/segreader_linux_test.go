package turn

import (
	"net"
	"net/netip"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRecvTwoFindsTheSocketEmpty: a read asking for two that brings one
// has emptied the socket (the reader waits without another system call);
// one that brings two leaves the rest to the next reads, each datagram
// whole, with its sender.
func TestRecvTwoFindsTheSocketEmpty(t *testing.T) {
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
	room, second := make([]byte, 2048), make([]byte, 2048)
	read := func(f func(fd uintptr)) {
		// Control: the socket's fd without the poller's wait.
		if err := rc.Control(f); err != nil {
			t.Fatal(err)
		}
	}
	send := func(sizes ...int) {
		for _, n := range sizes {
			if _, err := tx.Write(make([]byte, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(100)
	waitReadable(t, rx)
	read(func(fd uintptr) {
		res, count, e := sr.recvTwo(fd, room, second)
		if e != 0 || count != 1 || res[0].n != 100 || res[0].from != from {
			t.Fatalf("one queued: %d read (%v), first %+v; want 1 of 100 bytes from %v", count, e, res[0], from)
		}
	})
	send(300, 0, 7)
	waitReadable(t, rx)
	read(func(fd uintptr) {
		res, count, e := sr.recvTwo(fd, room, second)
		if e != 0 || count != 2 || res[0].n != 300 || res[1].n != 0 || res[1].from != from {
			t.Fatalf("three queued: %d read (%v), %+v; want 300 and 0 bytes", count, e, res)
		}
		if r, e := sr.recv(fd, room); e != 0 || r.n != 7 {
			t.Fatalf("the third: %+v (%v), want 7 bytes", r, e)
		}
		if _, e := sr.recv(fd, room); e != syscall.EAGAIN {
			t.Fatalf("after all three: %v, want EAGAIN", e)
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
