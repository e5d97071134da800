package ws_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

// expectGorillaClose reads from an independent client and checks that the
// next thing it gets is a close with code and reason.
func expectGorillaClose(t *testing.T, client *websocket.Conn, code int, reason string) {
	t.Helper()
	_, p, err := client.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("client read %q, %v; expected a close with %d", clip(p), err, code)
	}
	if ce.Code != code || ce.Text != reason {
		t.Fatalf("client got close %d %q, expected %d %q", ce.Code, ce.Text, code, reason)
	}
}

func expectGorillaText(t *testing.T, client *websocket.Conn, want []byte) {
	t.Helper()
	typ, p, err := client.ReadMessage()
	if err != nil || typ != websocket.TextMessage || !bytes.Equal(p, want) {
		t.Fatalf("client read type %d %q, %v; expected text %q", typ, clip(p), err, clip(want))
	}
}

// The close frame goes after what was queued before it; the first code
// wins; nothing is queued after it; Done closes once it is written.
func TestServerClose(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	client := dialGorilla(t, ts.addr, 0)
	c := ts.accept(t)
	if isDone(c) || c.CloseCode() != 0 {
		t.Fatalf("new Conn: done %v, CloseCode %d", isDone(c), c.CloseCode())
	}

	for _, m := range []string{"one", "two", "three"} {
		if err := c.WriteText([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close(ws.CloseReplaced, "replaced")
	c.Close(ws.CloseNormal, "second close")
	if got := c.CloseCode(); got != ws.CloseReplaced {
		t.Errorf("CloseCode %d, expected the first code %d", got, ws.CloseReplaced)
	}
	if err := c.WriteText([]byte("late")); !errors.Is(err, ws.ErrClosed) {
		t.Errorf("WriteText after Close: %v, expected ErrClosed", err)
	}
	if err := c.WriteBinary([]byte("late")); !errors.Is(err, ws.ErrClosed) {
		t.Errorf("WriteBinary after Close: %v, expected ErrClosed", err)
	}

	for _, m := range []string{"one", "two", "three"} {
		expectGorillaText(t, client, []byte(m))
	}
	expectGorillaClose(t, client, ws.CloseReplaced, "replaced")
	waitDone(t, c, waitTimeout)
	if got := c.CloseCode(); got != ws.CloseReplaced {
		t.Errorf("CloseCode %d after Done, expected %d", got, ws.CloseReplaced)
	}
	if c.RemoteAddr().String() != client.LocalAddr().String() {
		t.Errorf("RemoteAddr %v, expected the client's %v", c.RemoteAddr(), client.LocalAddr())
	}
}

// An ordinary Close whose code happens to be the overflow code (1008 by
// default, which handlers use for their own policy violations) still
// delivers what was queued before it: only a real overflow drops the
// backlog.
func TestCloseWithTheOverflowCodeKeepsTheBacklog(t *testing.T) {
	client, c := backlogBehindBigWrite(t, ws.Options{MaxQueue: 64 << 20, CloseTimeout: waitTimeout})
	c.Close(ws.ClosePolicyViolation, "malformed control frame")

	if typ, p, err := client.ReadMessage(); err != nil || typ != websocket.BinaryMessage || len(p) != bigWrite {
		t.Fatalf("client read type %d, %d bytes, %v", typ, len(p), err)
	}
	for _, m := range []string{"a", "b", "c"} {
		expectGorillaText(t, client, []byte(m))
	}
	expectGorillaClose(t, client, ws.ClosePolicyViolation, "malformed control frame")
}

// A reason longer than a close frame holds is cut, on a rune boundary,
// since a peer fails a close frame whose reason is not UTF-8.
func TestCloseReasonIsCut(t *testing.T) {
	for _, tc := range []struct{ reason, sent string }{
		{strings.Repeat("x", 200), strings.Repeat("x", 123)},
		{strings.Repeat("é", 100), strings.Repeat("é", 61)}, // 122 bytes; 123 would split a rune
		{"x" + strings.Repeat("€", 60), "x" + strings.Repeat("€", 40)},
	} {
		ts := startServer(t, ws.Options{}, nil)
		client := dialGorilla(t, ts.addr, 0)
		c := ts.accept(t)
		c.Close(ws.CloseReplaced, tc.reason)
		expectGorillaClose(t, client, ws.CloseReplaced, tc.sent)
	}
}

// Abort ends the connection without a close frame.
func TestAbort(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)
	if err := c.WriteText([]byte("queued")); err != nil {
		t.Fatal(err)
	}
	rc.expectFrame(ws.OpText, []byte("queued"))
	c.Abort()
	rc.expectEnd()
	var ce *ws.CloseError
	if err := col.err(t); errors.As(err, &ce) {
		t.Errorf("read ended with %v, expected a plain error after an abort", err)
	}
	waitDone(t, c, waitTimeout)
	if got := c.CloseCode(); got != 0 {
		t.Errorf("CloseCode %d after Abort, expected 0", got)
	}
	c.Close(ws.CloseNormal, "") // no effect, no panic, after the end
	if got := c.CloseCode(); got != 0 {
		t.Errorf("CloseCode %d after Abort and Close, expected 0", got)
	}
}

// When the reading goroutine returns (here after the peer vanished without
// a close), the Conn finishes on its own.
func TestServeReturnFinishesConn(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)
	rc.send(frame(fin|ws.OpText, []byte("hi")))
	if m := col.next(t); string(m.data) != "hi" {
		t.Fatalf("read %q", m.data)
	}
	_ = rc.nc.Close()
	if err := col.err(t); err == nil {
		t.Fatal("expected the read to fail")
	}
	waitDone(t, c, waitTimeout)
	if got := c.CloseCode(); got != ws.CloseNormal {
		t.Errorf("CloseCode %d, expected the 1000 finish closes with", got)
	}
}
