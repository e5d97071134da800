package signalroute_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/route"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/cluster/signalroute"
)

// frameSize is a signal frame's length in the benchmarks (an SDP-sized
// sealed signal is a few hundred bytes).
const frameSize = 200

// probe is one measured run's receiving end: it counts the frames of the
// measured length (a warm-up message is shorter) and notes each one's
// one-way latency from the send time the sender stored for it beforehand.
// Frames arrive in order (one sender, one NATS connection per node), so
// the k-th counted is the k-th sent.
type probe struct {
	timed   bool // one-by-one: the stream's CPU figure reads no clocks
	n       atomic.Int64
	sent    []int64 // UnixNano of frame k, stored before its send
	lat     []int64 // arrival minus send of frame k, in ns
	arrived chan struct{}
}

func newProbe(n int, timed bool) *probe {
	return &probe{timed: timed, sent: make([]int64, n), lat: make([]int64, n), arrived: make(chan struct{}, 1)}
}

func (p *probe) got(msg []byte) {
	if len(msg) != frameSize {
		return
	}
	if k := p.n.Load(); p.timed && k < int64(len(p.lat)) {
		p.lat[k] = time.Now().UnixNano() - atomic.LoadInt64(&p.sent[k])
	}
	p.n.Add(1)
	select {
	case p.arrived <- struct{}{}:
	default:
	}
}

// counter is a signal socket that hands its frames to the probe of the
// run in progress.
type counter struct {
	probe  atomic.Pointer[probe]
	peered atomic.Bool
}

func (c *counter) Frame(msg []byte) {
	if p := c.probe.Load(); p != nil {
		p.got(msg)
	}
}
func (c *counter) Peer(up bool) { c.peered.Store(up) }
func (c *counter) Replaced()    {}
func (c *counter) Erased()      {}

