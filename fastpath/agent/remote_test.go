package agent_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/fastpath/alloctest"
	"edgerelay/route"
)

// catcher is the single node's route, but it hands the test each link the
// handler gives it, and tells it of every line the link could not route
// here.
type catcher struct {
	route.AgentLocal
	links  chan route.AgentLink
	missed chan string
}

func (c *catcher) Link(ctx context.Context, inst string, l route.AgentLink) (route.AgentLinkHold, error) {
	c.links <- l
	return catcherHold{c}, nil
}

type catcherHold struct{ c *catcher }

func (h catcherHold) ToSession(session, _ []byte) bool {
	select {
	case h.c.missed <- string(session):
	default:
	}
	return false
}
func (catcherHold) Release() {}

// remoteLinkOf is a raw link through the catcher route, welcomed, and the
// link as the route sees it; the runtime reads nothing unless the test
// does.
func remoteLinkOf(t *testing.T) (*catcher, paired, net.Conn, *bufio.Reader, route.AgentLink) {
	t.Helper()
	c := &catcher{links: make(chan route.AgentLink, 1), missed: make(chan string, 1)}
	r := startRelay(t, relayOpts{route: c, heartbeatEvery: time.Hour})
	r.account("acme")
	p := r.pair("acme", "host-1")
	conn, br := r.rawLink(p.token)
	if _, err := conn.Write([]byte(rawHello(p.id))); err != nil {
		t.Fatal(err)
	}
	if w, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(w, `{"type":"relay.welcome"`) {
		t.Fatalf("welcome %q %v", w, err)
	}
	select {
	case l := <-c.links:
		return c, p, conn, br, l
	case <-time.After(5 * time.Second):
		t.Fatal("the link was not given to the route")
		return nil, paired{}, nil, nil, nil
	}
}

// TestRemoteLinesLeaveTheReserve: lines from clients on other nodes for a
// runtime that stopped reading fill the link's queue up to its bound and
// are dropped past it, never into the reserve kept for the relay's own
// frames: a heartbeat sent meanwhile is still acked and the link lives
// (with the reserve taken, the ack found the queue full and the link was
// dropped as overflowing).
func TestRemoteLinesLeaveTheReserve(t *testing.T) {
	c, p, conn, br, l := remoteLinkOf(t)
	// 64 MiB from other nodes, more than the link's queue (32 MiB) and
	// the socket buffers hold while the runtime reads nothing, then small
	// lines, which would fill the reserve to its last bytes (a 1 MiB line
	// never fits into its 64 KiB).
	line := []byte(`{"type":"acp.message","pad":"` + strings.Repeat("r", 1<<20) + `"}`)
	for range 64 {
		l.Offer(line) // never waits
	}
	small := []byte(`{"type":"s"}`)
	for range 16 << 10 {
		l.Offer(small)
	}
	// The heartbeat, then a line for a session nobody holds here: when
	// the route hears of the second, the relay has handled the first.
	hb := `{"type":"relay.heartbeat","instance":"` + p.id + `","id":"hb"}` + "\n"
	miss := `{"type":"x","instance":"` + p.id + `","session":"att-none"}` + "\n"
	if _, err := conn.Write([]byte(hb + miss)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.missed:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not read the runtime's lines")
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		got, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the link ended before the heartbeat's ack: %v", err)
		}
		if strings.HasPrefix(got, `{"type":"relay.ack"`) && strings.Contains(got, `"re":"hb"`) {
			break
		}
	}
}

