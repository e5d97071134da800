package main

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	sdkmailbox "edgerelay/sdk/mailbox"
)

// readSignal reads the next frame of a signal socket (10 s at most).
func readSignal(t *testing.T, what string, c *websocket.Conn) (int, []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, msg, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return typ, msg
}

func wantPeer(t *testing.T, what string, c *websocket.Conn, want string) {
	t.Helper()
	if typ, msg := readSignal(t, what, c); typ != websocket.TextMessage || string(msg) != want {
		t.Fatalf("%s: frame %d %q, want %q", what, typ, msg, want)
	}
}

func wantClose(t *testing.T, what string, c *websocket.Conn, code int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, msg, err := c.ReadMessage()
		if err == nil {
			t.Fatalf("%s: frame %q, want close %d", what, msg, code)
		}
		if got, _ := sdkmailbox.CloseCode(err); got != code {
			t.Fatalf("%s: %v, want close %d", what, err, code)
		}
		return
	}
}

// TestClusterSignalAcrossNodes: the two sides of a signal rendezvous on
// different nodes meet as on one node: peer 1 to both, binary frames both
// ways in order, a newer socket of a side on a third node replaces the
// older (4000) and the other side hears peer 1 again, a side that closes
// gives the other peer 0, an erase through any node closes both with
// 1000; and kill -9 of a side's node gives the other side peer 0 within
// 2 s, after which a socket through another node pairs again.
func TestClusterSignalAcrossNodes(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"mailbox"}, clusterMailboxEnv...)
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "talk")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(0), ""), nil, ""), 201, "")

	p := mailboxConn(t, l, node(0), "/signal/primary", websocket.DefaultDialer)
	comp := mailboxConn(t, l, node(2), "/signal/companion", websocket.DefaultDialer)
	wantPeer(t, "primary on node 0", p, "peer 1")
	wantPeer(t, "companion on node 2", comp, "peer 1")
	for i := range 100 {
		if err := p.WriteMessage(websocket.BinaryMessage, fmt.Appendf(nil, "offer %d", i)); err != nil {
			t.Fatal(err)
		}
		if err := comp.WriteMessage(websocket.BinaryMessage, fmt.Appendf(nil, "answer %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		if typ, msg := readSignal(t, "companion's frames", comp); typ != websocket.BinaryMessage || !bytes.Equal(msg, fmt.Appendf(nil, "offer %d", i)) {
			t.Fatalf("companion's frame %d: %d %q", i, typ, msg)
		}
		if typ, msg := readSignal(t, "primary's frames", p); typ != websocket.BinaryMessage || !bytes.Equal(msg, fmt.Appendf(nil, "answer %d", i)) {
			t.Fatalf("primary's frame %d: %d %q", i, typ, msg)
		}
	}

	// A newer primary on node 1 replaces the one on node 0.
	p2 := mailboxConn(t, l, node(1), "/signal/primary", websocket.DefaultDialer)
	wantClose(t, "the older primary on node 0", p, 4000)
	wantPeer(t, "the newer primary on node 1", p2, "peer 1")
	wantPeer(t, "the companion, told again", comp, "peer 1")
	if err := comp.WriteMessage(websocket.BinaryMessage, []byte("to the newer")); err != nil {
		t.Fatal(err)
	}
	if _, msg := readSignal(t, "the newer primary's frame", p2); string(msg) != "to the newer" {
		t.Fatalf("the newer primary got %q", msg)
	}

	// The companion closes: the primary hears peer 0.
	_ = comp.Close()
	wantPeer(t, "the primary when the companion left", p2, "peer 0")

	// kill -9 of a companion's node: peer 0 within 2 s, then a companion
	// through node 0 pairs again.
	comp2 := mailboxConn(t, l, node(2), "/signal/companion", websocket.DefaultDialer)
	wantPeer(t, "the primary when a companion came back on node 2", p2, "peer 1")
	wantPeer(t, "the companion on node 2", comp2, "peer 1")
	killed := time.Now()
	c.nodes[2].kill()
	wantPeer(t, "the primary when the companion's node died", p2, "peer 0")
	if d := time.Since(killed); d > 2*time.Second {
		t.Fatalf("peer 0 %v after the companion's node died, want within 2 s", d)
	}
	comp3 := mailboxConn(t, l, node(0), "/signal/companion", websocket.DefaultDialer)
	wantPeer(t, "the primary when a companion joined through node 0", p2, "peer 1")
	wantPeer(t, "the companion on node 0", comp3, "peer 1")

	// An erase through node 0 closes both sides (nodes 0 and 1) with 1000;
	// it answers 503 while the mailbox's stream elects a leader in place
	// of node 2's, and a client retries.
	deadline := time.Now().Add(20 * time.Second)
	for {
		a := l.do(t, "DELETE", l.url(node(0), ""), nil, "")
		if a.code == http.StatusServiceUnavailable && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		wantAnswer(t, "erase on node 0", a, 204, "")
		break
	}
	wantClose(t, "the primary on node 1 after the erase", p2, 1000)
	wantClose(t, "the companion on node 0 after the erase", comp3, 1000)
}
