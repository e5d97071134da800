package clustertest

import "time"

// Fence makes node i fence itself as if node j had judged it gone by its
// silence and then heard it again: j sends the notice of
// store/cluster/peers.go on er.node.judged, "<i node> <i incarnation>
// <j node> <j incarnation>", and flushes it, so that the notice has left
// j when Fence returns. (Waiting for the fence's effects is the test's.)
func (c *Nodes) Fence(i, j int) {
	c.t.Helper()
	a, b := c.Node(i), c.Node(j)
	if a == nil || b == nil {
		c.t.Fatalf("clustertest: fence node %d by node %d: a node is stopped", i, j)
	}
	// Right after the start, node i's interest in er.node.* may not have
	// reached node j's server yet, and the notice would be lost: wait
	// until node i's server carries j's beats (the same interest's way).
	WaitBeat(c.t, a.Conn(), b.Node()+" "+b.Incarnation(), 10*time.Second)
	notice := a.Node() + " " + a.Incarnation() + " " + b.Node() + " " + b.Incarnation()
	if err := b.Conn().Publish("er.node.judged", []byte(notice)); err != nil {
		c.t.Fatalf("clustertest: fence node %d by node %d: %v", i, j, err)
	}
	if err := b.Conn().Flush(); err != nil {
		c.t.Fatalf("clustertest: fence node %d by node %d: flush: %v", i, j, err)
	}
}
