package agentroute_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"edgerelay/route"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/agentroute"
	"edgerelay/store/cluster/clustertest"
)

// client is an attached client that hands its lines to the probe of
// the run in progress.
type client struct{ clustertest.Receiver }

func (c *client) Deliver(line []byte) { c.Got(line) }

// lineSize is a line's length in the benchmarks.
const lineSize = 1 << 10

// hop is how a line's hop is measured: a stream's lines in flight
// bounded to 1 MiB, within the subscriber's pending limits; a flood of
// the routes would also delay the cluster's own JetStream traffic
// (leases, attachments).
var hop = clustertest.Hop{Size: lineSize, Window: 1024, Unit: "cpu-ns/line"}

// warmLine is shorter than a measured line: no probe counts it.
var warmLine = []byte("warm")

// link links an instance of its own for this run through r, released at
// the run's end, with a context of 10 s from the run's start for the
// calls that follow: an Attach while an earlier run's Leave still writes
// the instance's attachment set can fail ("no write after 32 contended
// rounds"), which is not what the benchmarks measure. runs numbers the
// instances.
func link(b *testing.B, r *agentroute.Router, runs *int) (context.Context, string, route.AgentLinkHold) {
	*runs++
	inst := fmt.Sprintf("inst-bench-%06d", *runs)
	ctx := clustertest.Context(b)
	hold, err := r.Link(ctx, inst, &sink{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(hold.Release)
	return ctx, inst, hold
}

// BenchmarkAgentHop: 1 KiB lines from a link on node 0 to a client on node
// 1 through the route, beside a raw core NATS publish of the same bytes to
// a subscriber on node 1 (the floor). Each case runs "stream" (process
// CPU per line: both nodes and their embedded servers, the whole hop; and
// allocations) and "one-by-one" (the one-way latency p50/p99), see
// clustertest.Hop, rounds times alternated.
//
//	go test -run '^$' -bench 'AgentHop$/^[a-z-]+$/' -benchtime 20000x ./store/cluster/agentroute/
func BenchmarkAgentHop(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := clustertest.Open(b, nodes, func(ctx context.Context, c *cluster.Cluster) (*agentroute.Router, error) {
		return agentroute.New(ctx, c, nil)
	})
	sess := []byte(session(1))
	runs := 0
	line := make([]byte, lineSize)
	for range rounds {
		b.Run("route", func(b *testing.B) {
			ctx, inst, hold := link(b, rs[0], &runs)
			c := &client{}
			a, err := rs[1].Attach(ctx, inst, string(sess), 64, c)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Leave(nil)
			clustertest.Warm(b, c.Seen, func() { hold.ToSession(sess, warmLine) })
			hop.Run(b, &c.Receiver, func() { hold.ToSession(sess, line) })
		})
		b.Run("raw-nats", func(b *testing.B) {
			pub, subc := nodes.Node(0).Conn(), nodes.Node(1).Conn()
			c := &client{}
			sub, err := subc.Subscribe("bench.raw", func(m *nats.Msg) { c.Got(m.Data) })
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			clustertest.Warm(b, c.Seen, func() { _ = pub.Publish("bench.raw", warmLine) })
			hop.Run(b, &c.Receiver, func() { _ = pub.Publish("bench.raw", line) })
		})
	}
}

// rounds is how many times each benchmark here runs its cases, one after
// the other, so that rounds alternate the cases on a machine whose load
// drifts; go test names the repeats "#01", "#02", … and make bench selects
// the first ones with its -bench pattern (one per QUICK run).
const rounds = 5

// boundedClient is a client with a bounded send queue (see
// clustertest.Bounded), its handler detaching it at the bound.
type boundedClient struct{ clustertest.Bounded }

func (c *boundedClient) Deliver(line []byte) { c.Take(len(line)) }

// backpressure: the measured flow at 10,000 lines a second (10 MB/s), a
// small share of what one cross-node stream sustains here, so that it
// keeps its rate unless something else slows it; beside it, 10,000 a
// second fill a frozen client's queue in about 26 ms. The client's own
// queue on its node holds 64 lines more (Attach's bound).
var backpressure = clustertest.Backpressure{Size: lineSize, Rate: 10_000, BesideRate: 10_000, Slack: 64}

// BenchmarkAgentFrozenClient: back-pressure. The link on node 0 has two
// clients on node 1: it sends the measured one b.N 1 KiB lines paced at
// backpressure.Rate, and the other backpressure.BesideRate a second.
// "beside-reading": the other client reads; "beside-frozen": it stops
// reading as the run starts, fills its queue, is closed at its bound and
// detaches, while the link keeps sending to its session. Reported: the
// measured flow's achieved rate over its offered one (the goal:
// within 10%), and the frozen client's close (see
// clustertest.Backpressure).
//
//	go test -run '^$' -bench 'AgentFrozenClient$/^[a-z-]+$' -benchtime 20000x ./store/cluster/agentroute/
func BenchmarkAgentFrozenClient(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := clustertest.Open(b, nodes, func(ctx context.Context, c *cluster.Cluster) (*agentroute.Router, error) {
		return agentroute.New(ctx, c, nil)
	})
	line := make([]byte, lineSize)
	runs := 0
	for range rounds {
		for _, mode := range []string{"beside-reading", "beside-frozen"} {
			b.Run(mode, func(b *testing.B) {
				ctx, inst, hold := link(b, rs[0], &runs)
				flow, beside := []byte(session(1)), []byte(session(2))
				measured := &client{}
				a, err := rs[1].Attach(ctx, inst, string(flow), 64, measured)
				if err != nil {
					b.Fatal(err)
				}
				defer a.Leave(nil)
				other := &boundedClient{}
				oa, err := rs[1].Attach(ctx, inst, string(beside), 64, other)
				if err != nil {
					b.Fatal(err)
				}
				other.Leave = func() { oa.Leave(nil) }
				defer oa.Leave(nil)
				// The sessions' interest crosses to node 0's server; the
				// other client is handed its warm-up before it freezes.
				clustertest.Warm(b, measured.Seen, func() { hold.ToSession(flow, warmLine) })
				clustertest.Warm(b, func() bool { return other.Handed() > 0 }, func() { hold.ToSession(beside, warmLine) })
				backpressure.Run(b, mode == "beside-frozen", &measured.Receiver, func() { hold.ToSession(flow, line) },
					&other.Bounded, func() { hold.ToSession(beside, line) })
			})
		}
	}
}