// TestRemoteCollisionClosesTheBiggest: when a line from a client on
// another node finds the link's queue full (the runtime stopped reading),
// the client to close is the one whose lines hold the most of it: the
// flooder, for its own line and for a calm client's small line colliding
// with it, which is queued (the runtime reads it once it reads again); a
// calm line too big for the room kept for such collisions closes its own
// sender, which cannot wait.
func TestRemoteCollisionClosesTheBiggest(t *testing.T) {
	_, p, conn, br, l := remoteLinkOf(t)
	const flooder, calm = "att-000000000000000000000001", "att-000000000000000000000002"
	line := func(sess, typ string, pad int) []byte {
		return []byte(`{"type":"` + typ + `","instance":"` + p.id + `","session":"` + sess + `","pad":"` + strings.Repeat("p", pad) + `"}`)
	}
	// A calm line first, written long before the queue fills.
	if got := l.Offer(line(calm, "early", 10)); got != nil {
		t.Fatalf("the first line: close %s", got)
	}
	// The flood to the bound's last few KiB: 1 MiB lines, then 4 KiB ones
	// (256 MiB of them: far more than the queue and the socket buffers
	// hold).
	for _, size := range []int{1 << 20, 4 << 10} {
		flood, full := line(flooder, "flood", size), false
		for range (256 << 20) / size {
			if got := l.Offer(flood); got != nil {
				if string(got) != flooder {
					t.Fatalf("the flooder's line did not fit: close %s, want the flooder", got)
				}
				full = true
				break
			}
		}
		if !full {
			t.Fatal("the flooder's lines never filled the link's queue")
		}
	}
	if got := l.Offer(line(calm, "collide", 8<<10)); string(got) != flooder {
		t.Fatalf("a calm client's small line colliding with the flooder: close %q, want the flooder", got)
	}
	if got := l.Offer(line(calm, "huge", 128<<10)); string(got) != calm {
		t.Fatalf("a calm line past the collision room: close %q, want its sender", got)
	}
	// The runtime reads again: the colliding line is there, after the
	// flood queued before it; the huge one is not.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		got, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the link ended before the colliding line: %v", err)
		}
		if strings.Contains(got, `"type":"huge"`) {
			t.Fatal("the line past the collision room was queued")
		}
		if strings.Contains(got, `"type":"collide"`) {
			break
		}
	}
}

// TestRemoteOfferAllocatesNothing: a line from a client on another node
// costs no allocation in steady state, its sender's share of the queue
// counted (two clients alternating, so that every line starts a run).
func TestRemoteOfferAllocatesNothing(t *testing.T) {
	alloctest.SkipUnderRace(t)
	_, p, _, br, l := remoteLinkOf(t)
	go func() { _, _ = io.Copy(io.Discard, br) }() // the runtime reads
	lines := [2][]byte{}
	for k, sess := range []string{"att-000000000000000000000001", "att-000000000000000000000002"} {
		lines[k] = []byte(`{"type":"m","instance":"` + p.id + `","session":"` + sess + `","payload":"` + strings.Repeat("x", 1000) + `"}`)
	}
	k := 0
	offer := func() {
		if got := l.Offer(lines[k%2]); got != nil {
			t.Fatalf("close %s with the runtime reading", got)
		}
		k++
	}
	for range 1000 {
		offer()
	}
	if n := testing.AllocsPerRun(2000, offer); n > 0 {
		t.Fatalf("Offer: %.2f allocations per line", n)
	}
}

// clientCatcher is the single node's route, but it hands the test each
// client the handler attaches, as the route sees it, and counts the
// attachments that left.
type clientCatcher struct {
	route.AgentLocal
	clients chan route.AgentClient
	left    atomic.Int32
}

func (c *clientCatcher) Attach(_ context.Context, _, _ string, _ int, cl route.AgentClient) (route.AgentAttachment, error) {
	c.clients <- cl
	return leaving{c}, nil
}

type leaving struct{ c *clientCatcher }

func (leaving) ToInstance([]byte) bool { return false }
func (l leaving) Leave([]byte)         { l.c.left.Add(1) }

// TestRemoteDeliveriesCloseEachClientOnce: lines of a link on another
// node reach this node's clients on one goroutine per client (a NATS
// subscription each). When they reach the instance's budget together,
// each client closed for it is closed and counted once: the closes counted
// are the attachments that left (with overflows judged side by side, two
// goroutines picked the same slowest client and counted it twice; seen in
// the cluster test as "2 clients closed for the instance's bound").
func TestRemoteDeliveriesCloseEachClientOnce(t *testing.T) {
	const clients = 8
	c := &clientCatcher{clients: make(chan route.AgentClient, clients)}
	r := startRelay(t, relayOpts{route: c, clientQueue: 256 << 10, instanceQueue: 1, heartbeatEvery: time.Hour})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	var remote []route.AgentClient
	for range clients {
		r.attach(p.id, ctok) // reads nothing
		select {
		case cl := <-c.clients:
			remote = append(remote, cl)
		case <-time.After(10 * time.Second):
			t.Fatal("the attachment was not given to the route")
		}
	}
	line := []byte(`{"type":"acp.message","instance":"` + p.id + `","session":"s","pad":"` + strings.Repeat("p", 64<<10) + `"}`)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, cl := range remote {
		wg.Go(func() {
			<-start
			for range 400 { // 25 MiB each: far past the budget and the socket buffers
				cl.Deliver(line)
			}
		})
	}
	close(start)
	wg.Wait()
	closed := r.counter("edgerelay_agent_slow_clients_closed_total", "instance") + r.counter("edgerelay_agent_slow_clients_closed_total", "client")
	if left := c.left.Load(); closed != float64(left) || left == 0 {
		t.Fatalf("%v slow clients counted closed, %d attachments left", closed, left)
	}
}

