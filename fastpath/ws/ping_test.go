package ws_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

const pingInterval = 50 * time.Millisecond

// A peer that answers pings (fasthttp/websocket does so while it reads)
// stays connected for as long as it likes.
func TestPingsKeepAnAnsweringPeer(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{PingInterval: pingInterval}, col.serve)
	client := dialGorilla(t, ts.addr, 0)
	c := ts.accept(t)

	var pings atomic.Int32
	client.SetPingHandler(func(data string) error {
		pings.Add(1)
		return client.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(waitTimeout))
	})
	readErr := make(chan error, 1)
	go func() {
		for {
			if _, _, err := client.ReadMessage(); err != nil {
				readErr <- err
				return
			}
		}
	}()

	waitFor(t, "six pings", func() bool { return pings.Load() >= 6 })
	if isDone(c) || c.CloseCode() != 0 {
		t.Fatalf("server dropped a peer that answered every ping (CloseCode %d)", c.CloseCode())
	}
	if err := client.WriteMessage(websocket.TextMessage, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if m := col.next(t); string(m.data) != "still here" {
		t.Fatalf("server read %q", m.data)
	}

	if err := client.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")); err != nil {
		t.Fatal(err)
	}
	var ce *websocket.CloseError
	if err := <-readErr; !errors.As(err, &ce) || ce.Code != websocket.CloseNormalClosure {
		t.Fatalf("client read ended with %v, expected the echoed close", err)
	}
}

// A peer that does not answer gets one ping; at the next tick, with no pong
// in between, the connection is aborted without a close frame.
func TestPingTimeoutAborts(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{PingInterval: pingInterval}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	start := time.Now() // before the Conn, and so its ticker, exists
	c := ts.accept(t)

	rc.expectFrame(ws.OpPing, nil)
	rc.expectEnd()
	if d := time.Since(start); d < 2*pingInterval || d > 2*pingInterval+2*time.Second {
		t.Errorf("connection ended %v after the upgrade, expected two ping intervals (%v)", d, 2*pingInterval)
	}
	var ce *ws.CloseError
	if err := col.err(t); errors.As(err, &ce) {
		t.Errorf("read ended with %v, expected a plain error after an abort", err)
	}
	waitDone(t, c, waitTimeout)
	if got := c.CloseCode(); got != 0 {
		t.Errorf("CloseCode %d, expected 0 for an aborted connection", got)
	}
}

// A pong from a raw client counts just as well, whatever its payload.
func TestPongFromRawClient(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{PingInterval: pingInterval}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)
	for range 4 {
		rc.expectFrame(ws.OpPing, nil)
		rc.send(frame(fin|ws.OpPong, []byte("any")))
	}
	if isDone(c) {
		t.Fatal("server dropped a peer that answered every ping")
	}
	rc.send(closeFrame(ws.CloseNormal, ""))
	// Pings may still be on the way before the echo.
	for {
		f, err := rc.readFrame()
		if err != nil {
			t.Fatalf("expected the echoed close: %v", err)
		}
		if f.op == ws.OpPing {
			continue
		}
		if f.op != ws.OpClose {
			t.Fatalf("got op %d, expected the echoed close", f.op)
		}
		break
	}
	expectCloseError(t, col.err(t), ws.CloseNormal, true)
}
