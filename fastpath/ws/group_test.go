package ws_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

func TestGroupDrain(t *testing.T) {
	var g ws.Group
	added := make(chan bool, 8)
	ts := startServer(t, ws.Options{}, func(c *ws.Conn) {
		if !g.Add(c) {
			added <- false
			c.Close(ws.CloseGoingAway, "draining")
			return
		}
		added <- true
		defer g.Remove(c)
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})

	var conns []*ws.Conn
	var clients []*websocket.Conn
	for range 3 {
		client := dialGorilla(t, ts.addr, 0)
		c := ts.accept(t)
		if !<-added {
			t.Fatal("Add refused before the drain")
		}
		// Queued before the drain, so delivered before its close frame.
		if err := c.WriteText([]byte("before drain")); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		clients = append(clients, client)
	}
	if n := g.Len(); n != 3 {
		t.Fatalf("Len %d, expected 3", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := g.Drain(ctx, ws.CloseGoingAway); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for i, c := range conns {
		if !isDone(c) {
			t.Errorf("conn %d not done when Drain returned", i)
		}
		if got := c.CloseCode(); got != ws.CloseGoingAway {
			t.Errorf("conn %d CloseCode %d, expected 1001", i, got)
		}
	}
	for _, client := range clients {
		expectGorillaText(t, client, []byte("before drain"))
		expectGorillaClose(t, client, ws.CloseGoingAway, "server shutting down")
	}
	waitFor(t, "the readers to Remove their conns", func() bool { return g.Len() == 0 })

	// A socket that arrives during the drain is refused by Add.
	late := dialGorilla(t, ts.addr, 0)
	ts.accept(t)
	if <-added {
		t.Fatal("Add accepted a conn after the drain")
	}
	expectGorillaClose(t, late, ws.CloseGoingAway, "draining")
	if n := g.Len(); n != 0 {
		t.Errorf("Len %d after a refused Add", n)
	}
}

// Drain waits no longer than its context for a writer stuck on a client
// that does not read.
func TestGroupDrainGivesUpWithItsContext(t *testing.T) {
	var g ws.Group
	ts := startServer(t, ws.Options{MaxQueue: 64 << 20, CloseTimeout: waitTimeout}, nil)
	rc := dialRaw(t, ts.addr, smallRcvbuf)
	c := ts.accept(t)
	if !g.Add(c) {
		t.Fatal("Add refused")
	}
	if err := c.WriteBinary(make([]byte, bigWrite)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := g.Drain(ctx, ws.CloseGoingAway); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain: %v, expected context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Drain returned after %v with a 100ms context", d)
	}
	if isDone(c) {
		t.Fatal("conn done although its writer cannot finish")
	}
	if got := c.CloseCode(); got != ws.CloseGoingAway {
		t.Errorf("CloseCode %d, expected 1001", got)
	}
	// The client goes away; the stuck write fails and the writer ends.
	_ = rc.nc.Close()
	waitDone(t, c, waitTimeout)
}
