//go:build linux

// The writes at once need netlimit's raw path (Linux); elsewhere TryWrite
// takes nothing and every write goes to the writer goroutine.

package ws

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"edgerelay/fastpath/netlimit"
)

// writeNowPair is a Conn on a connection netlimit accepted (as in the
// relay) and the raw client socket. small gives both ends the kernel's
// smallest buffers from before the connection is made, so that a few KiB
// fill the window.
func writeNowPair(t *testing.T, small bool) (*Conn, *net.TCPConn) {
	t.Helper()
	s, client := netlimitPair(t, small)
	c := newConn(s, NewSettings(Options{}))
	if c.now == nil {
		t.Fatal("a Conn on netlimit's plain connection cannot write at once")
	}
	t.Cleanup(func() {
		c.Abort()
		<-c.Done()
		_ = client.Close()
	})
	return c, client
}

// netlimitPair is a connection netlimit accepted and the raw client
// socket (see writeNowPair for small).
func netlimitPair(t *testing.T, small bool) (net.Conn, *net.TCPConn) {
	t.Helper()
	var shrink func(_, _ string, rc syscall.RawConn) error
	if small {
		shrink = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 1),
					unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1))
			})
			return errors.Join(err, serr)
		}
	}
	lc := net.ListenConfig{Control: shrink} // accepted sockets inherit the listener's buffers
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nl := netlimit.Wrap(ln, netlimit.Limits{}, nil)
	t.Cleanup(func() { _ = nl.Close() })
	d := net.Dialer{Control: shrink}
	cl, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client := cl.(*net.TCPConn)
	s, err := nl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return s, client
}

// unread is how many bytes wait in the client's receive queue.
func unread(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		t.Fatal(err, ierr)
	}
	return n
}

// A frame queued on a socket whose writer has been idle is in the kernel
// when WriteText returns (on loopback, in the client's queue already), and
// the writer's role is given up: no goroutine was started for it.
func TestIdleSocketWritesAtOnce(t *testing.T) {
	c, client := writeNowPair(t, false)
	for i := range 3 {
		c.mu.Lock()
		c.idleSince = time.Now().Add(-2 * writeAtOnceAfter).UnixNano() // idle long enough
		c.mu.Unlock()
		msg := []byte{'m', byte('0' + i)}
		if err := c.WriteText(msg); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		on, queued := c.writerOn, len(c.pending)+c.inFlight
		c.mu.Unlock()
		if on || queued != 0 {
			t.Fatalf("message %d: writer on %v, %d bytes queued after WriteText returned; want it written at once", i, on, queued)
		}
		if n := unread(t, client); n != 2+len(msg) {
			t.Fatalf("message %d: %d bytes in the client's queue when WriteText returned, want the %d-byte frame", i, n, 2+len(msg))
		}
		frame := make([]byte, 2+len(msg))
		if _, err := io.ReadFull(client, frame); err != nil {
			t.Fatal(err)
		}
		if frame[0] != 0x80|OpText || int(frame[1]) != len(msg) || string(frame[2:]) != string(msg) {
			t.Fatalf("message %d: frame % x", i, frame)
		}
	}
}

