package channelroute_test

import (
	"testing"

	"edgerelay/fastpath/alloctest"
	"edgerelay/store/cluster/clustertest"
)

// TestAllocCrossNodeFrame: a phone's frame to its computer on another
// node, and the computer's frame to that phone, cost the process no more
// allocations than a raw core NATS message between the same two nodes
// (clustertest.RawHopAllocs, counted in the same run and in the same way:
// the wrap into a data message goes to a pooled buffer, the receipt hands
// nats.go's payload on); the same frames between a phone and its computer
// on one node allocate nothing.
func TestAllocCrossNodeFrame(t *testing.T) {
	alloctest.SkipUnderRace(t)
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	key, h, ctl := computer(t, rs[0])
	awaySink := &probeSink{}
	away, awayID := phoneOf(t, rs[1], key, awaySink)
	here, hereID := phoneOf(t, rs[0], key, &probeSink{})
	for _, c := range []struct {
		name     string
		from, to int
		send     func()
		arrived  func() int64
	}{
		{"phone to computer", 1, 0, func() { _ = away.ToHost(frame) }, ctl.Arrived},
		{"computer to phone", 0, 1, func() { h.ToPhone(&awayID, frame) }, awaySink.Arrived},
	} {
		raw := clustertest.RawHopAllocs(t, nodes, c.from, c.to, frame)
		n := clustertest.AllocsPerHop(t, c.send, c.arrived)
		t.Logf("cross-node %s: %.3f allocations per frame, a raw message between the nodes %.3f", c.name, n, raw)
		if n > raw+clustertest.HopSlack {
			t.Errorf("cross-node %s: %.3f allocations per frame, a raw message between the nodes %.3f", c.name, n, raw)
		}
	}
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"same-node phone to computer", func() { _ = here.ToHost(frame) }},
		{"same-node computer to phone", func() { h.ToPhone(&hereID, frame) }},
	} {
		if n := testing.AllocsPerRun(2000, c.f); n != 0 {
			t.Errorf("%s: %.2f allocations per frame, want 0", c.name, n)
		}
	}
}
