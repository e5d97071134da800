package ws_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

// Messages queued from many goroutines at once arrive whole (a frame is
// never interleaved with another) and in each goroutine's order. Sizes
// cross every length-encoding boundary.
func TestConcurrentWritersKeepFramesWhole(t *testing.T) {
	const (
		writers = 8
		each    = 100
	)
	sizes := []int{0, 1, 125, 126, 1000, 65535, 65536, 3000}
	// msg is what writer g sends as its seq-th message: a 9-byte prefix
	// naming it, then a filler that depends on both.
	msg := func(g, seq int) []byte {
		return append(fmt.Appendf(nil, "%02d %05d ", g, seq), pattern(sizes[(g+seq)%len(sizes)], g*31+seq)...)
	}

	ts := startServer(t, ws.Options{MaxQueue: 64 << 20}, nil)
	client := dialGorilla(t, ts.addr, 0)
	c := ts.accept(t)

	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for seq := range each {
				write := c.WriteText
				if g%2 == 1 {
					write = c.WriteBinary
				}
				if err := write(msg(g, seq)); err != nil {
					t.Errorf("writer %d message %d: %v", g, seq, err)
					return
				}
			}
		})
	}

	var next [writers]int
	for range writers * each {
		typ, p, err := client.ReadMessage()
		if err != nil {
			t.Fatalf("client read: %v", err)
		}
		var g, seq int
		if _, err := fmt.Sscanf(string(p[:9]), "%02d %05d ", &g, &seq); err != nil || g < 0 || g >= writers {
			t.Fatalf("message does not start with a writer and sequence: %q", clip(p))
		}
		if seq != next[g] {
			t.Fatalf("writer %d: got message %d, expected %d", g, seq, next[g])
		}
		next[g]++
		wantType := websocket.TextMessage
		if g%2 == 1 {
			wantType = websocket.BinaryMessage
		}
		if typ != wantType || !bytes.Equal(p, msg(g, seq)) {
			t.Fatalf("writer %d message %d: type %d, %d bytes, not what was sent", g, seq, typ, len(p))
		}
	}
	wg.Wait()
	if q := c.Queued(); q != 0 {
		t.Errorf("Queued %d after the client read everything", q)
	}
}

// bigWrite is larger than what the kernel buffers of a loopback connection
// hold (at most 4 MiB of send buffer here, plus the client's receive
// buffer, which the tests shrink): a writer handed this with a client that
// does not read stays inside its write.
const bigWrite = 16 << 20

// smallRcvbuf is the receive buffer of clients in tests that need the
// server's writer to block: small enough that bigWrite is far beyond what
// the kernel holds, large enough that a client reading afterwards gets
// window updates without waiting for TCP's zero-window probes.
const smallRcvbuf = 256 << 10

// While the writer is stuck in a write, Queued counts that write and every
// frame queued behind it, header included, to the byte; once the client
// reads, it falls to zero.
func TestQueuedCountsBytesWaiting(t *testing.T) {
	ts := startServer(t, ws.Options{MaxQueue: 64 << 20, CloseTimeout: waitTimeout}, nil)
	rc := dialRaw(t, ts.addr, smallRcvbuf)
	c := ts.accept(t)
	if q := c.Queued(); q != 0 {
		t.Fatalf("Queued %d on a new Conn", q)
	}

	big := pattern(bigWrite, 0)
	if err := c.WriteBinary(big); err != nil {
		t.Fatal(err)
	}
	want := 10 + len(big) // 64-bit length form
	if q := c.Queued(); q != want {
		t.Fatalf("Queued %d, expected %d", q, want)
	}
	small := pattern(1000, 1)
	for range 3 {
		if err := c.WriteText(small); err != nil {
			t.Fatal(err)
		}
		want += 4 + len(small) // 16-bit length form
		if q := c.Queued(); q != want {
			t.Fatalf("Queued %d, expected %d", q, want)
		}
	}
	if isDone(c) {
		t.Fatal("Conn done while its client is merely slow")
	}

	rc.expectFrame(ws.OpBinary, big)
	for range 3 {
		rc.expectFrame(ws.OpText, small)
	}
	waitFor(t, "Queued to fall to 0", func() bool { return c.Queued() == 0 })
}

