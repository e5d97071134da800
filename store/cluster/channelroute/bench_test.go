package channelroute_test

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/fastpath/channel/control"
	"edgerelay/route"
	"edgerelay/store/cluster/clustertest"
)

// signalSink tells the benchmark each frame arrived.
type signalSink struct{ got chan struct{} }

func (s *signalSink) WriteText([]byte) error {
	select {
	case s.got <- struct{}{}:
	default:
	}
	return nil
}
func (s *signalSink) Close(int, string) {}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// frameLoop sends b.N frames one at a time (each waits for the one
// before to arrive) and reports the process's CPU per frame and the
// one-way latency's p50 and p99. The three embedded servers run in the
// process, so CPU includes NATS's own work, alike for every case.
func frameLoop(b *testing.B, got <-chan struct{}, send func()) {
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuNow()
	for range b.N {
		t0 := time.Now()
		send()
		<-got
		lat = append(lat, time.Since(t0))
	}
	cpu = cpuNow() - cpu
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/frame")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPhoneToComputer: a 1 KiB phone frame to its computer, the
// phone on the computer's node (no NATS), on another node, and the floor:
// raw core NATS publish/subscribe of the same wrapped bytes between the
// same two nodes.
func BenchmarkPhoneToComputer(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	frame := []byte(strings.Repeat("x", 1<<10))
	key := newKey(b)
	h, err := rs[0].Host(clustertest.Context(b), key)
	if err != nil {
		b.Fatal(err)
	}
	defer h.End()
	ctl := &signalSink{got: make(chan struct{}, 1)}
	h.Attach(ctl)
	phoneOn := func(r route.Channel) route.ChannelPhone {
		p, err := r.Phone(clustertest.Context(b), key, newID(b))
		if err != nil {
			b.Fatal(err)
		}
		if !p.Attach(clustertest.Context(b), &signalSink{got: make(chan struct{}, 1)}) {
			b.Fatal("attach")
		}
		<-ctl.got // its open
		return p
	}
	b.Run("same-node", func(b *testing.B) {
		p := phoneOn(rs[0])
		defer p.End()
		frameLoop(b, ctl.got, func() { _ = p.ToHost(frame) })
	})
	b.Run("cross-node", func(b *testing.B) {
		p := phoneOn(rs[1])
		defer p.End()
		frameLoop(b, ctl.got, func() { _ = p.ToHost(frame) })
	})
	b.Run("raw-nats", func(b *testing.B) {
		var id control.ID
		copy(id[:], strings.Repeat("a", control.IDLen))
		wrapped := control.AppendData(nil, &id, frame)
		got := make(chan struct{}, 1)
		sub, err := nodes.Node(0).Conn().Subscribe("er.ch.floor.up", func(*nats.Msg) {
			select {
			case got <- struct{}{}:
			default:
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Unsubscribe()
		_ = nodes.Node(0).Conn().Flush()
		nc := nodes.Node(1).Conn()
		// Interest reaches node 1's server asynchronously: wait for it.
		for {
			_ = nc.Publish("er.ch.floor.up", wrapped)
			select {
			case <-got:
			case <-time.After(100 * time.Millisecond):
				continue
			}
			break
		}
		frameLoop(b, got, func() { _ = nc.Publish("er.ch.floor.up", wrapped) })
	})
}

// BenchmarkComputerToPhone: a 1 KiB frame of the computer to its phone on
// the same node and on another node (the floor is the same as above).
func BenchmarkComputerToPhone(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	frame := []byte(strings.Repeat("x", 1<<10))
	key := newKey(b)
	h, err := rs[0].Host(clustertest.Context(b), key)
	if err != nil {
		b.Fatal(err)
	}
	defer h.End()
	ctl := &signalSink{got: make(chan struct{}, 1)}
	h.Attach(ctl)
	for _, c := range []struct {
		name string
		r    route.Channel
	}{{"same-node", rs[0]}, {"cross-node", rs[1]}} {
		b.Run(c.name, func(b *testing.B) {
			id := newID(b)
			p, err := c.r.Phone(clustertest.Context(b), key, id)
			if err != nil {
				b.Fatal(err)
			}
			defer p.End()
			ph := &signalSink{got: make(chan struct{}, 1)}
			if !p.Attach(clustertest.Context(b), ph) {
				b.Fatal("attach")
			}
			<-ctl.got // its open
			frameLoop(b, ph.got, func() { h.ToPhone(&id, frame) })
		})
	}
}
