package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

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

// TestRemoteLinesLeaveTheReserve: lines from clients on other nodes for a
// runtime that stopped reading fill the link's queue up to its bound and
// are dropped past it, never into the reserve kept for the relay's own
// frames: a heartbeat sent meanwhile is still acked and the link lives
// (with the reserve taken, the ack found the queue full and the link was
// dropped as overflowing).
func TestRemoteLinesLeaveTheReserve(t *testing.T) {
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
	var l route.AgentLink
	select {
	case l = <-c.links:
	case <-time.After(5 * time.Second):
		t.Fatal("the link was not given to the route")
	}
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
