package ws_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"edgerelay/fastpath/ws"
)

// Conn.WaitQueued: nil as soon as fewer than below bytes wait to be
// written, ErrClosed once the socket is closing, ctx's error when ctx ends.
//
// The queue is held above a bound by a raw client with a small receive
// buffer that does not read: the writer stays inside its write of bigWrite
// bytes, which Queued counts until the write returns.

// waitResult is what a WaitQueued running on its own goroutine returned,
// with the queue length read right after.
type waitResult struct {
	err    error
	queued int
	at     time.Time
}

func waitQueuedAsync(ctx context.Context, c *ws.Conn, below int) <-chan waitResult {
	res := make(chan waitResult, 1)
	go func() {
		err := c.WaitQueued(ctx, below)
		res <- waitResult{err, c.Queued(), time.Now()}
	}()
	return res
}

// stuckConn returns a Conn whose writer is inside a write of bigWrite
// bytes that its raw client does not read, and that client.
func stuckConn(t *testing.T, opts ws.Options) (*ws.Conn, *rawClient, []byte) {
	t.Helper()
	if opts.MaxQueue == 0 {
		opts.MaxQueue = 64 << 20
	}
	ts := startServer(t, opts, nil)
	rc := dialRaw(t, ts.addr, smallRcvbuf)
	c := ts.accept(t)
	big := pattern(bigWrite, 3)
	if err := c.WriteBinary(big); err != nil {
		t.Fatal(err)
	}
	if q := c.Queued(); q != bigWrite+10 {
		t.Fatalf("Queued %d, expected %d", q, bigWrite+10)
	}
	return c, rc, big
}

// expectBlocked checks, for a while, that the WaitQueued behind res has not
// returned while the queue stays at or above below. Returning early is what
// a broken WaitQueued does at once, so a short watch is enough.
func expectBlocked(t *testing.T, c *ws.Conn, res <-chan waitResult, below int) {
	t.Helper()
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		select {
		case r := <-res:
			t.Fatalf("WaitQueued returned %v with %d bytes queued, bound %d", r.err, r.queued, below)
		default:
		}
		if q := c.Queued(); q < below {
			t.Fatalf("Queued fell to %d below %d while the client reads nothing", q, below)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func expectResult(t *testing.T, res <-chan waitResult, within time.Duration) waitResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(within):
		t.Fatalf("WaitQueued still waiting after %v", within)
	}
	return waitResult{}
}

