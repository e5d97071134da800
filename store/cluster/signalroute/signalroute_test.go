package signalroute_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"edgerelay/route"
	"edgerelay/route/routetest"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/cluster/signalroute"
)

func routers(t testing.TB, nodes *clustertest.Nodes) []*signalroute.Router {
	return clustertest.Open(t, nodes, func(_ context.Context, c *cluster.Cluster) (*signalroute.Router, error) {
		r := signalroute.New(c)
		t.Cleanup(func() { _ = r.Close() })
		return r, nil
	})
}

// TestClusterSignals runs the signal router contract with every side on
// its own node of three.
func TestClusterSignals(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	routetest.Signals(t, clustertest.As[route.Signals](routers(t, nodes)))
}

// TestClusterSignalsPeerNodeDies: the side left is told peer 0 within 2 s
// of the other side's node going, and a new socket of that side through
// another node pairs again.
func TestClusterSignalsPeerNodeDies(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	ctx := context.Background()
	const name = "chat/nodedies000001"
	var p, c, c2 routetest.Socket
	if _, err := rs[0].Join(ctx, name, 0, &p); err != nil {
		t.Fatal(err)
	}
	if _, err := rs[2].Join(ctx, name, 1, &c); err != nil {
		t.Fatal(err)
	}
	p.WaitEvents(t, "paired across nodes", "peer 1")
	stopped := time.Now()
	nodes.Stop(2)
	p.WaitEvents(t, "peer 0 when the companion's node goes", "peer 1", "peer 0")
	if d := time.Since(stopped); d > 2*time.Second {
		t.Fatalf("peer 0 after %v, want within 2 s", d)
	}
	cs, err := rs[1].Join(ctx, name, 1, &c2)
	if err != nil {
		t.Fatal(err)
	}
	p.WaitEvents(t, "paired again through node 1", "peer 1", "peer 0", "peer 1")
	// A frame is forwarded once its sender was told peer 1 (before,
	// it is dropped, as the spec says for an absent other side).
	c2.WaitEvents(t, "the new companion hears the primary", "peer 1")
	cs.Send([]byte("hello"))
	routetest.Eventually(t, "a frame through the new pair", func() error {
		if got := p.Frames(); len(got) != 1 || got[0] != "hello" {
			return fmt.Errorf("frames %q", got)
		}
		return nil
	})
}

// TestFenceClosesTheSidesHere: a fenced node closes every side joined on
// it as on a drain (GoingAway), and a side joined after the fence is
// left alone.
func TestFenceClosesTheSidesHere(t *testing.T) {
	nodes := clustertest.Start(t, 2)
	rs := routers(t, nodes)
	ctx := context.Background()
	var p, c, late routetest.Socket
	if _, err := rs[0].Join(ctx, "chat/fence00000001", 0, &p); err != nil {
		t.Fatal(err)
	}
	if _, err := rs[0].Join(ctx, "chat/fence00000002", 1, &c); err != nil {
		t.Fatal(err)
	}
	nodes.Fence(0, 1)
	p.WaitEvents(t, "a fenced side", "going away")
	c.WaitEvents(t, "another fenced side", "going away")
	if _, err := rs[0].Join(ctx, "chat/fence00000003", 0, &late); err != nil {
		t.Fatal(err)
	}
	var other routetest.Socket
	if _, err := rs[1].Join(ctx, "chat/fence00000003", 1, &other); err != nil {
		t.Fatal(err)
	}
	late.WaitEvents(t, "a side joined after the fence pairs and stays", "peer 1")
	if ev := c.Events(); len(ev) != 1 {
		t.Fatalf("a fenced side closed more than once: %q", ev)
	}
}