// A write at once that the socket does not take all of leaves the rest to
// the writer goroutine, which finishes it before anything queued after it:
// frames queued in a stream (within writeAtOnceAfter) and after pauses all
// arrive whole and in order, and a close that drops the backlog never
// cuts the frame in flight.
func TestWriteAtOnceLeavesTheRestInOrder(t *testing.T) {
	c, client := writeNowPair(t, true)
	c.opts.MaxQueue = 64 << 20
	payload := func(i int) []byte {
		p := make([]byte, writeAtOnceMax-4-(i%5)*1000) // a frame of at most writeAtOnceMax
		for j := range p {
			p[j] = byte(i + j)
		}
		binary.BigEndian.PutUint32(p, uint32(i))
		return p
	}
	if err := c.WriteBinary(payload(0)); err != nil {
		t.Fatal(err)
	}
	// The writer goroutine may already have taken the carry (it cannot
	// write any of it: the client reads nothing yet), so what is certain
	// is the split: part in the kernel, the rest queued under a writer.
	c.mu.Lock()
	on, carried, from, queued := c.writerOn, c.carry != nil, c.carryFrom, len(c.pending)+c.inFlight
	c.mu.Unlock()
	frameLen := 4 + len(payload(0))
	if !on || from <= 0 || queued != frameLen-from {
		t.Fatalf("a frame too big for the socket's buffers, written at once: writer on %v, carried %v from %d, %d bytes queued; want part written and the rest (%d bytes) left to the writer goroutine", on, carried, from, queued, frameLen-from)
	}
	const frames = 60
	go func() {
		for i := 1; i < frames; i++ {
			if i%3 == 0 {
				// A pause: the next frame is tried at once if the writer
				// is idle by then (it may still be busy with the rest).
				c.mu.Lock()
				c.idleSince = min(c.idleSince, time.Now().Add(-2*writeAtOnceAfter).UnixNano())
				c.mu.Unlock()
			}
			if err := c.WriteBinary(payload(i)); err != nil {
				t.Error(err)
				return
			}
		}
		// The close drops what is queued, never the frame in flight.
		c.close(CloseTryAgainLater, "overflow", true)
	}()
	br := bufio.NewReader(client)
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	var h [4]byte
	for i := 0; ; i++ {
		if _, err := io.ReadFull(br, h[:2]); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h[0] == 0x80|OpClose {
			if i == 0 {
				t.Fatal("the close came before the first frame")
			}
			return // every frame before it came whole
		}
		if h[0] != 0x80|OpBinary || h[1] != 126 {
			t.Fatalf("frame %d: header % x, want a binary frame with a 16-bit length", i, h[:2])
		}
		if _, err := io.ReadFull(br, h[2:4]); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, binary.BigEndian.Uint16(h[2:4]))
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatal(err)
		}
		if want := payload(i); string(got) != string(want) {
			t.Fatalf("frame %d: %d bytes, first %d; want %d bytes of frame %d", i, len(got), binary.BigEndian.Uint32(got), len(want), i)
		}
	}
}

// countingTry counts the writes at once a Conn attempts.
type countingTry struct {
	sysConn
	tw    sysConn
	tries int
}

func (c *countingTry) TryWrite(b []byte) (int, error) {
	c.tries++
	return c.tw.TryWrite(b)
}

// The bounds of a write at once, at the edge and one past: a frame of
// writeAtOnceMax bytes is tried at once, one of a byte more is left to the
// writer goroutine; a writer idle for writeAtOnceAfter is bypassed, one
// idle for less is not.
func TestWriteAtOnceLimits(t *testing.T) {
	c, client := writeNowPair(t, false)
	try := &countingTry{sysConn: c.now, tw: c.now}
	c.now = try
	br := bufio.NewReader(client)
	// send reports whether the frame was tried at once, and whether the
	// writer's idle time had reached writeAtOnceAfter by the time
	// WriteBinary returned (a slow scheduler can make it so).
	send := func(frameLen int, idle time.Duration) (tried, reached bool) {
		t.Helper()
		deadline := time.Now().Add(waitTimeoutInternal)
		var set time.Time
		for { // the previous frame's writer must have given up the role
			c.mu.Lock()
			on := c.writerOn
			if !on {
				set = time.Now()
				c.idleSince = set.Add(-idle).UnixNano()
			}
			c.mu.Unlock()
			if !on {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the writer kept its role")
			}
			time.Sleep(time.Millisecond)
		}
		before := try.tries
		payload := make([]byte, frameLen-4) // 16-bit length form: 4 bytes of header
		if err := c.WriteBinary(payload); err != nil {
			t.Fatal(err)
		}
		reached = idle+time.Since(set) >= writeAtOnceAfter
		c.mu.Lock()
		tried = try.tries != before
		c.mu.Unlock()
		if _, err := io.ReadFull(br, make([]byte, frameLen)); err != nil {
			t.Fatal(err)
		}
		return tried, reached
	}
	for _, tc := range []struct {
		frame int
		idle  time.Duration
		want  bool
	}{
		{writeAtOnceMax, 2 * writeAtOnceAfter, true},
		{writeAtOnceMax + 1, 2 * writeAtOnceAfter, false},
		{1000, writeAtOnceAfter, true},
		{1000, writeAtOnceAfter / 2, false},
	} {
		got, reached := send(tc.frame, tc.idle)
		for attempt := 0; !tc.want && reached && attempt < 20; attempt++ {
			// Descheduled long enough that the writer was idle for
			// writeAtOnceAfter after all: this attempt says nothing.
			got, reached = send(tc.frame, tc.idle)
		}
		if got != tc.want {
			t.Errorf("a %d-byte frame after %v idle: written at once %v, want %v", tc.frame, tc.idle, got, tc.want)
		}
	}
}

const waitTimeoutInternal = 10 * time.Second
