package agentroute_test

import (
	"context"
	"encoding/binary"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
//	go test -run '^$' -bench AgentHop -benchtime 20000x ./store/cluster/agentroute/
func BenchmarkAgentHop(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := clustertest.Open(b, nodes, func(ctx context.Context, c *cluster.Cluster) (*agentroute.Router, error) {
		return agentroute.New(ctx, c, nil)
	})
	ctx := clustertest.Context(b)
	hold, err := rs[0].Link(ctx, inst, &sink{})
	if err != nil {
		b.Fatal(err)
	}
	defer hold.Release()
	sess := []byte(session(1))
	line := make([]byte, 1<<10)

	run := func(b *testing.B, subscribe func(c *counter) func(), send func()) {
		for _, mode := range []string{"stream", "one-by-one"} {
			b.Run(mode, func(b *testing.B) {
				c := &counter{want: int64(b.N), done: make(chan struct{}), sent: make([]int64, b.N), lat: make([]int64, b.N)}
				stop := subscribe(c)
				defer stop()
				// Warm: the interest crosses the nodes.
				time.Sleep(200 * time.Millisecond)
				b.ResetTimer()
				cpu := cpuNanos()
				for k := range b.N {
					binary.BigEndian.PutUint64(line, uint64(k))
					atomic.StoreInt64(&c.sent[k], time.Now().UnixNano())
					send()
					if mode == "one-by-one" {
						for c.n.Load() <= int64(k) {
							runtime.Gosched()
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
				} else { // the sender spins while it waits: its CPU says nothing
					slices.Sort(c.lat)
					b.ReportMetric(float64(c.lat[len(c.lat)/2])/1e3, "p50-µs")
					b.ReportMetric(float64(c.lat[len(c.lat)*99/100])/1e3, "p99-µs")
				}
			})
		}
	}
	b.Run("route", func(b *testing.B) {
		run(b, func(c *counter) func() {
			a, err := rs[1].Attach(ctx, inst, session(1), 64, c)
			if err != nil {
				b.Fatal(err)
			}
			return func() { a.Leave(nil) }
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
