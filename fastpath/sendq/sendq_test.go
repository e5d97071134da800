package sendq_test

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/fastpath/sendq"
)

// pipe returns a queue writing into one end of a TCP loopback connection
// and the other end.
func pipe(t *testing.T, opts sendq.Options) (*sendq.Queue, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-accepted
	t.Cleanup(func() { w.Close(); r.Close() })
	return sendq.New(w, opts), r
}

func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := readFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return buf
}

func readFull(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestOrderAndLineFeeds(t *testing.T) {
	q, r := pipe(t, sendq.Options{})
	var want []byte
	for i := range 1000 {
		msg := bytes.Repeat([]byte{byte('a' + i%26)}, i%50)
		if i%2 == 0 {
			if err := q.Put(msg, true, nil); err != nil {
				t.Fatal(err)
			}
		} else if err := q.TryPut(msg, true); err != nil {
			t.Fatal(err)
		}
		want = append(append(want, msg...), '\n')
	}
	if got := readN(t, r, len(want)); !bytes.Equal(got, want) {
		t.Fatal("bytes arrived out of order or altered")
	}
	q.Close()
	<-q.Done()
	if q.Err() != nil {
		t.Fatal(q.Err())
	}
}

// TestBoundAndReserve: Put waits at the bound until the writer makes room;
// TryPut may use the reserve and then reports ErrFull without queueing.
func TestBoundAndReserve(t *testing.T) {
	q, r := pipe(t, sendq.Options{MaxBytes: 1 << 20, Reserve: 1 << 10})
	chunk := make([]byte, 64<<10)
	// Fill the kernel buffers and the queue while the reader sleeps.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var puts atomic.Int64
	wg.Go(func() {
		for {
			if err := q.Put(chunk, false, stop); err != nil {
				return
			}
			puts.Add(1)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for q.Queued() < (1<<20)-len(chunk) {
		if time.Now().After(deadline) {
			t.Fatal("the queue never filled")
		}
		time.Sleep(time.Millisecond)
	}
	if q.Queued() > 1<<20 {
		t.Fatalf("queued %d past the bound", q.Queued())
	}
	// The reserve takes a small frame, not a big one.
	if err := q.TryPut(make([]byte, 512), false); err != nil {
		t.Fatalf("small TryPut into the reserve: %v", err)
	}
	before := q.Queued()
	if err := q.TryPut(make([]byte, 4<<10), false); !errors.Is(err, sendq.ErrFull) {
		t.Fatalf("TryPut beyond the reserve: %v", err)
	}
	if q.Queued() != before {
		t.Fatal("a refused TryPut queued something")
	}
	if err := q.Put(make([]byte, 2<<20), false, nil); !errors.Is(err, sendq.ErrTooBig) {
		t.Fatalf("Put larger than the bound: %v", err)
	}
	// The reader drains; the waiting Put proceeds.
	n := puts.Load()
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	for puts.Load() < n+32 {
		if time.Now().After(deadline) {
			t.Fatal("Put never resumed")
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
}

// TestCloseFlushesAbortDrops: Close writes what is queued; Abort does not;
// both wake a waiting Put with ErrClosed.
func TestCloseFlushesAbortDrops(t *testing.T) {
	q, r := pipe(t, sendq.Options{})
	_ = q.Put([]byte("last words"), true, nil)
	q.Close()
	if err := q.Put([]byte("late"), true, nil); !errors.Is(err, sendq.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	<-q.Done()
	if got := readN(t, r, 11); string(got) != "last words\n" {
		t.Fatalf("got %q", got)
	}

	q2, _ := pipe(t, sendq.Options{MaxBytes: 64 << 10})
	blocked := make(chan error, 1)
	go func() {
		for {
			if err := q2.Put(make([]byte, 32<<10), false, nil); err != nil {
				blocked <- err
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	q2.Abort()
	select {
	case err := <-blocked:
		if !errors.Is(err, sendq.ErrClosed) {
			t.Fatalf("waiting Put after Abort: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting Put was not woken by Abort")
	}
}

// TestWriteTimeout: a peer that stops reading ends the queue after
// WriteTimeout with the timeout as its error.
func TestWriteTimeout(t *testing.T) {
	q, _ := pipe(t, sendq.Options{MaxBytes: 64 << 20, WriteTimeout: 200 * time.Millisecond})
	for range 256 {
		if err := q.TryPut(make([]byte, 64<<10), false); err != nil {
			break
		}
	}
	select {
	case <-q.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the writer is still blocked")
	}
	var ne net.Error
	if err := q.Err(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err %v, want a timeout", err)
	}
}

// TestPutAllocatesNothing: once the buffers have grown, queueing and
// writing cost no allocation.
func TestPutAllocatesNothing(t *testing.T) {
	q, r := pipe(t, sendq.Options{})
	msg := bytes.Repeat([]byte("x"), 1000)
	buf := make([]byte, len(msg)+1)
	step := func() {
		if err := q.Put(msg, true, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := readFull(r, buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		step()
	}
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Fatalf("%v allocations per message", allocs)
	}
}

// TestHoldKeepsOrderUntilRelease: what is queued during a hold is written
// only after Release, in the order queued; Close ends a hold and flushes.
func TestHoldKeepsOrderUntilRelease(t *testing.T) {
	q, r := pipe(t, sendq.Options{})
	q.Hold()
	if err := q.TryPut([]byte("first"), true); err != nil {
		t.Fatal(err)
	}
	if err := q.Put([]byte("second"), true, nil); err != nil {
		t.Fatal(err)
	}
	// Nothing may arrive while the queue is held: a short read must time
	// out (a writer that ignored the hold wrote at once).
	_ = r.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := r.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read %d bytes during a hold (%v)", n, err)
	}
	if got := q.Queued(); got != len("first\nsecond\n") {
		t.Fatalf("queued %d during a hold", got)
	}
	q.Release()
	if got := readN(t, r, len("first\nsecond\n")); string(got) != "first\nsecond\n" {
		t.Fatalf("after Release: %q", got)
	}

	q.Hold()
	if err := q.TryPut([]byte("third"), true); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if got := readN(t, r, len("third\n")); string(got) != "third\n" {
		t.Fatalf("after Close: %q", got)
	}
	select {
	case <-q.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a held queue did not end on Close")
	}
}
