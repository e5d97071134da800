package agentroute_test

import (
	"bytes"
	"testing"

	"edgerelay/fastpath/alloctest"
	"edgerelay/store/cluster/clustertest"
)

// TestAllocSend: a line sent across (a link's to a client's session, a
// client's to the link) adds no allocation to a raw core NATS publish of
// the same bytes in steady state (clustertest.PublishAllocs, 1 per message
// here): the subjects are made once, the line is copied into the
// connection's buffer.
func TestAllocSend(t *testing.T) {
	alloctest.SkipUnderRace(t)
	nodes, rs := routers(t)
	ctx := t.Context()
	var link, c sink
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
	nobody := []byte(session(99))
	floor := clustertest.PublishAllocs(nodes, line)
	if n := testing.AllocsPerRun(2000, func() { hold.ToSession(nobody, line) }); n > floor {
		t.Fatalf("ToSession: %.2f allocations per line, a raw publish %.2f", n, floor)
	}
	// The link's node receives these (its handler's queue takes each line
	// from nats.go's Msg).
	if n := testing.AllocsPerRun(2000, func() { a.ToInstance(line) }); n > floor+1 {
		t.Fatalf("ToInstance with the link's node receiving: %.2f allocations per line, a raw publish %.2f", n, floor)
	} else {
		t.Logf("allocations per line: raw publish %.2f, ToInstance with the link's node receiving %.2f", floor, n)
	}
}
