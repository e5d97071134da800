package agentroute_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/route"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/agentroute"
	"edgerelay/store/cluster/clustertest"
)

// counter is a client that counts lines and notes when each arrived.
type counter struct {
	n    atomic.Int64
	sent []int64 // send time of line k (UnixNano), written before the send
	lat  []int64 // arrival minus send, by line
	done chan struct{}
	want int64
	// arrived is signalled at each line, for a sender waiting one by one
	// (a spinning sender would take a core the hop needs).
	arrived chan struct{}
}

func (c *counter) Deliver(line []byte) { c.got(line) }

func (c *counter) got(line []byte) {
	k := int(binary.BigEndian.Uint64(line))
	if k < len(c.lat) {
		c.lat[k] = time.Now().UnixNano() - atomic.LoadInt64(&c.sent[k])
	}
	if c.n.Add(1) == c.want {
		close(c.done)
	}
	select {
	case c.arrived <- struct{}{}:
	default:
	}
}

func cpuNanos() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkAgentHop: 1 KiB lines from a link on node 0 to a client on node
// 1 through the route, beside a raw core NATS publish of the same bytes to
// a subscriber on node 1 (the floor). Reported: process CPU per line (both
// nodes and their embedded servers: the whole hop), and the one-way
// latency p50/p99 of lines sent one at a time.
//
//	go test -run '^$' -bench 'AgentHop$/^[a-z-]+$/' -benchtime 20000x ./store/cluster/agentroute/
func BenchmarkAgentHop(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := clustertest.Open(b, nodes, func(ctx context.Context, c *cluster.Cluster) (*agentroute.Router, error) {
		return agentroute.New(ctx, c, nil)
	})
	ctx := clustertest.Context(b)
	var hold route.AgentLinkHold
	sess := []byte(session(1))
	runs := 0
	line := make([]byte, 1<<10)

	run := func(b *testing.B, subscribe func(c *counter) func(), send func()) {
		for _, mode := range []string{"stream", "one-by-one"} {
			b.Run(mode, func(b *testing.B) {
				c := &counter{want: int64(b.N), done: make(chan struct{}), sent: make([]int64, b.N), lat: make([]int64, b.N), arrived: make(chan struct{}, 1)}
				stop := subscribe(c)
				defer stop()
				b.ReportAllocs()
				// Warm: the interest crosses the nodes.
				time.Sleep(200 * time.Millisecond)
				b.ResetTimer()
				cpu := cpuNanos()
				for k := range b.N {
					binary.BigEndian.PutUint64(line, uint64(k))
					atomic.StoreInt64(&c.sent[k], time.Now().UnixNano())
					send()
					switch {
					case mode == "one-by-one":
						for c.n.Load() <= int64(k) {
							<-c.arrived
						}
					case k%256 == 255:
						// Within the subscriber's pending limits, and a
						// flood of the routes would delay the cluster's
						// own JetStream traffic (leases, attachments).
						for c.n.Load() < int64(k+1)-window {
							time.Sleep(50 * time.Microsecond)
						}
					}
				}
				select {
				case <-c.done:
				case <-time.After(30 * time.Second):
					b.Fatalf("%d of %d lines arrived", c.n.Load(), b.N)
				}
				b.StopTimer()
				if mode == "stream" {
					b.ReportMetric(float64(cpuNanos()-cpu)/float64(b.N), "cpu-ns/line")
				} else { // a wake-up per line on each end: its CPU is not the stream's
					slices.Sort(c.lat)
					b.ReportMetric(float64(c.lat[len(c.lat)/2])/1e3, "p50-µs")
					b.ReportMetric(float64(c.lat[len(c.lat)*99/100])/1e3, "p99-µs")
				}
			})
		}
	}
	for range rounds {
		b.Run("route", func(b *testing.B) {
			run(b, func(c *counter) func() {
				// An instance of its own per run: an Attach while an
				// earlier run's Leave still writes the instance's
				// attachment set can fail ("no write after 32 contended
				// rounds"), which is not what this measures.
				runs++
				inst := fmt.Sprintf("inst-hop-%06d", runs)
				var err error
				if hold, err = rs[0].Link(ctx, inst, &sink{}); err != nil {
					b.Fatal(err)
				}
				a, err := rs[1].Attach(ctx, inst, string(sess), 64, c)
				if err != nil {
					b.Fatal(err)
				}
				return func() { a.Leave(nil); hold.Release() }
			}, func() { hold.ToSession(sess, line) })
		})
		b.Run("raw-nats", func(b *testing.B) {
			pub, subc := nodes.Node(0).Conn(), nodes.Node(1).Conn()
			run(b, func(c *counter) func() {
				sub, err := subc.Subscribe("bench.raw", func(m *nats.Msg) { c.got(m.Data) })
				if err != nil {
					b.Fatal(err)
				}
				return func() { _ = sub.Unsubscribe() }
			}, func() { _ = pub.Publish("bench.raw", line) })
		})
	}
}

// rounds is how many times each benchmark here runs its cases, one after
// the other, so that rounds alternate the cases on a machine whose load
// drifts; go test names the repeats "#01", "#02", … and make bench selects
// the first ones with its -bench pattern (one per QUICK run).
const rounds = 5

