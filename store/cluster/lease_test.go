package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"edgerelay/store/cluster"
	"edgerelay/store/cluster/clustertest"
)

// TestLeases: an exclusive hold is refused while a live socket holds the
// key, on any node, and free once it is released or its node is gone; a
// replacing hold wins and names the holder it replaced, whose late
// release leaves the newer hold; of holds racing from every node, one
// exclusive wins.
func TestLeases(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ls := clustertest.Open(t, nodes, func(ctx context.Context, c *cluster.Cluster) (*cluster.Leases, error) {
		return c.Leases(ctx, "er_test_leases")
	})
	ctx := clustertest.Context(t)

	a, _, err := ls[0].Hold(ctx, "host.1", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, held, err := ls[1].Hold(ctx, "host.1", true); !errors.Is(err, cluster.ErrHeld) || held != a {
		t.Fatalf("a second exclusive hold through node 1: %v (holder %+v), want ErrHeld by %+v", err, held, a)
	}
	if h, ok, err := ls[2].Holder(ctx, "host.1"); err != nil || !ok || h != a {
		t.Fatalf("holder through node 2: %+v %v %v, want %+v", h, ok, err, a)
	}
	if err := ls[0].Release(ctx, "host.1", a); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ls[1].Holder(ctx, "host.1"); err != nil || ok {
		t.Fatalf("a released lease has a holder (%v)", err)
	}
	b, prev, err := ls[1].Hold(ctx, "host.1", true)
	if err != nil || prev != (cluster.Holder{}) || b.Node != nodes.Node(1).Node() || b.Gen != a.Gen+1 {
		t.Fatalf("exclusive hold after the release: %+v (prev %+v) %v; want node 1's, generation %d (a release keeps the generation)", b, prev, err, a.Gen+1)
	}

	// Replace: the newer wins and names the one it replaced.
	r1, _, err := ls[0].Hold(ctx, "link.1", false)
	if err != nil {
		t.Fatal(err)
	}
	r2, prev, err := ls[2].Hold(ctx, "link.1", false)
	if err != nil || prev != r1 || r2.Gen != r1.Gen+1 {
		t.Fatalf("replacing hold: %+v replaced %+v (%v), want it to replace %+v", r2, prev, err, r1)
	}
	if err := ls[0].Release(ctx, "link.1", r1); err != nil {
		t.Fatal(err)
	}
	if h, ok, _ := ls[1].Holder(ctx, "link.1"); !ok || h != r2 {
		t.Fatalf("after the replaced holder's late release: %+v %v, want %+v", h, ok, r2)
	}

	// Racing exclusive holds from every node: one wins.
	var wg sync.WaitGroup
	wins := make([]bool, 3)
	for i := range ls {
		wg.Go(func() {
			_, _, err := ls[i].Hold(ctx, "host.race", true)
			wins[i] = err == nil
			if err != nil && !errors.Is(err, cluster.ErrHeld) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	n := 0
	for _, w := range wins {
		if w {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d of 3 racing exclusive holds won, want 1", n)
	}

	// A holder whose node is gone frees the key.
	nodes.Stop(1) // b's node: it says goodbye
	// Freed at once by the goodbye; the read may wait for the bucket's
	// new leader if node 1 led it (an election: seconds).
	waitFor(t, 15*time.Second, "node 1's lease freed", func() error {
		if _, ok, err := ls[0].Holder(ctx, "host.1"); err != nil || ok {
			return fmt.Errorf("still held (%v)", err)
		}
		return nil
	})
	if c, prev, err := ls[2].Hold(ctx, "host.1", true); err != nil || prev != (cluster.Holder{}) || c.Gen != b.Gen+1 {
		t.Fatalf("exclusive hold of a gone node's key: %+v (prev %+v) %v", c, prev, err)
	}
}