// overflow fills the queue of c, whose client does not read, with numbered
// 1 KiB binary messages until WriteBinary refuses one. It checks the bound
// on the way and returns how many were accepted.
//
// Left alone, the loop outruns a writer goroutine that has not even been
// scheduled and overflows with nothing written. To test the slow client
// rather than the slow scheduler, it first waits after each message for
// the writer to hand it to the kernel, until the kernel's buffers are full
// and the writer stays in its write. Which way the queue fills changes
// nothing that is checked.
func overflow(t *testing.T, c *ws.Conn, maxQueue int) int {
	t.Helper()
	payload := make([]byte, 1024)
	kernelFull := false
	for accepted := 0; ; accepted++ {
		if accepted > 1<<20 {
			t.Fatal("the queue never filled")
		}
		for start := time.Now(); !kernelFull && c.Queued() > 0; runtime.Gosched() {
			kernelFull = time.Since(start) > 20*time.Millisecond
		}
		before := c.Queued()
		if before > maxQueue {
			t.Fatalf("Queued %d exceeds MaxQueue %d", before, maxQueue)
		}
		binary.BigEndian.PutUint32(payload, uint32(accepted))
		err := c.WriteBinary(payload)
		if err == nil {
			continue
		}
		if !errors.Is(err, ws.ErrQueueFull) {
			t.Fatalf("message %d: %v, expected ErrQueueFull", accepted, err)
		}
		// The writer only ever shrinks Queued, so it was at most before
		// when the message was refused; the check reserves 10 bytes for
		// the longest frame header.
		if before+len(payload)+10 <= maxQueue {
			t.Fatalf("refused with %d bytes queued: %d more fit in MaxQueue %d", before, len(payload)+10, maxQueue)
		}
		return accepted
	}
}

// readNumbered reads the numbered messages overflow queued and returns how
// many arrived and the error or close frame that ended them.
func readNumbered(t *testing.T, rc *rawClient, accepted int) (int, wireFrame, error) {
	t.Helper()
	for i := 0; ; i++ {
		f, err := rc.readFrame()
		if err != nil || f.op != ws.OpBinary {
			return i, f, err
		}
		if i >= accepted || len(f.payload) != 1024 || binary.BigEndian.Uint32(f.payload) != uint32(i) {
			t.Fatalf("frame %d has %d bytes numbered %d; %d were accepted", i, len(f.payload), binary.BigEndian.Uint32(f.payload), accepted)
		}
	}
}

