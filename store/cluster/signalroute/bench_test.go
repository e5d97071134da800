package signalroute_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/route"
	"edgerelay/store/cluster/clustertest"
)

// frameSize is a signal frame's length in the benchmarks (an SDP-sized
// sealed signal is a few hundred bytes).
const frameSize = 200

// counter is a signal socket that hands its frames to the probe of the
// run in progress.
type counter struct {
	clustertest.Receiver
	peered atomic.Bool
}

func (c *counter) Frame(msg []byte) { c.Got(msg) }
func (c *counter) Peer(up bool)     { c.peered.Store(up) }
func (c *counter) Replaced()        {}
func (c *counter) Erased()          {}
func (c *counter) GoingAway()       {} // the drain a fence sends: not in these runs

// hop is how a frame's hop is measured: a stream's frames in flight
// within the router's dispatch queue (8192), so that NATS never drops one
// for a slow consumer.
var hop = clustertest.Hop{Size: frameSize, Window: 4096, Unit: "cpu-ns/frame"}

// sender is send of a frame of frameSize bytes.
func sender(send func([]byte)) func() {
	msg := make([]byte, frameSize)
	return func() { send(msg) }
}

// pairT is pair for a test, with two counters.
func pairT(t testing.TB, name string, a, z route.Signals, from, to *counter) (route.SignalSide, route.SignalSide) {
	return pair(t, name, a, z, from, to, func() bool { return from.peered.Load() && to.peered.Load() })
}

// pair joins side 0 of name through a and side 1 through z, and waits
// until both are told of the other.
func pair(b testing.TB, name string, a, z route.Signals, from, to route.SignalSocket, peered func() bool) (route.SignalSide, route.SignalSide) {
	b.Helper()
	ctx := context.Background()
	s, err := a.Join(ctx, name, 0, from)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Leave)
	t, err := z.Join(ctx, name, 1, to)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.Leave)
	deadline := time.Now().Add(10 * time.Second)
	for !peered() {
		if time.Now().After(deadline) {
			b.Fatal("the sides did not pair")
		}
		time.Sleep(time.Millisecond)
	}
	return s, t
}

// countedPair is pair with two counters.
func countedPair(b *testing.B, name string, a, z route.Signals) (route.SignalSide, *counter) {
	var from, to counter
	s, _ := pair(b, name, a, z, &from, &to, func() bool { return from.peered.Load() && to.peered.Load() })
	return s, &to
}

// rounds is how many times each benchmark below runs its cases, one
// after the other, so that rounds alternate the cases on a machine whose
// load drifts; go test names the repeats "#01", "#02", … and make bench
// selects the first ones with its -bench pattern (one per QUICK run).
const rounds = 5

// BenchmarkSignalFrames: one side's 200-byte frames to the other, through
// the single node's router, the cluster's with both sides on one node,
// with the sides on nodes 0 and 2, and the floor of the last: a raw core
// NATS publish on node 0 to a channel subscription on node 2 read by one
// goroutine (the router's own receive path without the router). Each case
// runs "stream" (CPU and allocations per frame) and "one-by-one" (latency
// p50/p99), see hop; the cases run rounds times, alternated.
//
//	go test -run '^$' -bench 'SignalFrames$/^[a-z-]+$/' -benchtime 20000x ./store/cluster/signalroute/
func BenchmarkSignalFrames(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	local := route.NewLocalSignals()
	raw := rawReceiver(b, nodes)
	nc := nodes.Node(0).Conn()
	for round := range rounds {
		name := func(what string) string { return fmt.Sprintf("bench/%s%012d", what, round) }
		b.Run("local", func(b *testing.B) {
			s, to := countedPair(b, name("local"), local, local)
			hop.Run(b, &to.Receiver, sender(s.Send))
		})
		b.Run("cluster-same-node", func(b *testing.B) {
			s, to := countedPair(b, name("same"), rs[0], rs[0])
			hop.Run(b, &to.Receiver, sender(s.Send))
		})
		b.Run("cluster-cross-node", func(b *testing.B) {
			s, to := countedPair(b, name("cross"), rs[0], rs[2])
			hop.Run(b, &to.Receiver, sender(s.Send))
		})
		b.Run("raw-nats-cross-node", func(b *testing.B) {
			hop.Run(b, &raw.Receiver, sender(func(m []byte) { _ = nc.Publish(rawSubject, m) }))
		})
	}
}

const rawSubject = "er.sig.bench.raw.c"

// rawReceiver is the floor's receiving end: a channel subscription on
// node 2, of the router's dispatch queue's size, read by one goroutine;
// it returns once node 0's server knows the interest.
func rawReceiver(b *testing.B, nodes *clustertest.Nodes) *counter {
	var to counter
	ch := make(chan *nats.Msg, 8192)
	sub, err := nodes.Node(2).Conn().ChanSubscribe(rawSubject, ch)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	b.Cleanup(func() { close(done); _ = sub.Unsubscribe() })
	go func() {
		for {
			select {
			case m := <-ch:
				to.Frame(m.Data)
			case <-done:
				return
			}
		}
	}()
	// The interest reaches node 0's server over the routes (the probes
	// ignore the shorter warm-up messages).
	nc := nodes.Node(0).Conn()
	clustertest.Warm(b, to.Seen, func() { _ = nc.Publish(rawSubject, []byte("warm")) })
	return &to
}

// bounded is a signal socket with a bounded send queue (see
// clustertest.Bounded), its handler leaving the rendezvous at the bound.
type bounded struct {
	counter
	clustertest.Bounded
}

func (s *bounded) Frame(msg []byte) { s.Take(len(msg)) }

// backpressure: the measured flow at 10,000 frames a second, a tenth of
// what one cross-node stream sustains here, so that it keeps its rate
// unless something else slows it; beside it, the other pair's 20,000 a
// second fill a frozen receiver's queue in about 65 ms.
var backpressure = clustertest.Backpressure{Size: frameSize, Rate: 10_000, BesideRate: 20_000, Slack: 64}

// BenchmarkSignalFrozenSide: back-pressure. Two pairs cross from node 0
// to node 2: the measured flow sends b.N frames paced at
// backpressure.Rate, while the other pair's sender sends
// backpressure.BesideRate a second. "beside-reading": the other receiver
// reads; "beside-frozen": it stops reading as the run starts, fills its
// queue, is closed at its bound and leaves, while its sender keeps
// sending. Reported: the measured flow's achieved rate over its offered
// one (the goal: within 10%, the frozen socket slows nothing
// else), and the frozen socket's close (see clustertest.Backpressure).
//
//	go test -run '^$' -bench 'SignalFrozenSide$/^[a-z-]+$' -benchtime 20000x ./store/cluster/signalroute/
func BenchmarkSignalFrozenSide(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	var pairs atomic.Int64
	for range rounds {
		for _, mode := range []string{"beside-reading", "beside-frozen"} {
			n := pairs.Add(1)
			b.Run(mode, func(b *testing.B) {
				s, to := countedPair(b, fmt.Sprintf("bench/flow%016d", n), rs[0], rs[2])
				var from counter
				other := &bounded{}
				bs, bt := pair(b, fmt.Sprintf("bench/beside%014d", n), rs[0], rs[2], &from, other,
					func() bool { return from.peered.Load() && other.peered.Load() })
				other.Leave = bt.Leave
				backpressure.Run(b, mode == "beside-frozen", &to.Receiver, sender(s.Send), &other.Bounded, sender(bs.Send))
			})
		}
	}
}
