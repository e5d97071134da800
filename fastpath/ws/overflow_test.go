package ws_test

import (
	"errors"
	"testing"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

// backlogBehindBigWrite returns a client that reads nothing yet and its
// Conn, on which a message of bigWrite bytes is written and then "a", "b"
// and "c" are: the writer stays in the big write (if it has taken it yet)
// and the three small ones wait in the queue.
func backlogBehindBigWrite(t *testing.T, opts ws.Options) (*websocket.Conn, *ws.Conn) {
	t.Helper()
	ts := startServer(t, opts, nil)
	client := dialGorilla(t, ts.addr, smallRcvbuf)
	c := ts.accept(t)
	if err := c.WriteBinary(make([]byte, bigWrite)); err != nil {
		t.Fatal(err)
	}
	// The writer starts when something is queued: the small messages must
	// wait behind the big write, not go out in the same one.
	waitFor(t, "the writer to take the big message", func() bool { return ws.Taken(c) })
	for _, m := range []string{"a", "b", "c"} {
		if err := c.WriteText([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	return client, c
}

// CloseOverflow drops the backlog as an overflow does: the client gets the
// write in progress, then the overflow code, and none of what waited
// behind it (an ordinary Close would deliver all of it first).
func TestCloseOverflowDropsTheBacklog(t *testing.T) {
	client, c := backlogBehindBigWrite(t, ws.Options{MaxQueue: 64 << 20, OverflowCode: ws.CloseTryAgainLater, CloseTimeout: waitTimeout})
	c.CloseOverflow()
	c.CloseOverflow() // idempotent
	if got := c.CloseCode(); got != ws.CloseTryAgainLater {
		t.Errorf("CloseCode %d, expected the overflow code", got)
	}
	if err := c.WriteText([]byte("late")); !errors.Is(err, ws.ErrClosed) {
		t.Errorf("WriteText after CloseOverflow: %v, expected ErrClosed", err)
	}
	// The big message arrives if it was in flight (dropped if it was still
	// waiting); the three small ones never do.
	typ, p, err := client.ReadMessage()
	if err == nil {
		if typ != websocket.BinaryMessage || len(p) != bigWrite {
			t.Fatalf("client read type %d, %d bytes, expected the big message or the close", typ, len(p))
		}
		_, _, err = client.ReadMessage()
	}
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != ws.CloseTryAgainLater || ce.Text != "send queue full" {
		t.Fatalf("client got %v, expected close %d", err, ws.CloseTryAgainLater)
	}
}