func TestQueueOverflow(t *testing.T) {
	const maxQueue = 64 << 10

	// A client that reads as soon as the server gave up on it gets what
	// was already in the kernel and in the write in progress, then the
	// overflow close frame, and then the end of the connection.
	t.Run("client reads at once", func(t *testing.T) {
		const closeTimeout = 5 * time.Second
		ts := startServer(t, ws.Options{MaxQueue: maxQueue, OverflowCode: ws.CloseTryAgainLater, CloseTimeout: closeTimeout}, nil)
		rc := dialRaw(t, ts.addr, smallRcvbuf)
		c := ts.accept(t)
		accepted := overflow(t, c, maxQueue)
		start := time.Now()
		if got := c.CloseCode(); got != ws.CloseTryAgainLater {
			t.Errorf("CloseCode %d, expected the overflow code %d", got, ws.CloseTryAgainLater)
		}
		if err := c.WriteBinary([]byte("late")); !errors.Is(err, ws.ErrClosed) {
			t.Errorf("write after the overflow: %v, expected ErrClosed", err)
		}

		n, f, err := readNumbered(t, rc, accepted)
		if err != nil || f.op != ws.OpClose || binary.BigEndian.Uint16(f.payload) != ws.CloseTryAgainLater {
			t.Fatalf("after %d messages: frame op %d %q, error %v; expected a close frame with %d",
				n, f.op, f.payload, err, ws.CloseTryAgainLater)
		}
		rc.expectEnd()
		waitDone(t, c, waitTimeout)
		if d := time.Since(start); d > closeTimeout {
			t.Errorf("connection ended %v after the overflow, expected within CloseTimeout %v", d, closeTimeout)
		}
		t.Logf("%d messages accepted, %d delivered before the close", accepted, n)
	})

	// A client that reads only once the server is done with it finds what
	// the kernel buffered and then the close frame, if the write in
	// progress and the close frame fit in the kernel's buffers, or else
	// the end of the connection; either way within CloseTimeout.
	t.Run("client reads after the end", func(t *testing.T) {
		const closeTimeout = 300 * time.Millisecond
		ts := startServer(t, ws.Options{MaxQueue: maxQueue, OverflowCode: ws.CloseTryAgainLater, CloseTimeout: closeTimeout}, nil)
		rc := dialRaw(t, ts.addr, smallRcvbuf)
		c := ts.accept(t)
		accepted := overflow(t, c, maxQueue)
		start := time.Now()
		waitDone(t, c, closeTimeout+waitTimeout)
		if d := time.Since(start); d > closeTimeout+2*time.Second {
			t.Errorf("writer finished %v after the overflow, expected within CloseTimeout %v and a little", d, closeTimeout)
		}
		n, f, err := readNumbered(t, rc, accepted)
		switch {
		case err == nil && f.op == ws.OpClose && binary.BigEndian.Uint16(f.payload) == ws.CloseTryAgainLater:
			rc.expectEnd()
		case isEnd(err):
		default:
			t.Fatalf("after %d messages: frame op %d, error %v; expected the close frame or the end", n, f.op, err)
		}
	})

	// A writer stuck in a write the client never drains is cut off at
	// CloseTimeout: no close frame, the connection simply ends.
	t.Run("writer stuck in a write", func(t *testing.T) {
		const closeTimeout = 300 * time.Millisecond
		ts := startServer(t, ws.Options{MaxQueue: bigWrite + 64<<10, OverflowCode: ws.CloseTryAgainLater, CloseTimeout: closeTimeout}, nil)
		rc := dialRaw(t, ts.addr, smallRcvbuf)
		c := ts.accept(t)
		if err := c.WriteBinary(make([]byte, bigWrite)); err != nil {
			t.Fatal(err)
		}
		// Once its first bytes arrive, the writer is inside the write: an
		// overflow now drops only what is queued behind it.
		_ = rc.nc.SetReadDeadline(time.Now().Add(waitTimeout))
		if _, err := rc.br.Peek(10); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := c.WriteBinary(make([]byte, 64<<10)); !errors.Is(err, ws.ErrQueueFull) {
			t.Fatalf("%v, expected ErrQueueFull", err)
		}
		waitDone(t, c, closeTimeout+waitTimeout)
		if d := time.Since(start); d < closeTimeout || d > closeTimeout+2*time.Second {
			t.Errorf("writer gave up after %v, expected CloseTimeout %v and a little", d, closeTimeout)
		}
		if f, err := rc.readFrame(); !isEnd(err) {
			t.Fatalf("read frame op %d with %d bytes, %v; expected the %d-byte frame cut short", f.op, len(f.payload), err, bigWrite)
		}
	})
}

// A peer that sends pings and never reads the pongs must not grow the
// queue without bound: pongs count against MaxQueue like data.
func TestPongsCountAgainstTheQueue(t *testing.T) {
	const maxQueue = 64 << 10
	col := newCollector()
	ts := startServer(t, ws.Options{MaxQueue: maxQueue, OverflowCode: ws.CloseTryAgainLater, CloseTimeout: 300 * time.Millisecond}, col.serve)
	rc := dialRaw(t, ts.addr, smallRcvbuf)
	c := ts.accept(t)

	pings := bytes.Repeat(frame(fin|ws.OpPing, make([]byte, 125)), 64)
	go func() {
		for {
			if _, err := rc.nc.Write(pings); err != nil {
				return // the server dropped the connection (or the test ended)
			}
		}
	}()
	waitFor(t, "the overflow close", func() bool {
		if q := c.Queued(); q > maxQueue {
			t.Fatalf("Queued %d exceeds MaxQueue %d", q, maxQueue)
		}
		return c.CloseCode() != 0
	})
	if got := c.CloseCode(); got != ws.CloseTryAgainLater {
		t.Errorf("CloseCode %d, expected the overflow code", got)
	}
	if err := col.err(t); err == nil {
		t.Fatal("expected the read to fail")
	}
	waitDone(t, c, waitTimeout)
}
