package agentroute_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/fastpath/ndjson"
	"edgerelay/route"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/agentroute"
	"edgerelay/store/cluster/clustertest"
)

// sink records what the route hands a link or a client.
type sink struct {
	mu       sync.Mutex
	lines    [][]byte
	detached []string
	replaced int
	block    chan struct{} // when set, Deliver waits for it (a test's stuck socket)
}

func (s *sink) Deliver(line []byte) {
	if s.block != nil {
		<-s.block
	}
	s.mu.Lock()
	s.lines = append(s.lines, bytes.Clone(line))
	s.mu.Unlock()
}

// Offer takes every line (a link whose queue is never full).
func (s *sink) Offer(line []byte) []byte {
	s.Deliver(line)
	return nil
}
func (s *sink) Overflowed() {}
func (s *sink) Fenced()     {}
func (s *sink) Detached(session []byte) {
	s.mu.Lock()
	s.detached = append(s.detached, string(session))
	s.mu.Unlock()
}
func (s *sink) Replaced() {
	s.mu.Lock()
	s.replaced++
	s.mu.Unlock()
}

func (s *sink) count() (lines, detached, replaced int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lines), len(s.detached), s.replaced
}

// waitFor polls cond until it holds or within ends.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reach waits until a line the link sends to session arrives at c, and
// forgets it: a subscription on one node is known on the others a moment
// after it is made (a runtime answers a client only after its first line,
// which travels behind the interest).
func reach(t *testing.T, hold route.AgentLinkHold, sess string, c *sink) {
	t.Helper()
	waitFor(t, 2*time.Second, "the session known across the nodes", func() bool {
		hold.ToSession([]byte(sess), []byte(`{"type":"probe"}`))
		n, _, _ := c.count()
		return n > 0
	})
	time.Sleep(50 * time.Millisecond) // probes still on their way
	c.mu.Lock()
	c.lines = nil
	c.mu.Unlock()
}

func routers(t *testing.T) (*clustertest.Nodes, []*agentroute.Router) {
	nodes := clustertest.Start(t, 3)
	rs := clustertest.Open(t, nodes, func(ctx context.Context, c *cluster.Cluster) (*agentroute.Router, error) {
		return agentroute.New(ctx, c, nil)
	})
	return nodes, rs
}

const inst = "inst-0123456789abcdef01234567"

func session(k int) string { return fmt.Sprintf("att-%024x", k) }