// frozenQueue is a client socket's send-queue bound as the frozen client
// below keeps it; small, so that it fills early in a run (the handler's
// is its ClientQueue: only the time to fill it differs).
const frozenQueue = 256 << 10

// boundedClient is a client that models a real one's bounded send queue:
// while it reads, a line is written at once; frozen (its browser stopped
// reading), lines pile up until the next would pass frozenQueue, which
// closes it, as ws.Conn closes a socket at its queue bound, and its
// handler then detaches it (leave).
type boundedClient struct {
	frozen, closed atomic.Bool
	queued         int // frozen bytes; the route's goroutine alone
	delivered      atomic.Int64
	leave          func()
}

func (c *boundedClient) Deliver(line []byte) {
	c.delivered.Add(1)
	if !c.frozen.Load() || c.closed.Load() {
		return
	}
	if c.queued += len(line); c.queued > frozenQueue && !c.closed.Swap(true) {
		go c.leave() // the handler's goroutine, not the route's
	}
}

// besideRate is how many lines a second the link sends the client beside
// the measured one.
const besideRate = 10_000

// window bounds the lines in flight to the measured client (1 MiB).
const window = 1024

// BenchmarkAgentFrozenClient: back-pressure. The link on node 0 has two
// clients on node 1: it sends the measured one b.N 1 KiB lines as fast as
// that client keeps up, and the other besideRate lines a second.
// "beside-reading": the other client reads; "beside-frozen": it stops
// reading as the run starts, fills its queue, is closed at its bound and
// detaches, while the link keeps sending to its session. Reported: the
// measured flow's lines per second; the report divides frozen by reading,
// round by round (the goal: at least 0.9).
//
//	go test -run '^$' -bench 'AgentFrozenClient$/^[a-z-]+$' -benchtime 20000x ./store/cluster/agentroute/
func BenchmarkAgentFrozenClient(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := clustertest.Open(b, nodes, func(ctx context.Context, c *cluster.Cluster) (*agentroute.Router, error) {
		return agentroute.New(ctx, c, nil)
	})
	ctx := clustertest.Context(b)
	line := make([]byte, 1<<10)
	runs := 0
	for range rounds {
		for _, mode := range []string{"beside-reading", "beside-frozen"} {
			b.Run(mode, func(b *testing.B) {
				// An instance of its own per run: an earlier run's Leave
				// may still be writing its instance's attachment set.
				runs++
				inst := fmt.Sprintf("inst-frozen-%06d", runs)
				hold, err := rs[0].Link(ctx, inst, &sink{})
				if err != nil {
					b.Fatal(err)
				}
				defer hold.Release()
				flow, beside := []byte(session(1)), []byte(session(2))
				var got atomic.Int64
				measured := &countLines{n: &got}
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
				other.leave = func() { oa.Leave(nil) }
				defer oa.Leave(nil)
				// The sessions' interest crosses to node 0's server.
				deadline := time.Now().Add(10 * time.Second)
				for got.Load() == 0 || other.delivered.Load() == 0 {
					if time.Now().After(deadline) {
						b.Fatal("the clients' subscriptions never reached the link's node")
					}
					hold.ToSession(flow, line)
					hold.ToSession(beside, line)
					time.Sleep(5 * time.Millisecond)
				}
				base := got.Load()
				stop := make(chan struct{})
				var wg sync.WaitGroup
				defer wg.Wait()
				defer close(stop)
				other.frozen.Store(mode == "beside-frozen")
				b.ResetTimer()
				wg.Go(func() { paced(func() { hold.ToSession(beside, line) }, stop) })
				start := time.Now()
				deadline = start.Add(30 * time.Second)
				for k := range b.N {
					hold.ToSession(flow, line)
					if k%256 == 255 {
						for got.Load()-base < int64(k+1)-window {
							time.Sleep(50 * time.Microsecond)
						}
					}
				}
				for got.Load()-base < int64(b.N) {
					if time.Now().After(deadline) {
						b.Fatalf("%d of %d lines delivered", got.Load()-base, b.N)
					}
					time.Sleep(50 * time.Microsecond)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				closed := other.closed.Load()
				if mode == "beside-frozen" && !closed && other.delivered.Load()*int64(len(line)) > frozenQueue+int64(len(line))*64 {
					b.Fatalf("the frozen client was handed %d lines, past its bound, and not closed", other.delivered.Load())
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "frames/s")
				// A run too short for the queue to fill (go test's first,
				// of one line) measured no back-pressure: the report
				// needs 1.
				b.ReportMetric(map[bool]float64{false: 0, true: 1}[closed], "closed")
				b.ReportMetric(float64(other.delivered.Load()), "beside-frames")
			})
		}
	}
}

// countLines is a client that counts its lines.
type countLines struct{ n *atomic.Int64 }

func (c *countLines) Deliver([]byte) { c.n.Add(1) }

// paced calls send besideRate times a second until stop closes, each
// millisecond what is due by then (a busy machine skips ticks: the next
// one catches up, up to a tenth of a second's worth).
func paced(send func(), stop <-chan struct{}) {
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
			send()
		}
	}
}
