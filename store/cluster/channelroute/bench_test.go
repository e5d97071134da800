package channelroute_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"edgerelay/fastpath/channel/control"
	"edgerelay/route"
	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
)

// frame is a phone's or a computer's data frame in the benchmarks.
var frame = []byte(strings.Repeat("x", 1<<10))

// probeSink is a socket that hands what it is written to the probe of
// the run in progress.
type probeSink struct{ clustertest.Receiver }

func (s *probeSink) WriteText(b []byte) error { s.Got(b); return nil }
func (s *probeSink) Close(int, string)        {}

// hop is how a hop of size-byte frames is measured: a stream's frames in
// flight (4 MiB of 1 KiB frames) within every queue on the way.
func hop(size int) clustertest.Hop {
	return clustertest.Hop{Size: size, Window: 4096, Unit: "cpu-ns/frame"}
}

// rounds is how many times each benchmark below runs its cases, one
// after the other, so that rounds alternate the cases on a machine whose
// load drifts; go test names the repeats "#01", "#02", … and make bench
// selects the first ones with its -bench pattern (one per QUICK run).
const rounds = 5

// computer is a control socket attached through r, its frames to the
// probe of the run in progress.
func computer(b testing.TB, r route.Channel) (store.Hash, route.ChannelHost, *probeSink) {
	key := newKey(b)
	h, err := r.Host(clustertest.Context(b), key)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.End)
	ctl := &probeSink{}
	if !h.Attach(ctl) {
		b.Fatal("attach the control socket")
	}
	return key, h, ctl
}

// phoneOf is a phone of key through r, attached to conn, ended with the
// run.
func phoneOf(b testing.TB, r route.Channel, key store.Hash, conn route.ChannelSink) (route.ChannelPhone, control.ID) {
	id := newID(b)
	p, err := r.Phone(clustertest.Context(b), key, id)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.End)
	if !p.Attach(clustertest.Context(b), conn) {
		b.Fatal("attach the phone")
	}
	return p, id
}

