package signalroute_test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/route"
	"edgerelay/store/cluster/clustertest"
)

// counter is a signal socket that counts the frames it gets.
type counter struct {
	frames atomic.Int64
	peered atomic.Bool
}

func (c *counter) Frame([]byte) { c.frames.Add(1) }
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

// wait polls until got reaches n.
func wait(got func() int64, n int64) {
	for got() < n {
		time.Sleep(50 * time.Microsecond)
	}
}

// frames sends b.N frames of 200 bytes with send and waits until got
// counts them all, reporting the process's CPU per frame (three nodes'
// servers, both routers and the sender: the whole cluster's cost).
func frames(b *testing.B, send func([]byte), got func() int64) {
	msg := make([]byte, 200)
	base := got()
	c0 := cpu(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		send(msg)
		if i%256 == 255 {
			wait(got, base+int64(i+1)-4096) // stay within the receiver's queue
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for got()-base < int64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d frames delivered", got()-base, b.N)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu(b)-c0)/float64(b.N), "cpu-ns/frame")
}

// BenchmarkSignalFrames: one side's frames to the other, through the
// single node's router, the cluster's with both sides on one node, with
// the sides on nodes 0 and 2, and the floor of the last: a raw core NATS
// publish on node 0 to a channel subscription on node 2 (what the hop
// costs without the router). Frames are sent as fast as the sender can;
// a frame NATS drops for a slow consumer would never be counted (the
// benchmark then fails at its deadline).
//
//	go test -run '^$' -bench SignalFrames -benchtime 200000x ./store/cluster/signalroute/
func BenchmarkSignalFrames(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	ctx := context.Background()
	pair := func(b *testing.B, name string, a, z route.Signals) (route.SignalSide, *counter) {
		var from, to counter
		s, err := a.Join(ctx, name, 0, &from)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Leave)
		t, err := z.Join(ctx, name, 1, &to)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(t.Leave)
		deadline := time.Now().Add(10 * time.Second)
		for !from.peered.Load() || !to.peered.Load() {
			if time.Now().After(deadline) {
				b.Fatal("the sides did not pair")
			}
			time.Sleep(time.Millisecond)
		}
		return s, &to
	}
	b.Run("local", func(b *testing.B) {
		local := route.NewLocalSignals()
		s, to := pair(b, "bench/local0000000001", local, local)
		frames(b, s.Send, to.frames.Load)
	})
	b.Run("cluster-same-node", func(b *testing.B) {
		s, to := pair(b, "bench/same00000000001", rs[0], rs[0])
		frames(b, s.Send, to.frames.Load)
	})
	b.Run("cluster-cross-node", func(b *testing.B) {
		s, to := pair(b, "bench/cross0000000001", rs[0], rs[2])
		frames(b, s.Send, to.frames.Load)
	})
	b.Run("raw-nats-cross-node", func(b *testing.B) {
		var got atomic.Int64
		// Delivered to a channel of the router's size, read by one
		// goroutine: the router's own receive path without the router.
		ch := make(chan *nats.Msg, 8192)
		sub, err := nodes.Node(2).Conn().ChanSubscribe("er.sig.bench.raw.c", ch)
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Unsubscribe()
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case <-ch:
					got.Add(1)
				case <-done:
					return
				}
			}
		}()
		nc := nodes.Node(0).Conn()
		// The interest reaches node 0's server over the routes: publish
		// until one arrives, untimed.
		deadline := time.Now().Add(10 * time.Second)
		for got.Load() == 0 {
			if time.Now().After(deadline) {
				b.Fatal("no raw message reached node 2")
			}
			_ = nc.Publish("er.sig.bench.raw.c", []byte("warm"))
			time.Sleep(5 * time.Millisecond)
		}
		frames(b, func(m []byte) { _ = nc.Publish("er.sig.bench.raw.c", m) }, got.Load)
	})
}
