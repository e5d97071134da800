package agentroute

import (
	"context"
	"strings"
	"testing"

	"edgerelay/store/cluster"
	"edgerelay/store/cluster/clustertest"
)

type nopLink struct{}

func (nopLink) Offer([]byte) []byte { return nil }
func (nopLink) Detached([]byte)     {}
func (nopLink) Replaced()           {}
func (nopLink) Fenced()             {}

type nopClient struct{}

func (nopClient) Deliver([]byte) {}
func (nopClient) Overflowed()    {}
func (nopClient) Fenced()        {}

// TestRefresh: what a node missed on .ctl while its NATS connection was
// down (a link gone, a newer one) is read from the leases after the
// reconnect.
func TestRefresh(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := clustertest.Open(t, nodes, func(ctx context.Context, c *cluster.Cluster) (*Router, error) { return New(ctx, c, nil) })
	ctx := clustertest.Context(t)
	const inst, sess = "inst-r", "att-0123456789abcdef01234567"
	hold, err := rs[0].Link(ctx, inst, nopLink{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := rs[1].Attach(ctx, inst, sess, 64, nopClient{})
	if err != nil {
		t.Fatal(err)
	}
	i := a.(*attachment).i
	// The offline is missed: node 1 unsubscribes from .ctl for it.
	_ = i.sub.Unsubscribe()
	hold.Release()
	if !rs[1].remoteLink(i) {
		t.Fatal("node 1 heard the offline it should have missed")
	}
	rs[1].refresh()
	if rs[1].remoteLink(i) {
		t.Fatal("after a refresh, node 1 still takes the released link for online")
	}
	// A newer link, missed too.
	if _, err := rs[2].Link(ctx, inst, nopLink{}); err != nil {
		t.Fatal(err)
	}
	rs[1].refresh()
	if !rs[1].remoteLink(i) {
		t.Fatal("after a refresh, node 1 does not see the newer link")
	}
}

type detachLog struct {
	nopLink
	got []string
}

func (d *detachLog) Detached(s []byte) { d.got = append(d.got, string(s)) }

// TestDetachOnce: the link is told of each client's end once, however it
// learns of it (its node gone, a prune through this node or another), also
// of a client whose attach notice it missed; a client that said goodbye
// itself is not told of again.
func TestDetachOnce(t *testing.T) {
	d := &detachLog{}
	lh := &linkHold{l: d, clients: make(map[string]attEntry), ended: make(map[string]struct{})}
	lh.learn(attEntry{"att-a", "n1", "i1"})
	lh.learn(attEntry{"att-b", "n2", "i2"})
	lh.nodeGone("n1", "i1")
	lh.detached("att-a") // the prune of its slot, afterwards
	lh.detached("att-c") // never learnt (a missed notice)
	lh.detached("att-c")
	lh.forget("att-b") // its own acp.detach
	lh.detached("att-b")
	lh.nodeGone("n2", "i2")
	lh.learn(attEntry{"att-a", "n1", "i1"}) // a late notice
	lh.nodeGone("n1", "i1")
	if got := strings.Join(d.got, " "); got != "att-a att-c" {
		t.Fatalf("detached %q, want att-a and att-c once each", got)
	}
}