// rawFloor is raw core NATS publish/subscribe of size-byte messages from
// node from to node to, the subscriber's callback handing them to a
// probe: the floor of the hop between those nodes. It returns once the
// interest reached from's server.
func rawFloor(b testing.TB, nodes *clustertest.Nodes, subject string, from, to int, size int) (*probeSink, func(msg []byte)) {
	sink := &probeSink{}
	sub, err := nodes.Node(to).Conn().Subscribe(subject, func(m *nats.Msg) { _ = sink.WriteText(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	nc := nodes.Node(from).Conn()
	// Shorter than a measured frame: no probe counts it.
	clustertest.Warm(b, sink.Seen, func() { _ = nc.Publish(subject, []byte("warm")) })
	return sink, func(msg []byte) { _ = nc.Publish(subject, msg) }
}

// BenchmarkPhoneToComputer: a 1 KiB phone frame to its computer through
// the single node's router (route.LocalChannel), the phone on the
// computer's node (the cluster's router: no NATS), on another node, and
// the floor: raw core NATS publish/subscribe of the same wrapped bytes
// between the same two nodes. Each case runs "stream" and "one-by-one"
// (see hop), rounds times alternated.
//
//	go test -run '^$' -bench 'PhoneToComputer$/^[a-z-]+$/' -benchtime 20000x ./store/cluster/channelroute/
func BenchmarkPhoneToComputer(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	local := route.NewLocalChannel()
	localKey, _, localCtl := computer(b, local)
	key, _, ctl := computer(b, rs[0])
	var id control.ID
	copy(id[:], strings.Repeat("a", control.IDLen))
	wrapped := control.AppendData(nil, &id, frame)
	raw, publish := rawFloor(b, nodes, "er.ch.floor.up", 1, 0, len(wrapped))
	for range rounds {
		b.Run("local", func(b *testing.B) {
			p, _ := phoneOf(b, local, localKey, &probeSink{})
			hop(len(wrapped)).Run(b, &localCtl.Receiver, func() { _ = p.ToHost(frame) })
		})
		b.Run("same-node", func(b *testing.B) {
			p, _ := phoneOf(b, rs[0], key, &probeSink{})
			hop(len(wrapped)).Run(b, &ctl.Receiver, func() { _ = p.ToHost(frame) })
		})
		b.Run("cross-node", func(b *testing.B) {
			p, _ := phoneOf(b, rs[1], key, &probeSink{})
			hop(len(wrapped)).Run(b, &ctl.Receiver, func() { _ = p.ToHost(frame) })
		})
		b.Run("raw-nats", func(b *testing.B) {
			hop(len(wrapped)).Run(b, &raw.Receiver, func() { publish(wrapped) })
		})
	}
}

// BenchmarkComputerToPhone: a 1 KiB frame of the computer to its phone,
// through the single node's router, on the computer's node, on another
// node, and the floor: raw core NATS of the same bytes between those two
// nodes. As BenchmarkPhoneToComputer.
//
//	go test -run '^$' -bench 'ComputerToPhone$/^[a-z-]+$/' -benchtime 20000x ./store/cluster/channelroute/
func BenchmarkComputerToPhone(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	local := route.NewLocalChannel()
	localKey, localHost, _ := computer(b, local)
	key, h, _ := computer(b, rs[0])
	raw, publish := rawFloor(b, nodes, "er.ch.floor.p", 0, 1, len(frame))
	for range rounds {
		for _, c := range []struct {
			name string
			r    route.Channel
			key  store.Hash
			h    route.ChannelHost
		}{{"local", local, localKey, localHost}, {"same-node", rs[0], key, h}, {"cross-node", rs[1], key, h}} {
			b.Run(c.name, func(b *testing.B) {
				ph := &probeSink{}
				_, id := phoneOf(b, c.r, c.key, ph)
				hop(len(frame)).Run(b, &ph.Receiver, func() { c.h.ToPhone(&id, frame) })
			})
		}
		b.Run("raw-nats", func(b *testing.B) {
			hop(len(frame)).Run(b, &raw.Receiver, func() { publish(frame) })
		})
	}
}

// boundedPhone is a phone socket with a bounded send queue (see
// clustertest.Bounded), its handler ending the phone at the bound.
type boundedPhone struct{ clustertest.Bounded }

func (s *boundedPhone) WriteText(b []byte) error {
	if !s.Take(len(b)) {
		return errClosed
	}
	return nil
}
func (s *boundedPhone) Close(int, string) {}

var errClosed = errors.New("closed at its queue bound")

// backpressure: the measured flow at 10,000 frames a second (10 MB/s), a
// small share of what one cross-node stream sustains here, so that it
// keeps its rate unless something else slows it; beside it, 10,000 a
// second fill a frozen phone's queue in about 26 ms.
var backpressure = clustertest.Backpressure{Size: len(frame), Rate: 10_000, BesideRate: 10_000, Slack: 64}

// BenchmarkChannelFrozenPhone: back-pressure. The computer on node 0 has
// two phones on node 1: it sends the measured one b.N frames paced at
// backpressure.Rate, and the other backpressure.BesideRate a second.
// "beside-reading": the other phone reads; "beside-frozen": it stops
// reading as the run starts, fills its queue, is closed at its bound and
// ends, while the computer keeps sending to it. Reported: the measured
// flow's achieved rate over its offered one (the goal: within
// 10%), and the frozen phone's close (see clustertest.Backpressure).
//
//	go test -run '^$' -bench 'ChannelFrozenPhone$/^[a-z-]+$' -benchtime 20000x ./store/cluster/channelroute/
func BenchmarkChannelFrozenPhone(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	rs := routers(b, nodes)
	key, h, _ := computer(b, rs[0])
	for range rounds {
		for _, mode := range []string{"beside-reading", "beside-frozen"} {
			b.Run(mode, func(b *testing.B) {
				ph := &probeSink{}
				_, id := phoneOf(b, rs[1], key, ph)
				other := &boundedPhone{}
				op, otherID := phoneOf(b, rs[1], key, other)
				other.Leave = op.End
				backpressure.Run(b, mode == "beside-frozen", &ph.Receiver, func() { h.ToPhone(&id, frame) },
					&other.Bounded, func() { h.ToPhone(&otherID, frame) })
			})
		}
	}
}
