package ws_test

import (
	"errors"
	"testing"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

// CloseOverflow drops the backlog as an overflow does: the client gets the
// write in progress, then the overflow code, and none of what waited
// behind it (an ordinary Close would deliver all of it first).
func TestCloseOverflowDropsTheBacklog(t *testing.T) {
	ts := startServer(t, ws.Options{MaxQueue: 64 << 20, OverflowCode: ws.CloseTryAgainLater, CloseTimeout: waitTimeout}, nil)
	client := dialGorilla(t, ts.addr, smallRcvbuf)
	c := ts.accept(t)

	// The client reads nothing yet, so the writer stays in this write (if
	// it has taken it yet) and the next three messages wait in the queue
	// when CloseOverflow comes.
	big := make([]byte, bigWrite)
	if err := c.WriteBinary(big); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b", "c"} {
		if err := c.WriteText([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
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
