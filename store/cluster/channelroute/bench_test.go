package channelroute_test

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/fastpath/channel/control"
	"edgerelay/route"
	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
)

// frame is a phone's or a computer's data frame in the benchmarks.
var frame = []byte(strings.Repeat("x", 1<<10))

// probe is one measured run's receiving end: it counts the frames of the
// measured length (open and close messages are shorter) and, when timed,
// notes each one's one-way latency from the send time the sender stored
// for it beforehand. Frames arrive in order (one sender, one NATS
// connection per node), so the k-th counted is the k-th sent.
type probe struct {
	size    int
	timed   bool
	n       atomic.Int64
	sent    []int64 // UnixNano of frame k, stored before its send
	lat     []int64 // arrival minus send of frame k, in ns
	arrived chan struct{}
}

func newProbe(size, n int, timed bool) *probe {
	return &probe{size: size, timed: timed, sent: make([]int64, n), lat: make([]int64, n), arrived: make(chan struct{}, 1)}
}

func (p *probe) got(b []byte) {
	if len(b) != p.size {
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

// probeSink is a socket that hands what it is written to the probe of
// the run in progress.
type probeSink struct{ probe atomic.Pointer[probe] }

func (s *probeSink) WriteText(b []byte) error {
	if p := s.probe.Load(); p != nil {
		p.got(b)
	}
	return nil
}
func (s *probeSink) Close(int, string) {}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// window bounds the frames in flight in a stream (4 MiB of 1 KiB frames:
// within every queue on the way, so that nothing is dropped; a dropped
// frame is never counted and the run fails at its deadline).
const window = 4096

// hop measures frames one way, from send to to's probe, frames of size
// bytes arriving, in two runs: "stream" sends b.N frames as fast as the
// receiver keeps up and reports the process's CPU per frame (the three
// embedded servers run in the process, so CPU includes NATS's own work,
// alike for every case) and its allocations; "one-by-one" sends each
// frame once the one before arrived and reports the one-way latency's p50
// and p99 (in µs; its CPU includes a wake-up per frame on each end, so it
// is not reported).
func hop(b *testing.B, to *probeSink, size int, send func()) {
	for _, mode := range []string{"stream", "one-by-one"} {
		b.Run(mode, func(b *testing.B) {
			timed := mode == "one-by-one"
			p := newProbe(size, b.N, timed)
			to.probe.Store(p)
			defer to.probe.Store(nil)
			deadline := time.NewTimer(30 * time.Second)
			defer deadline.Stop()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuNow()
			for k := range b.N {
				if timed {
					atomic.StoreInt64(&p.sent[k], time.Now().UnixNano())
				}
				send()
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
			cpu = cpuNow() - cpu
			b.StopTimer()
			if !timed {
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/frame")
				return
			}
			slices.Sort(p.lat)
			b.ReportMetric(float64(p.lat[len(p.lat)/2])/1e3, "p50-µs")
			b.ReportMetric(float64(p.lat[len(p.lat)*99/100])/1e3, "p99-µs")
		})
	}
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
	var warm atomic.Bool
	sub, err := nodes.Node(to).Conn().Subscribe(subject, func(m *nats.Msg) {
		warm.Store(true)
		_ = sink.WriteText(m.Data)
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	nc := nodes.Node(from).Conn()
	deadline := time.Now().Add(10 * time.Second)
	for !warm.Load() {
		if time.Now().After(deadline) {
			b.Fatalf("no raw message reached node %d", to)
		}
		_ = nc.Publish(subject, []byte("warm")) // shorter: no probe counts it
		time.Sleep(5 * time.Millisecond)
	}
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
			hop(b, localCtl, len(wrapped), func() { _ = p.ToHost(frame) })
		})
		b.Run("same-node", func(b *testing.B) {
			p, _ := phoneOf(b, rs[0], key, &probeSink{})
			hop(b, ctl, len(wrapped), func() { _ = p.ToHost(frame) })
		})
		b.Run("cross-node", func(b *testing.B) {
			p, _ := phoneOf(b, rs[1], key, &probeSink{})
			hop(b, ctl, len(wrapped), func() { _ = p.ToHost(frame) })
		})
		b.Run("raw-nats", func(b *testing.B) {
			hop(b, raw, len(wrapped), func() { publish(wrapped) })
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
				hop(b, ph, len(frame), func() { c.h.ToPhone(&id, frame) })
			})
		}
		b.Run("raw-nats", func(b *testing.B) {
			hop(b, raw, len(frame), func() { publish(frame) })
		})
	}
}

// frozenQueue is the phone socket's send-queue bound as the frozen phone
// below keeps it; small, so that it fills early in a run (the handler's is
// 2 MiB: only the time to fill it differs).
const frozenQueue = 256 << 10

// boundedPhone is a phone socket that models a real one's bounded send
// queue: while it reads, what it is written goes at once; frozen (its
// client stopped reading), frames pile up until the next would pass
// frozenQueue, which closes it, as ws.Conn closes a socket at its queue
// bound, and its handler then ends the channel (end).
type boundedPhone struct {
	frozen, closed atomic.Bool
	mu             sync.Mutex
	queued         int
	written        atomic.Int64
	end            func()
}

func (s *boundedPhone) WriteText(b []byte) error {
	s.written.Add(1)
	if !s.frozen.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return errClosed
	}
	if s.queued += len(b); s.queued > frozenQueue {
		s.closed.Store(true)
		go s.end() // the handler's goroutine, not the router's
		return errClosed
	}
	return nil
}
func (s *boundedPhone) Close(int, string) {}

var errClosed = errString("closed at its queue bound")

type errString string

func (e errString) Error() string { return string(e) }

// besideRate is how many frames a second the computer sends the phone
// beside the measured one.
const besideRate = 10_000

// BenchmarkChannelFrozenPhone: back-pressure. The computer on node 0 has
// two phones on node 1: it sends the measured one b.N frames as fast as
// that phone keeps up (as in the stream above), and the other besideRate
// frames a second. "beside-reading": the other phone reads;
// "beside-frozen": it stops reading as the run starts, fills its queue, is
// closed at its bound and ends, while the computer keeps sending to it.
// Reported: the measured flow's frames per second; the report divides
// frozen by reading, round by round (the goal: at least 0.9).
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
				other.end = op.End
				p := newProbe(len(frame), b.N, false)
				ph.probe.Store(p)
				defer ph.probe.Store(nil)

				stop := make(chan struct{})
				var wg sync.WaitGroup
				defer wg.Wait()
				defer close(stop)
				other.frozen.Store(mode == "beside-frozen")
				b.ResetTimer()
				wg.Go(func() { paced(func() { h.ToPhone(&otherID, frame) }, stop) })
				start := time.Now()
				deadline := start.Add(30 * time.Second)
				for k := range b.N {
					h.ToPhone(&id, frame)
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
				if mode == "beside-frozen" && !closed && other.written.Load()*int64(len(frame)) > frozenQueue {
					b.Fatalf("the frozen phone was written %d frames, past its bound, and not closed", other.written.Load())
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "frames/s")
				// A run too short for the queue to fill (go test's first,
				// of one frame) measured no back-pressure: the report
				// needs 1.
				b.ReportMetric(map[bool]float64{false: 0, true: 1}[closed], "closed")
				b.ReportMetric(float64(other.written.Load()), "beside-frames")
			})
		}
	}
}

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
