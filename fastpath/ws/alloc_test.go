package ws_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"edgerelay/fastpath/alloctest"
	"edgerelay/fastpath/ws"
)

// The hot path allocates nothing per message in steady state. Both tests
// count the allocations of the whole process (testing.AllocsPerRun reads
// runtime.MemStats), so the Conn's writer goroutine and fasthttp's hijack
// plumbing are included, and each measured run is a full trip over
// loopback: one pre-built frame written by the raw client and read by
// ReadMessage, or one WriteText read back into a fixed buffer.

const allocRuns = 1000

// expectNoAllocs fails t unless allocs, measured per what, is 0. Under
// -race it only logs: the detector's sync.Pool drops a quarter of what is
// put back, on purpose (netlimit's pooled reads and writes among it), and
// make test runs every Alloc test again without it, where the zero is
// asserted; the measured loop still ran under the detector.
func expectNoAllocs(t *testing.T, allocs float64, what string) {
	t.Helper()
	if allocs == 0 {
		return
	}
	if alloctest.RaceEnabled() {
		t.Logf("%v allocations per %s under -race (not asserted there)", allocs, what)
		return
	}
	t.Errorf("%v allocations per %s, expected 0", allocs, what)
}

func TestReadMessageAllocatesNothing(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	payload := pattern(1024, 0)
	f := frame(fin|ws.OpText, payload)
	var failed error
	errMismatch := errors.New("read something else than was sent")
	read := func() {
		if _, err := rc.nc.Write(f); err != nil {
			failed = err
			return
		}
		op, p, err := c.ReadMessage()
		switch {
		case err != nil:
			failed = err
		case op != ws.OpText || !bytes.Equal(p, payload):
			failed = errMismatch
		}
	}
	for range 100 { // warm up: the message buffer grows once
		read()
	}
	allocs := testing.AllocsPerRun(allocRuns, read)
	if failed != nil {
		t.Fatal(failed)
	}
	expectNoAllocs(t, allocs, "1 KiB message read")
}

// Control frames between messages cost nothing either: a ping before each
// message is answered with a pong the client reads back.
func TestPingAndMessageAllocateNothing(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	payload := pattern(1024, 0)
	frames := append(frame(fin|ws.OpPing, []byte("beat")), frame(fin|ws.OpText, payload)...)
	wantPong := []byte{0x80 | ws.OpPong, 4, 'b', 'e', 'a', 't'}
	pong := make([]byte, len(wantPong))
	var failed error
	errMismatch := errors.New("read something else than was sent")
	read := func() {
		if _, err := rc.nc.Write(frames); err != nil {
			failed = err
			return
		}
		op, p, err := c.ReadMessage()
		switch {
		case err != nil:
			failed = err
		case op != ws.OpText || !bytes.Equal(p, payload):
			failed = errMismatch
		}
		if _, err := fullRead(rc, pong); err != nil {
			failed = err
		} else if !bytes.Equal(pong, wantPong) {
			failed = errMismatch
		}
	}
	for range 100 {
		read()
	}
	allocs := testing.AllocsPerRun(allocRuns, read)
	if failed != nil {
		t.Fatal(failed)
	}
	expectNoAllocs(t, allocs, "ping and 1 KiB message")
}

func TestWriteTextAllocatesNothing(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	payload := pattern(1024, 0)
	want := append([]byte{0x81, 126, 1024 >> 8, 1024 & 0xff}, payload...)
	got := make([]byte, len(want))
	var failed error
	errMismatch := errors.New("client read something else than was queued")
	write := func() {
		if err := c.WriteText(payload); err != nil {
			failed = err
			return
		}
		if _, err := fullRead(rc, got); err != nil {
			failed = err
		} else if !bytes.Equal(got, want) {
			failed = errMismatch
		}
	}
	for range 100 { // warm up: the queue buffers grow once
		write()
	}
	allocs := testing.AllocsPerRun(allocRuns, write)
	if failed != nil {
		t.Fatal(failed)
	}
	expectNoAllocs(t, allocs, "1 KiB WriteText")
}

// fullRead is io.ReadFull on the client's reader, without the interface
// conversion in the measured loop.
func fullRead(rc *rawClient, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := rc.br.Read(p[n:])
		n += m
		if err != nil {
			return n, fmt.Errorf("client read: %w", err)
		}
	}
	return n, nil
}

// Bursts bigger than the buffer an idle socket keeps (64 KiB) reuse the
// queue buffers too, when pings run as they do in the service: the buffers
// go back only when a ping tick finds the socket idle, not each time the
// writer catches up.
func TestBurstsAllocateNothing(t *testing.T) {
	ts := startServer(t, ws.Options{PingInterval: time.Hour}, nil)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	const burst = 32 // messages of 16 KiB: 512 KiB
	payload := pattern(16<<10, 0)
	frameLen := 4 + len(payload)
	got := make([]byte, burst*frameLen)
	var failed error
	errMismatch := errors.New("client read something else than was queued")
	write := func() {
		for range burst {
			if err := c.WriteBinary(payload); err != nil {
				failed = err
				return
			}
		}
		if _, err := fullRead(rc, got); err != nil {
			failed = err
		} else if !bytes.Equal(got[len(got)-len(payload):], payload) {
			failed = errMismatch
		}
	}
	for range 20 {
		write()
	}
	allocs := testing.AllocsPerRun(100, write)
	if failed != nil {
		t.Fatal(failed)
	}
	expectNoAllocs(t, allocs, fmt.Sprintf("burst of %d KiB", burst*16))
}