// Below the bound, WaitQueued returns nil without waiting for any write:
// on a fresh Conn, and with a write stuck in flight that counts fewer
// bytes than the bound (nothing drains here, so a WaitQueued that waited
// for a write would run into ctx's deadline).
func TestWaitQueuedBelowBoundReturnsAtOnce(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	dialRaw(t, ts.addr, 0)
	fresh := ts.accept(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := fresh.WaitQueued(ctx, 1); err != nil {
		t.Fatalf("WaitQueued(1) on an empty queue: %v", err)
	}

	c, _, _ := stuckConn(t, ws.Options{})
	q := c.Queued()
	if err := c.WaitQueued(ctx, q+1); err != nil {
		t.Fatalf("WaitQueued(%d) with %d queued: %v", q+1, q, err)
	}
	if got := c.Queued(); got != q {
		t.Fatalf("Queued %d after WaitQueued, expected the stuck %d: it returned only after a write", got, q)
	}
}

// Above the bound WaitQueued waits; once the client reads enough that the
// queue falls below it, WaitQueued returns nil, without waiting for the
// queue to empty.
func TestWaitQueuedWaitsForTheClientToRead(t *testing.T) {
	c, rc, big := stuckConn(t, ws.Options{})
	// A second big message waits behind the first: the bound lies between
	// the two messages and both of them.
	second := pattern(bigWrite, 4)
	if err := c.WriteBinary(second); err != nil {
		t.Fatal(err)
	}
	const below = bigWrite + bigWrite/2
	if q := c.Queued(); q != 2*(bigWrite+10) {
		t.Fatalf("Queued %d, expected %d", q, 2*(bigWrite+10))
	}
	res := waitQueuedAsync(context.Background(), c, below)
	expectBlocked(t, c, res, below)

	// The client reads the first message and stops: the writer finishes
	// that write and is stuck in the second, bigWrite+10 bytes < below.
	rc.expectFrame(ws.OpBinary, big)
	r := expectResult(t, res, waitTimeout)
	if r.err != nil {
		t.Fatalf("WaitQueued: %v, expected nil once the client read", r.err)
	}
	if r.queued >= below {
		t.Fatalf("WaitQueued returned with %d bytes queued, bound %d", r.queued, below)
	}
	if r.queued != bigWrite+10 {
		t.Errorf("Queued %d right after WaitQueued, expected the second message's %d still waiting", r.queued, bigWrite+10)
	}
	// And the rest still arrives.
	rc.expectFrame(ws.OpBinary, second)
	waitFor(t, "the queue to empty", func() bool { return c.Queued() == 0 })
	if err := c.WaitQueued(context.Background(), 1); err != nil {
		t.Fatalf("WaitQueued(1) on the emptied queue: %v", err)
	}
}

// Several producers pace themselves on the same Conn: every waiter wakes
// when the queue falls below its bound.
func TestWaitQueuedWakesEveryWaiter(t *testing.T) {
	c, rc, big := stuckConn(t, ws.Options{})
	const below = 1 << 20
	var res []<-chan waitResult
	for range 4 {
		res = append(res, waitQueuedAsync(context.Background(), c, below))
	}
	for _, r := range res {
		expectBlocked(t, c, r, below)
	}
	rc.expectFrame(ws.OpBinary, big)
	for i, ch := range res {
		if r := expectResult(t, ch, waitTimeout); r.err != nil {
			t.Errorf("waiter %d: %v", i, r.err)
		}
	}
}

// A socket that closes while WaitQueued waits ends the wait with
// ErrClosed, promptly, even when its writer is still stuck in a write that
// the close timeout (here longer than the test's patience) would end.
func TestWaitQueuedReturnsErrClosed(t *testing.T) {
	const prompt = 2 * time.Second
	for _, tc := range []struct {
		name string
		end  func(*ws.Conn, *rawClient)
	}{
		{"Close", func(c *ws.Conn, _ *rawClient) { c.Close(ws.CloseNormal, "") }},
		{"Abort", func(c *ws.Conn, _ *rawClient) { c.Abort() }},
		{"peer gone", func(_ *ws.Conn, rc *rawClient) { _ = rc.nc.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rc, _ := stuckConn(t, ws.Options{CloseTimeout: time.Minute})
			res := waitQueuedAsync(context.Background(), c, 1<<20)
			expectBlocked(t, c, res, 1<<20)
			start := time.Now()
			tc.end(c, rc)
			r := expectResult(t, res, prompt+waitTimeout)
			if !errors.Is(r.err, ws.ErrClosed) {
				t.Fatalf("WaitQueued: %v, expected ErrClosed", r.err)
			}
			if d := r.at.Sub(start); d > prompt {
				t.Fatalf("WaitQueued returned ErrClosed %v after the socket closed, expected within %v", d, prompt)
			}
			// And at once once closed, whatever the bound.
			if err := c.WaitQueued(context.Background(), 1<<30); !errors.Is(err, ws.ErrClosed) {
				t.Fatalf("WaitQueued on a closed Conn: %v, expected ErrClosed", err)
			}
			_ = rc.nc.Close() // lets a closing writer finish
			waitDone(t, c, waitTimeout)
			if err := c.WaitQueued(context.Background(), 1<<30); !errors.Is(err, ws.ErrClosed) {
				t.Fatalf("WaitQueued on a done Conn: %v, expected ErrClosed", err)
			}
		})
	}
}

// WaitQueued returns ctx's error when ctx is cancelled or its deadline
// passes first, and the Conn stays open.
func TestWaitQueuedContext(t *testing.T) {
	c, rc, big := stuckConn(t, ws.Options{})

	ctx, cancel := context.WithCancel(context.Background())
	res := waitQueuedAsync(ctx, c, 1<<20)
	expectBlocked(t, c, res, 1<<20)
	cancel()
	if r := expectResult(t, res, waitTimeout); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("WaitQueued after cancel: %v, expected context.Canceled", r.err)
	}

	const timeout = 100 * time.Millisecond
	ctx, cancel = context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	err := c.WaitQueued(ctx, 1<<20)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitQueued past its deadline: %v, expected context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d < timeout {
		t.Fatalf("WaitQueued gave up after %v, before its deadline %v", d, timeout)
	}

	if isDone(c) || c.CloseCode() != 0 {
		t.Fatalf("Conn closed by a cancelled wait (CloseCode %d)", c.CloseCode())
	}
	rc.expectFrame(ws.OpBinary, big)
	waitFor(t, "the queue to empty", func() bool { return c.Queued() == 0 })
}

// A producer that calls WaitQueued before every message and rarely has to
// wait pays nothing for it.
func TestWaitQueuedBelowBoundAllocatesNothing(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	dialRaw(t, ts.addr, 0)
	c := ts.accept(t)
	ctx := context.Background()
	var failed error
	allocs := testing.AllocsPerRun(allocRuns, func() {
		if err := c.WaitQueued(ctx, 1); err != nil {
			failed = err
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	expectNoAllocs(t, allocs, "WaitQueued below the bound")
}