// TestAgentRouteFramesBothWays: a link on node 0 and clients on nodes 1 and
// 2: each client's lines reach the link and the link's lines reach the
// client its session names, byte for byte, up to the longest line (16 MiB,
// in chunks of max_payload); a session nobody holds, or one that is not a
// relay-minted id, reaches nobody; a client leaving sends its detach.
func TestAgentRouteFramesBothWays(t *testing.T) {
	_, rs := routers(t)
	ctx := clustertest.Context(t)
	var link, c1, c2 sink
	hold, err := rs[0].Link(ctx, inst, &link)
	if err != nil {
		t.Fatal(err)
	}
	a1, err := rs[1].Attach(ctx, inst, session(1), 64, &c1)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := rs[2].Attach(ctx, inst, session(2), 64, &c2)
	if err != nil {
		t.Fatal(err)
	}
	reach(t, hold, session(1), &c1)
	reach(t, hold, session(2), &c2)
	big := bytes.Repeat([]byte("x"), ndjson.MaxLine-1) // the longest line without its \n
	lines := [][]byte{[]byte(`{"type":"a","instance":"` + inst + `","session":"` + session(1) + `"}`), big[:5<<20], big}
	for _, l := range lines {
		if !a1.ToInstance(l) {
			t.Fatal("ToInstance with the link online on node 0: false")
		}
		if !hold.ToSession([]byte(session(1)), l) {
			t.Fatal("ToSession to a well-formed session: false")
		}
	}
	if !hold.ToSession([]byte(session(9)), lines[0]) {
		t.Fatal("ToSession to a session nobody holds: false, want sent (and dropped by NATS)")
	}
	if hold.ToSession([]byte("att-../x"), lines[0]) || hold.ToSession([]byte("att-0123456789abcdef0123456"), lines[0]) {
		t.Fatal("ToSession to a session that is not a relay-minted id was sent")
	}
	if !hold.ToSession([]byte(session(2)), lines[0]) {
		t.Fatal("ToSession to session 2: false")
	}
	// Another instance's link naming client 1's session reaches nobody.
	var other sink
	oh, err := rs[2].Link(ctx, "inst-other", &other)
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Release()
	oh.ToSession([]byte(session(1)), []byte(`{"type":"not-yours"}`))
	waitFor(t, 10*time.Second, "every line at the link and at client 1", func() bool {
		n, _, _ := link.count()
		m, _, _ := c1.count()
		return n == len(lines) && m == len(lines)
	})
	waitFor(t, 2*time.Second, "one line at client 2", func() bool { n, _, _ := c2.count(); return n == 1 })
	for k, l := range lines {
		if !bytes.Equal(link.lines[k], l) || !bytes.Equal(c1.lines[k], l) {
			t.Fatalf("line %d (%d bytes) changed on its way: %d and %d bytes arrived", k, len(l), len(link.lines[k]), len(c1.lines[k]))
		}
	}
	if !bytes.Equal(c2.lines[0], lines[0]) {
		t.Fatalf("client 2 got %q", c2.lines[0])
	}
	if n, _, _ := c1.count(); n != len(lines) {
		t.Fatalf("client 1 got %d lines, want %d (another instance's reached it)", n, len(lines))
	}

	detach := []byte(`{"type":"acp.detach","instance":"` + inst + `","session":"` + session(2) + `"}`)
	a2.Leave(detach)
	a2.Leave(detach) // once only
	waitFor(t, 2*time.Second, "the detach at the link", func() bool { n, _, _ := link.count(); return n == len(lines)+1 })
	time.Sleep(100 * time.Millisecond) // a second detach would have come by now
	if n, _, _ := link.count(); n != len(lines)+1 || !bytes.Equal(link.lines[len(lines)], detach) {
		t.Fatalf("link got %d lines, want %d ending in the detach", n, len(lines)+1)
	}

	hold.Release()
	waitFor(t, 2*time.Second, "client 1 sees the instance offline", func() bool { return !a1.ToInstance(lines[0]) })
	// The runtime redials another node: a newer link than the one gone,
	// though the lease was given back in between.
	var again sink
	h2, err := rs[2].Link(ctx, inst, &again)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Release()
	waitFor(t, 2*time.Second, "client 1's line at the redialled link", func() bool {
		a1.ToInstance(lines[0])
		n, _, _ := again.count()
		return n > 0
	})
}

// TestAgentRouteNewerLinkWins: a second link on another node replaces the
// first, which hears it; clients' lines go to the newer; the older's late
// release leaves the instance online. A link on the client's own node is
// not remote: the handler routes to it itself.
func TestAgentRouteNewerLinkWins(t *testing.T) {
	_, rs := routers(t)
	ctx := clustertest.Context(t)
	var old, cur, c sink
	h0, err := rs[0].Link(ctx, inst, &old)
	if err != nil {
		t.Fatal(err)
	}
	a, err := rs[1].Attach(ctx, inst, session(1), 64, &c)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := rs[2].Link(ctx, inst, &cur)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the older link replaced", func() bool { _, _, r := old.count(); return r == 1 })
	h0.Release()
	line := []byte(`{"type":"x"}`)
	waitFor(t, 2*time.Second, "a line at the newer link", func() bool {
		a.ToInstance(line)
		n, _, _ := cur.count()
		return n > 0
	})
	if n, _, _ := old.count(); n != 0 {
		t.Fatalf("the replaced link got %d lines", n)
	}
	if _, _, r := cur.count(); r != 0 {
		t.Fatal("the newer link was replaced")
	}
	h2.Release()
	var here sink
	h1, err := rs[1].Link(ctx, inst, &here)
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Release()
	if a.ToInstance(line) {
		t.Fatal("ToInstance with the link on the client's own node: true")
	}
}

