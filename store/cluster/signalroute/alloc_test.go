package signalroute_test

import (
	"testing"

	"edgerelay/fastpath/alloctest"
	"edgerelay/store/cluster/clustertest"
)

// TestAllocCrossNodeFrame: a frame sent to a side on another node costs
// the process no more allocations than a raw core NATS message between the
// same two nodes, counted in the same run and in the same way
// (clustertest.RawHopAllocs), and one to a side on the same node allocates
// nothing at all.
func TestAllocCrossNodeFrame(t *testing.T) {
	alloctest.SkipUnderRace(t)
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	msg := make([]byte, frameSize)
	var from, to, sameFrom, sameTo counter
	cross, _ := pairT(t, "alloc/cross000000001", rs[0], rs[2], &from, &to)
	same, _ := pairT(t, "alloc/same0000000001", rs[0], rs[0], &sameFrom, &sameTo)
	raw := clustertest.RawHopAllocs(t, nodes, 0, 2, msg)
	n := clustertest.AllocsPerHop(t, func() { cross.Send(msg) }, to.Arrived)
	t.Logf("allocations per frame: cross-node Send %.3f, a raw message between the nodes %.3f", n, raw)
	if n > raw+clustertest.HopSlack {
		t.Errorf("cross-node Send: %.3f allocations per frame, a raw message between the nodes %.3f", n, raw)
	}
	if n := testing.AllocsPerRun(2000, func() { same.Send(msg) }); n != 0 {
		t.Fatalf("same-node Send: %.2f allocations per frame, want 0", n)
	}
}
