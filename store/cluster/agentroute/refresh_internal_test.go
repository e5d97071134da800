package agentroute

import (
	"context"
	"testing"

	"edgerelay/store/cluster"
	"edgerelay/store/cluster/clustertest"
)

type nopLink struct{}

func (nopLink) Deliver([]byte)  {}
func (nopLink) Detached([]byte) {}
func (nopLink) Replaced()       {}

type nopClient struct{}

func (nopClient) Deliver([]byte) {}

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