// TestAgentRouteAttachLimit: the limit holds over the nodes, with no link
// at all, exactly: the 4th of 3 is refused on any node, and a slot given
// back is free again.
func TestAgentRouteAttachLimit(t *testing.T) {
	_, rs := routers(t)
	ctx := clustertest.Context(t)
	var c sink
	var atts []route.AgentAttachment
	for k := range 3 {
		a, err := rs[k].Attach(ctx, inst, session(k), 3, &c)
		if err != nil {
			t.Fatalf("attachment %d of 3: %v", k, err)
		}
		atts = append(atts, a)
	}
	for k := range 3 {
		if _, err := rs[k].Attach(ctx, inst, session(10+k), 3, &c); !errors.Is(err, route.ErrAgentFull) {
			t.Fatalf("a 4th attachment of 3 through node %d: %v, want ErrAgentFull", k, err)
		}
	}
	atts[1].Leave(nil)
	waitFor(t, 5*time.Second, "the slot given back", func() bool {
		a, err := rs[2].Attach(ctx, inst, session(20), 3, &c)
		if err == nil {
			atts = append(atts, a)
		}
		return err == nil
	})
	if _, err := rs[0].Attach(ctx, inst, session(21), 3, &c); !errors.Is(err, route.ErrAgentFull) {
		t.Fatalf("one past the limit again: %v", err)
	}
	if _, err := rs[0].Attach(ctx, "inst.x", session(22), 3, &c); err == nil {
		t.Fatal("an instance id that is not subject-safe was attached")
	}
}

// TestAgentRouteClientNodeDies: the link's node tells the link that each
// client of a node that died has gone (acp.detach), within 2 s, and that
// node's slots are free again; clients elsewhere stay.
func TestAgentRouteClientNodeDies(t *testing.T) {
	nodes, rs := routers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var link, c sink
	hold, err := rs[0].Link(ctx, inst, &link)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	for k, r := range []int{1, 1, 2} {
		if _, err := rs[r].Attach(ctx, inst, session(k), 3, &c); err != nil {
			t.Fatal(err)
		}
	}
	nodes.Stop(1)
	start := time.Now()
	waitFor(t, 3*time.Second, "two detaches at the link", func() bool { _, d, _ := link.count(); return d == 2 })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("detached after %v, want within 2 s", d)
	}
	link.mu.Lock()
	got := fmt.Sprint(link.detached)
	link.mu.Unlock()
	if got != fmt.Sprint([]string{session(0), session(1)}) && got != fmt.Sprint([]string{session(1), session(0)}) {
		t.Fatalf("detached %s, want node 1's two sessions", got)
	}
	// The bucket may be electing a new leader (node 1's server led it).
	for k := range 2 {
		waitFor(t, 15*time.Second, "a slot of the dead node", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := rs[2].Attach(ctx, inst, session(10+k), 3, &c)
			if errors.Is(err, route.ErrAgentFull) {
				t.Fatalf("a slot of the dead node: %v", err)
			}
			return err == nil
		})
	}
	if _, d, _ := link.count(); d != 2 {
		t.Fatalf("%d detaches, want 2", d)
	}
}

// TestAgentRouteLinkNodeDies: clients elsewhere see the instance offline
// within 2 s of its link's node dying, and online again once the runtime
// redials another node.
func TestAgentRouteLinkNodeDies(t *testing.T) {
	nodes, rs := routers(t)
	ctx := clustertest.Context(t)
	var link, c sink
	if _, err := rs[0].Link(ctx, inst, &link); err != nil {
		t.Fatal(err)
	}
	a, err := rs[1].Attach(ctx, inst, session(1), 64, &c)
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(`{"type":"x"}`)
	if !a.ToInstance(line) {
		t.Fatal("ToInstance with the link online: false")
	}
	nodes.Stop(0)
	start := time.Now()
	waitFor(t, 3*time.Second, "the instance offline", func() bool { return !a.ToInstance(line) })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("offline after %v, want within 2 s", d)
	}
	// The runtime redials node 2, as often as it takes: the bucket may be
	// electing a new leader (node 0's server led it).
	var again sink
	var h route.AgentLinkHold
	waitFor(t, 15*time.Second, "a link on node 2", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h, err = rs[2].Link(ctx, inst, &again)
		return err == nil
	})
	defer h.Release()
	waitFor(t, 2*time.Second, "a line at the redialled link", func() bool {
		a.ToInstance(line)
		n, _, _ := again.count()
		return n > 0
	})
}

