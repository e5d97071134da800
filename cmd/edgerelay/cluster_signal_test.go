package main

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/nats-io/nats.go"

	sdkmailbox "edgerelay/sdk/mailbox"
	"edgerelay/store/cluster/clustertest"
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

// startSignalCluster starts three nodes serving the mailbox (and the
// other services named) with clusterMailboxEnv, whose app talk has
// signal, and waits until each one is ready.
func startSignalCluster(t *testing.T, more ...string) *relayCluster {
	t.Helper()
	c := startRelayCluster(t, 3, append([]string{"mailbox"}, more...), clusterMailboxEnv...)
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	return c
}

// talkMailbox claims a fresh mailbox of app talk through node 0.
func talkMailbox(t *testing.T, c *relayCluster) clusterLink {
	t.Helper()
	l := newClusterLink(t, "talk")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(c.nodes[0].origin("mailbox"), ""), nil, ""), 201, "")
	return l
}

// signalPair opens l's primary side through primaryAt and its companion
// through companionAt (dialed with d) and waits until both hear peer 1.
func signalPair(t *testing.T, l clusterLink, primaryAt, companionAt string, d *websocket.Dialer) (p, comp *websocket.Conn) {
	t.Helper()
	p = mailboxConn(t, l, primaryAt, "/signal/primary", websocket.DefaultDialer)
	comp = mailboxConn(t, l, companionAt, "/signal/companion", d)
	wantPeer(t, "primary through "+primaryAt, p, "peer 1")
	wantPeer(t, "companion through "+companionAt, comp, "peer 1")
	return p, comp
}

