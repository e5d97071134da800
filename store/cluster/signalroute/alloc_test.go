package signalroute_test

import (
	"testing"

	"edgerelay/fastpath/alloctest"
	"edgerelay/store/cluster/clustertest"
)

// TestAllocCrossNodeFrame: a frame sent to a side on another node adds no
// allocation to a raw core NATS publish of the same bytes in steady state
// but the receipt's (clustertest.PublishAllocs, Received), and one to a
// side on the same node allocates nothing at all.
func TestAllocCrossNodeFrame(t *testing.T) {
	alloctest.SkipUnderRace(t)
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	msg := make([]byte, frameSize)
	var from, to, sameFrom, sameTo counter
	cross, _ := pairT(t, "alloc/cross000000001", rs[0], rs[2], &from, &to)
	same, _ := pairT(t, "alloc/same0000000001", rs[0], rs[0], &sameFrom, &sameTo)
	floor := clustertest.PublishAllocs(nodes, msg)
	if n := testing.AllocsPerRun(2000, func() { cross.Send(msg) }); n > floor+clustertest.Received {
		t.Fatalf("cross-node Send: %.2f allocations per frame, a raw publish %.2f (+%d for the receiver's Msg and payload)", n, floor, clustertest.Received)
	} else {
		t.Logf("allocations per frame: raw publish %.2f, cross-node Send with node 2 receiving %.2f", floor, n)
	}
	if n := testing.AllocsPerRun(2000, func() { same.Send(msg) }); n != 0 {
		t.Fatalf("same-node Send: %.2f allocations per frame, want 0", n)
	}
}