// slowHold is the single node's route, but Link returns only once the
// test says so, as a cluster's does after its lease write; it offers a
// line from "another node" to the link before returning.
type slowHold struct {
	route.AgentLocal
	linking chan route.AgentLink
	release chan struct{}
	line    []byte
}

func (s *slowHold) Link(ctx context.Context, inst string, l route.AgentLink) (route.AgentLinkHold, error) {
	s.linking <- l
	<-s.release
	l.Offer(s.line)
	return s.AgentLocal.Link(ctx, inst, l)
}

// TestWelcomeAfterTheRouteHoldsTheLink: the runtime hears its welcome only
// once the route holds the link (a client attaching through another node
// after the welcome then finds the instance online there; with the welcome
// written first, such a client's first request was answered
// unknown_instance), and a line the route hands the link meanwhile comes
// after the welcome.
func TestWelcomeAfterTheRouteHoldsTheLink(t *testing.T) {
	s := &slowHold{linking: make(chan route.AgentLink, 1), release: make(chan struct{})}
	r := startRelay(t, relayOpts{route: s, heartbeatEvery: time.Hour})
	r.account("acme")
	p := r.pair("acme", "host-1")
	s.line = []byte(`{"type":"acp.message","instance":"` + p.id + `","session":"att-000000000000000000000001","id":"from-afar"}`)
	conn, br := r.rawLink(p.token)
	if _, err := conn.Write([]byte(rawHello(p.id))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.linking:
	case <-time.After(10 * time.Second):
		t.Fatal("the link was not given to the route")
	}
	// The route is still taking the link: the runtime must hear nothing
	// yet (the welcome came at once, before the route held the link).
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := br.ReadString('\n'); err == nil {
		t.Fatalf("the runtime got %.120q before the route held the link", got)
	}
	close(s.release)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for _, want := range []string{`{"type":"relay.welcome"`, `{"type":"acp.message"`} {
		got, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(got, want) {
			t.Fatalf("got %.120q %v, want %s", got, err, want)
		}
	}
}

// failingLink is a route whose store does not answer when a link is taken.
type failingLink struct{ route.AgentLocal }

func (failingLink) Link(context.Context, string, route.AgentLink) (route.AgentLinkHold, error) {
	return nil, errors.New("store: storage unavailable")
}

// TestNoWelcomeWhenTheRouteFails: a link the route cannot take ends with
// no welcome, as when the store does not answer the instance lookup, so
// the runtime redials (a welcome and then a close read as a link that
// worked and died at once).
func TestNoWelcomeWhenTheRouteFails(t *testing.T) {
	r := startRelay(t, relayOpts{route: failingLink{}, heartbeatEvery: time.Hour})
	r.account("acme")
	p := r.pair("acme", "host-1")
	conn, br := r.rawLink(p.token)
	if _, err := conn.Write([]byte(rawHello(p.id))); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := br.ReadString('\n'); err != io.EOF {
		t.Fatalf("got %.120q %v, want the connection's end", got, err)
	}
	if n := r.counter("edgerelay_agent_handshakes_total", "store_unavailable"); n != 1 {
		t.Fatalf("%v handshakes counted store_unavailable", n)
	}
	if n := r.counter("edgerelay_agent_handshakes_total", "welcome"); n != 0 {
		t.Fatalf("%v handshakes counted welcome", n)
	}
}
