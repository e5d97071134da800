package agentroute_test

import (
	"bytes"
	"testing"

	"edgerelay/fastpath/alloctest"
	"edgerelay/store/cluster/clustertest"
)

// countSink takes every line and only counts it (the test's sink copies
// each line, an allocation of the test's).
type countSink struct{ clustertest.Receiver }

func (s *countSink) Deliver(line []byte)      { s.Got(line) }
func (s *countSink) Offer(line []byte) []byte { s.Got(line); return nil }
func (s *countSink) Overflowed()              {}
func (s *countSink) Fenced()                  {}
func (s *countSink) Detached([]byte)          {}
func (s *countSink) Replaced()                {}

// TestAllocSend: a line sent across (a link's to a client's session on
// another node, a client's to the link) costs the process no more
// allocations than a raw core NATS message between the same two nodes,
// counted in the same run and in the same way (clustertest.RawHopAllocs):
// the subjects are made once, the line is copied into the connection's
// buffer, the receiving node hands nats.go's payload on.
func TestAllocSend(t *testing.T) {
	alloctest.SkipUnderRace(t)
	nodes, rs := routers(t)
	ctx := t.Context()
	var link, c countSink
	hold, err := rs[0].Link(ctx, inst, &link)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	a, err := rs[1].Attach(ctx, inst, session(1), 64, &c)
	if err != nil {
		t.Fatal(err)
	}
	line := bytes.Repeat([]byte("z"), 1<<10)
	sess := []byte(session(1))
	// The session's interest reaches node 0 a moment after the attach.
	clustertest.Warm(t, c.Seen, func() { hold.ToSession(sess, []byte("warm")) })
	for _, k := range []struct {
		name     string
		from, to int
		send     func()
		arrived  func() int64
	}{
		{"ToSession", 0, 1, func() { hold.ToSession(sess, line) }, c.Arrived},
		{"ToInstance", 1, 0, func() { a.ToInstance(line) }, link.Arrived},
	} {
		raw := clustertest.RawHopAllocs(t, nodes, k.from, k.to, line)
		n := clustertest.AllocsPerHop(t, k.send, k.arrived)
		t.Logf("%s across nodes: %.3f allocations per line, a raw message between the nodes %.3f", k.name, n, raw)
		if n > raw+clustertest.HopSlack {
			t.Errorf("%s across nodes: %.3f allocations per line, a raw message between the nodes %.3f", k.name, n, raw)
		}
	}
}