// TestAgentRouteStuckClient: a client whose delivery is stuck holds up
// nothing else: another client on the same node keeps getting the link's
// lines.
func TestAgentRouteStuckClient(t *testing.T) {
	_, rs := routers(t)
	ctx := clustertest.Context(t)
	var link, ok sink
	stuck := sink{block: make(chan struct{})}
	defer close(stuck.block)
	hold, err := rs[0].Link(ctx, inst, &link)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	if _, err := rs[1].Attach(ctx, inst, session(1), 64, &stuck); err != nil {
		t.Fatal(err)
	}
	if _, err := rs[1].Attach(ctx, inst, session(2), 64, &ok); err != nil {
		t.Fatal(err)
	}
	reach(t, hold, session(2), &ok)
	line := bytes.Repeat([]byte("y"), 1000)
	for range 1000 {
		hold.ToSession([]byte(session(1)), line)
		hold.ToSession([]byte(session(2)), line)
	}
	waitFor(t, 5*time.Second, "every line at the client that reads", func() bool { n, _, _ := ok.count(); return n == 1000 })
}

// flowLink is a link whose queue is full while full is set.
type flowLink struct {
	sink
	full atomic.Bool
}

func (f *flowLink) Offer(line []byte) []byte {
	if f.full.Load() {
		// Its sender holds the most.
		f, _ := ndjson.Scan(line)
		return f.Session.Raw(line)
	}
	f.Deliver(line)
	return nil
}

// overflowClient counts Overflowed calls.
type overflowClient struct {
	sink
	overflowed atomic.Int32
}

func (c *overflowClient) Overflowed() { c.overflowed.Add(1) }

// TestAgentRouteClientOverflowsLink: a client's line that does not fit the
// queue of the link on another node closes that client (Overflowed on its
// node) and tells the runtime acp.detach at once; its lines still in
// flight are dropped, its own acp.detach is not sent twice, and another
// client's lines flow on.
func TestAgentRouteClientOverflowsLink(t *testing.T) {
	_, rs := routers(t)
	ctx := clustertest.Context(t)
	var link flowLink
	var flooder, calm overflowClient
	hold, err := rs[0].Link(ctx, inst, &link)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	af, err := rs[1].Attach(ctx, inst, session(1), 64, &flooder)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := rs[1].Attach(ctx, inst, session(2), 64, &calm)
	if err != nil {
		t.Fatal(err)
	}
	reach(t, hold, session(1), &flooder.sink)
	line := func(sess, what string) []byte {
		return []byte(`{"type":"` + what + `","instance":"` + inst + `","session":"` + sess + `"}`)
	}
	has := func(what string) bool {
		link.mu.Lock()
		defer link.mu.Unlock()
		for _, l := range link.lines {
			if bytes.Contains(l, []byte(`"type":"`+what+`"`)) {
				return true
			}
		}
		return false
	}
	waitFor(t, 2*time.Second, "a line of the calm client at the link", func() bool {
		ac.ToInstance(line(session(2), "hello"))
		return has("hello")
	})
	// Every hello still on its way is in before this one (one connection).
	ac.ToInstance(line(session(2), "sync"))
	waitFor(t, 2*time.Second, "the calm client's lines so far at the link", func() bool { return has("sync") })

	link.full.Store(true)
	if !af.ToInstance(line(session(1), "flood")) {
		t.Fatal("ToInstance with the link online: false")
	}
	waitFor(t, 2*time.Second, "the flooder closed on its node", func() bool { return flooder.overflowed.Load() == 1 })
	if _, detached, _ := link.count(); detached != 1 || link.detached[0] != session(1) {
		t.Fatalf("the link was told of %v, want the flooder's session once", link.detached)
	}
	if calm.overflowed.Load() != 0 {
		t.Fatal("the calm client was closed")
	}
	// Room again: the flooder's line still in flight is dropped, the calm
	// client's arrives (one connection keeps their order).
	link.full.Store(false)
	af.ToInstance(line(session(1), "late"))
	ac.ToInstance(line(session(2), "after"))
	waitFor(t, 2*time.Second, "the calm client's line after the overflow", func() bool { return has("after") })
	if has("late") || has("flood") {
		t.Fatal("a line of the closed flooder reached the link")
	}
	// Its handler detaches it: the slot goes, no second acp.detach.
	af.Leave(line(session(1), "acp.detach"))
	ac.ToInstance(line(session(2), "last"))
	waitFor(t, 2*time.Second, "the calm client's last line", func() bool { return has("last") })
	if has("acp.detach") {
		t.Fatal("the flooder's own acp.detach reached the link after it was told")
	}
	if _, detached, _ := link.count(); detached != 1 {
		t.Fatalf("the link was told of %v", link.detached)
	}
	if af.ToInstance(line(session(1), "gone")) {
		t.Fatal("ToInstance after Leave: true")
	}
}