// cpu is the process's user+system CPU time so far.
func cpu(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// window bounds the frames in flight in a stream: within the router's
// dispatch queue (8192), so that NATS never drops one for a slow
// consumer (a dropped frame would never be counted: the run then fails at
// its deadline).
const window = 4096

// hop measures frames one way, from send to to's probe, in two runs:
// "stream" sends b.N frames as fast as the receiver keeps up and reports
// the process's CPU per frame (three nodes' servers, both routers and the
// sender: the whole cluster's cost) and its allocations; "one-by-one"
// sends each frame once the one before arrived and reports the one-way
// latency's p50 and p99 (in µs; its CPU includes a wake-up per frame on
// each end, so it is not reported).
func hop(b *testing.B, to *counter, send func([]byte)) {
	for _, mode := range []string{"stream", "one-by-one"} {
		b.Run(mode, func(b *testing.B) {
			timed := mode == "one-by-one"
			p := newProbe(b.N, timed)
			to.probe.Store(p)
			defer to.probe.Store(nil)
			msg := make([]byte, frameSize)
			deadline := time.NewTimer(30 * time.Second)
			defer deadline.Stop()
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpu(b)
			for k := range b.N {
				if timed {
					atomic.StoreInt64(&p.sent[k], time.Now().UnixNano())
				}
				send(msg)
				switch {
				case timed:
					for p.n.Load() <= int64(k) {
						select {
						case <-p.arrived:
						case <-deadline.C:
							b.Fatalf("frame %d of %d never arrived", k, b.N)
						}
					}
				case k%256 == 255:
					for p.n.Load() < int64(k+1)-window {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}
			for p.n.Load() < int64(b.N) {
				select {
				case <-p.arrived:
				case <-deadline.C:
					b.Fatalf("%d of %d frames delivered", p.n.Load(), b.N)
				}
			}
			used := cpu(b) - c0
			b.StopTimer()
			if mode == "stream" {
				b.ReportMetric(float64(used)/float64(b.N), "cpu-ns/frame")
				return
			}
			slices.Sort(p.lat)
			b.ReportMetric(float64(p.lat[len(p.lat)/2])/1e3, "p50-µs")
			b.ReportMetric(float64(p.lat[len(p.lat)*99/100])/1e3, "p99-µs")
		})
	}
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
			hop(b, to, s.Send)
		})
		b.Run("cluster-same-node", func(b *testing.B) {
			s, to := countedPair(b, name("same"), rs[0], rs[0])
			hop(b, to, s.Send)
		})
		b.Run("cluster-cross-node", func(b *testing.B) {
			s, to := countedPair(b, name("cross"), rs[0], rs[2])
			hop(b, to, s.Send)
		})
		b.Run("raw-nats-cross-node", func(b *testing.B) {
			hop(b, raw, func(m []byte) { _ = nc.Publish(rawSubject, m) })
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
	var warm atomic.Bool
	go func() {
		for {
			select {
			case m := <-ch:
				warm.Store(true)
				to.Frame(m.Data)
			case <-done:
				return
			}
		}
	}()
	// The interest reaches node 0's server over the routes: publish until
	// one arrives, untimed (the probes ignore these).
	nc := nodes.Node(0).Conn()
	deadline := time.Now().Add(10 * time.Second)
	for !warm.Load() {
		if time.Now().After(deadline) {
			b.Fatal("no raw message reached node 2")
		}
		_ = nc.Publish(rawSubject, []byte("warm"))
		time.Sleep(5 * time.Millisecond)
	}
	return &to
}

// frozenQueue is the signal handler's send-queue bound as the frozen
// socket below keeps it; small, so that it fills early in a run (the real
// one is the mailbox's MaxBehind: only the time to fill it differs).
const frozenQueue = 256 << 10

// bounded is a signal socket that models a real one's bounded send queue:
// while it reads, what it is handed is written at once; frozen (its
// client stopped reading), frames pile up until the next would pass
// frozenQueue, which closes it, as ws.Conn closes a socket at its queue
// bound, and its handler then leaves the rendezvous (leave).
type bounded struct {
	counter
	frozen, closed atomic.Bool
	queued         int // frozen bytes; the dispatcher's alone
	handed         atomic.Int64
	leave          func()
}

func (s *bounded) Frame(msg []byte) {
	s.handed.Add(1)
	if !s.frozen.Load() || s.closed.Load() {
		return
	}
	if s.queued += len(msg); s.queued > frozenQueue && !s.closed.Swap(true) {
		go s.leave() // the handler's goroutine, not the router's
	}
}

// besideRate is how many frames per second of the flow between the
// other two sides cross, while a second pair's sender beside it sends
// paced frames across the same nodes.
const besideRate = 20_000

// BenchmarkSignalFrozenSide: back-pressure. Two pairs cross from node 0
// to node 2: the measured flow sends b.N frames as fast as its receiver
// keeps up (as in BenchmarkSignalFrames' stream), while the other pair's
// sender sends besideRate frames a second. "beside-reading": the other
// receiver reads; "beside-frozen": it stops reading as the run starts,
// fills its queue, is closed at its bound and leaves, while its sender
// keeps sending. Reported: the measured flow's frames per second; the
// report divides frozen by reading, round by round (the goal: at
// least 0.9, the frozen socket slows nothing else).
//
//	go test -run '^$' -bench 'SignalFrozenSide$/^[a-z-]+$' -benchtime 50000x ./store/cluster/signalroute/
func BenchmarkSignalFrozenSide(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	var pairs atomic.Int64
	for range rounds {
		for _, mode := range []string{"beside-reading", "beside-frozen"} {
			frozenRun(b, rs, mode, pairs.Add(1))
		}
	}
}

// frozenRun is one case of BenchmarkSignalFrozenSide, its pairs named
// after n.
func frozenRun(b *testing.B, rs []*signalroute.Router, mode string, n int64) {
	b.Run(mode, func(b *testing.B) {
		s, to := countedPair(b, fmt.Sprintf("bench/flow%016d", n), rs[0], rs[2])
		var from counter
		other := &bounded{}
		bs, bt := pair(b, fmt.Sprintf("bench/beside%014d", n), rs[0], rs[2], &from, other,
			func() bool { return from.peered.Load() && other.peered.Load() })
		other.leave = bt.Leave
		p := newProbe(b.N, false)
		to.probe.Store(p)
		defer to.probe.Store(nil)

		stop := make(chan struct{})
		var wg sync.WaitGroup
		defer wg.Wait()
		defer close(stop)
		other.frozen.Store(mode == "beside-frozen")
		b.ResetTimer()
		wg.Go(func() { paced(bs.Send, stop) })
		start := time.Now()
		msg := make([]byte, frameSize)
		deadline := time.Now().Add(30 * time.Second)
		for k := range b.N {
			s.Send(msg)
			if k%256 == 255 {
				for p.n.Load() < int64(k+1)-window {
					time.Sleep(50 * time.Microsecond)
				}
			}
		}
		for p.n.Load() < int64(b.N) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d frames delivered", p.n.Load(), b.N)
			}
			time.Sleep(50 * time.Microsecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		closed := other.closed.Load()
		if mode == "beside-frozen" && !closed && other.handed.Load()*frameSize > frozenQueue {
			b.Fatalf("the frozen socket was handed %d frames, past its bound, and not closed", other.handed.Load())
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "frames/s")
		// A run too short for the queue to fill (go test's first, of
		// one frame) measured no back-pressure: the report needs 1.
		b.ReportMetric(map[bool]float64{false: 0, true: 1}[closed], "closed")
		b.ReportMetric(float64(other.handed.Load()), "beside-frames")
	})
}

// paced sends besideRate frames a second with send until stop closes,
// each millisecond what is due by then (a busy machine skips ticks: the
// next one catches up, up to a tenth of a second's worth).
func paced(send func([]byte), stop <-chan struct{}) {
	msg := make([]byte, frameSize)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * besideRate)
		sent = max(sent, due-besideRate/10)
		for ; sent < due; sent++ {
			send(msg)
		}
	}
}