// signalBothWays sends a binary frame from each side of a signal pair
// and checks the other side gets it as sent.
func signalBothWays(t *testing.T, what string, a, b *websocket.Conn) {
	t.Helper()
	for i, pair := range [][2]*websocket.Conn{{a, b}, {b, a}} {
		msg := fmt.Appendf(nil, "%s %d", what, i)
		if err := pair[0].WriteMessage(websocket.BinaryMessage, msg); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if typ, got := readSignal(t, what, pair[1]); typ != websocket.BinaryMessage || !bytes.Equal(got, msg) {
			t.Fatalf("%s: %d %q, want %q", what, typ, got, msg)
		}
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
	c := startSignalCluster(t)
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := talkMailbox(t, c)
	p, comp := signalPair(t, l, node(0), node(2), websocket.DefaultDialer)
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

// waitBeats waits until every other node's embedded server carries node
// i's beats (store/cluster/peers.go): from then on those nodes judge i by
// its silence, without the start-up grace for a node never heard.
func waitBeats(t *testing.T, c *relayCluster, i int) {
	t.Helper()
	for j := range c.nodes {
		if j == i {
			continue
		}
		nc, err := nats.Connect("nats://" + c.nats[j])
		if err != nil {
			t.Fatal(err)
		}
		clustertest.WaitBeat(t, nc, fmt.Sprintf("node%d ", i), 10*time.Second)
		nc.Close()
	}
}

// stall stops node i (SIGSTOP: the process and its embedded NATS server
// freeze, as in a long pause) until the returned resume is called, and
// resumes it at the test's end in any case.
func stall(t *testing.T, n *relayProc) (resume func()) {
	t.Helper()
	pid := n.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// wantFencedClose reads a signal socket on a fenced node until it closes
// (a peer notice may come first: its node judged the others while it
// came back) and checks the code is the drain's.
func wantFencedClose(t *testing.T, what string, c *websocket.Conn, within time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	for {
		typ, msg, err := c.ReadMessage()
		if err == nil {
			if typ == websocket.TextMessage && strings.HasPrefix(string(msg), "peer ") {
				continue
			}
			t.Fatalf("%s: frame %d %q, want the fence's close", what, typ, msg)
		}
		if code, _ := sdkmailbox.CloseCode(err); code != websocket.CloseGoingAway {
			t.Fatalf("%s: %v, want the fence's close (1001, as a drain)", what, err)
		}
		return
	}
}

// TestClusterSignalFence: a node stalled past the peers' silence (SIGSTOP)
// holds the companion's side: the primary on another node gets peer 0
// within 2 s; once the node runs again it fences itself and closes the
// companion's socket; the companion reconnecting through that node pairs
// again, and frames flow both ways.
func TestClusterSignalFence(t *testing.T) {
	t.Parallel()
	c := startSignalCluster(t)
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := talkMailbox(t, c)
	p, comp := signalPair(t, l, node(0), node(1), websocket.DefaultDialer)
	waitBeats(t, c, 1)

	stopped := time.Now()
	resume := stall(t, c.nodes[1])
	wantPeer(t, "the primary while the companion's node is stalled", p, "peer 0")
	if d := time.Since(stopped); d > 2*time.Second {
		t.Fatalf("peer 0 %v after the stall, want within 2 s", d)
	}
	resume()
	wantFencedClose(t, "the companion on the fenced node", comp, 5*time.Second)

	comp2 := mailboxConn(t, l, node(1), "/signal/companion", websocket.DefaultDialer)
	wantPeer(t, "the primary when the companion came back", p, "peer 1")
	wantPeer(t, "the companion through the fenced node", comp2, "peer 1")
	signalBothWays(t, "after the fence", p, comp2)
}

// signalNodes is, for each node, its open signal sockets (/metrics).
func signalNodes(t *testing.T, c *relayCluster) []int {
	t.Helper()
	return nodeGauges(t, c, signalSocketsSeries)
}

// sendFrames writes numbered binary frames to c every 5 ms until stop,
// then closes done (c's only writer meanwhile).
func sendFrames(c *websocket.Conn, prefix string, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		if c.WriteMessage(websocket.BinaryMessage, fmt.Appendf(nil, "%s %d", prefix, i)) != nil {
			return
		}
	}
}

// sideNode waits until the signal sockets per node are want in total
// and returns the node that got one since before (nil: none yet).
func sideNode(t *testing.T, c *relayCluster, before []int, want int) (int, []int) {
	t.Helper()
	var now []int
	ccWait(t, fmt.Sprintf("%d signal sockets in the cluster", want), 5*time.Second, func() bool {
		now = signalNodes(t, c)
		return now[0]+now[1]+now[2] == want
	})
	for i := range now {
		if before == nil && now[i] == 1 || before != nil && now[i] > before[i] {
			return i, now
		}
	}
	t.Fatalf("no node gained a signal socket: %v then %v", before, now)
	return -1, nil
}

// TestClusterSignalSIGKILL: both sides through HAProxy (round robin puts
// them on two nodes), frames flowing both ways; kill -9 of the
// companion's node gives the primary peer 0 within 2 s, and a companion
// reconnecting through the balancer pairs again, frames both ways.
func TestClusterSignalSIGKILL(t *testing.T) {
	t.Parallel()
	c := startSignalCluster(t)
	lb := startHAProxy(t, c, "mailbox")
	through := "http://" + lb.addrs["mailbox"]
	l := talkMailbox(t, c)
	p := mailboxConn(t, l, through, "/signal/primary", websocket.DefaultDialer)
	pNode, before := sideNode(t, c, nil, 1)
	comp := mailboxConn(t, l, through, "/signal/companion", websocket.DefaultDialer)
	cNode, _ := sideNode(t, c, before, 2)
	if cNode == pNode {
		t.Fatalf("both sides on node %d: the balancer is not round robin", pNode)
	}
	wantPeer(t, "primary through the balancer", p, "peer 1")
	wantPeer(t, "companion through the balancer", comp, "peer 1")
	waitBeats(t, c, cNode)

	stop := make(chan struct{})
	pDone, cDone := make(chan struct{}), make(chan struct{})
	go sendFrames(p, "from primary", stop, pDone)
	go sendFrames(comp, "from companion", stop, cDone)
	go func() { // the companion reads until its node dies
		for {
			if _, _, err := comp.ReadMessage(); err != nil {
				return
			}
		}
	}()
	frames := 0
	for frames < 20 {
		if typ, msg := readSignal(t, "the companion's frames", p); typ != websocket.BinaryMessage || !bytes.HasPrefix(msg, []byte("from companion ")) {
			t.Fatalf("the primary got %d %q, want the companion's frames", typ, msg)
		}
		frames++
	}
	killed := time.Now()
	c.nodes[cNode].kill()
	for {
		typ, msg := readSignal(t, "the primary when the companion's node died", p)
		if typ == websocket.BinaryMessage {
			continue // frames sent before the kill
		}
		if string(msg) != "peer 0" {
			t.Fatalf("the primary got %q, want peer 0", msg)
		}
		break
	}
	if d := time.Since(killed); d > 2*time.Second {
		t.Fatalf("peer 0 %v after the companion's node died, want within 2 s", d)
	}
	close(stop)
	<-pDone
	<-cDone

	// The balancer takes the dead node out within a second; until then a
	// dial may reach it and fail.
	var comp2 *websocket.Conn
	ccWait(t, "a companion through the balancer", 10*time.Second, func() bool {
		d := websocket.Dialer{Subprotocols: []string{sdkmailbox.Subprotocol}, HandshakeTimeout: 2 * time.Second}
		u := "ws" + strings.TrimPrefix(l.url(through, "/signal/companion"), "http")
		conn, _, err := d.Dial(u, http.Header{"Authorization": {"Bearer " + l.token}})
		comp2 = conn
		return err == nil
	})
	defer comp2.Close()
	wantPeer(t, "the primary when the companion came back", p, "peer 1")
	wantPeer(t, "the companion back through the balancer", comp2, "peer 1")
	signalBothWays(t, "after the kill", p, comp2)
}
