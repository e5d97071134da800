package clustertest

// The measuring parts the routers' benchmarks share (signalroute,
// channelroute, agentroute): a receiving end that counts and times what
// arrives (Receiver, Probe), one hop measured as a stream and one by one
// (Hop), a sender paced at a fixed rate (Paced), a consumer that models a
// socket's bounded send queue (Bounded) and the back-pressure run built
// from them (Backpressure). Imports: what clustertest.go imports already
// (testing among them) and the standard library, nothing test-only.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Probe is one measured run's receiving end: it counts the messages of
// the measured length (warm-ups, opens and closes are of another) and,
// timed, notes each one's one-way latency from the send time the sender
// stored for it beforehand. Messages arrive in order (one sender, one
// NATS connection per node), so the k-th counted is the k-th sent.
type Probe struct {
	size    int
	timed   bool         // one by one: a stream's CPU figure reads no clocks
	n       atomic.Int64 // messages counted
	last    atomic.Int64 // UnixNano of the last one counted, when stamped
	stamped bool
	// paced: message k is due at start+k*every (UnixNano, ns); maxLag is
	// the most any arrived after its due time.
	start, every float64
	maxLag       atomic.Int64
	sent         []int64 // UnixNano of message k, stored before its send
	lat          []int64 // arrival minus send of message k, in ns
	arrived      chan struct{}
}

// NewProbe is a probe of n messages of size bytes.
func NewProbe(size, n int, timed bool) *Probe {
	p := &Probe{size: size, timed: timed, arrived: make(chan struct{}, 1)}
	if timed {
		p.sent, p.lat = make([]int64, n), make([]int64, n)
	}
	return p
}

func (p *Probe) got(msg []byte) {
	if len(msg) != p.size {
		return
	}
	if k := p.n.Load(); p.timed && k < int64(len(p.lat)) {
		p.lat[k] = time.Now().UnixNano() - atomic.LoadInt64(&p.sent[k])
	}
	if p.stamped {
		now := time.Now().UnixNano()
		p.last.Store(now)
		lag := now - int64(p.start+float64(p.n.Load())*p.every)
		for {
			m := p.maxLag.Load()
			if lag <= m || p.maxLag.CompareAndSwap(m, lag) {
				break
			}
		}
	}
	p.n.Add(1)
	select {
	case p.arrived <- struct{}{}:
	default:
	}
}

// Count is how many messages of the measured length arrived.
func (p *Probe) Count() int64 { return p.n.Load() }

// Receiver is a benchmark's receiving socket's end: it hands what arrives
// to the probe of the run in progress, and notes that something arrived
// at all (a warm-up's interest crossed the nodes).
type Receiver struct {
	probe   atomic.Pointer[Probe]
	seen    atomic.Bool
	arrived atomic.Int64
}

// Got is a message arriving.
func (r *Receiver) Got(msg []byte) {
	if !r.seen.Load() {
		r.seen.Store(true)
	}
	r.arrived.Add(1)
	if p := r.probe.Load(); p != nil {
		p.got(msg)
	}
}

// Seen reports whether anything arrived yet.
func (r *Receiver) Seen() bool { return r.seen.Load() }

// Arrived is how many messages arrived so far, of any length.
func (r *Receiver) Arrived() int64 { return r.arrived.Load() }

// measure hands what arrives to p until the returned func is called.
func (r *Receiver) measure(p *Probe) func() {
	r.probe.Store(p)
	return func() { r.probe.Store(nil) }
}

// Warm sends with send every 5 ms until arrived (the sends' interest
// crossed the nodes, e.g. a Receiver's Seen) or 10 s passed. A warm-up's
// message is of another length than a measured one, or sent while no
// probe counts.
func Warm(b testing.TB, arrived func() bool, send func()) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !arrived() {
		if time.Now().After(deadline) {
			b.Fatal("no warm-up message arrived in 10 s")
		}
		send()
		time.Sleep(5 * time.Millisecond)
	}
}

// CPU is the process's user+system CPU time so far.
func CPU(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(fmt.Errorf("getrusage: %w", err))
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Hop is how a router's hop is measured.
type Hop struct {
	Size   int    // a measured message's length on arrival
	Window int    // messages in flight at most in a stream
	Unit   string // the stream's CPU unit: "cpu-ns/frame", "cpu-ns/line"
}

// Run measures messages one way, from send to to, in two runs: "stream"
// sends b.N as fast as the receiver keeps up within h.Window in flight
// (within every queue on the way: a message dropped for a slow consumer
// is never counted and the run fails at its deadline) and reports the
// process's CPU per message (every embedded server, both routers and the
// sender: the whole cluster's cost) and its allocations; "one-by-one"
// sends each once the one before arrived and reports the one-way
// latency's p50 and p99 in µs (its CPU includes a wake-up per message on
// each end, so it is not reported).
func (h Hop) Run(b *testing.B, to *Receiver, send func()) {
	for _, mode := range []string{"stream", "one-by-one"} {
		b.Run(mode, func(b *testing.B) {
			timed := mode == "one-by-one"
			p := NewProbe(h.Size, b.N, timed)
			defer to.measure(p)()
			deadline := time.NewTimer(30 * time.Second)
			defer deadline.Stop()
			b.ReportAllocs()
			b.ResetTimer()
			c0 := CPU(b)
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
							b.Fatalf("message %d of %d never arrived", k, b.N)
						}
					}
				case k%256 == 255:
					for p.n.Load() < int64(k+1-h.Window) {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}
			for p.n.Load() < int64(b.N) {
				select {
				case <-p.arrived:
				case <-deadline.C:
					b.Fatalf("%d of %d messages delivered", p.n.Load(), b.N)
				}
			}
			used := CPU(b) - c0
			b.StopTimer()
			if !timed {
				b.ReportMetric(float64(used)/float64(b.N), h.Unit)
				return
			}
			slices.Sort(p.lat)
			b.ReportMetric(float64(p.lat[len(p.lat)/2])/1e3, "p50-µs")
			b.ReportMetric(float64(p.lat[len(p.lat)*99/100])/1e3, "p99-µs")
		})
	}
}

// Paced calls send rate times a second, each millisecond what is due by
// then, n times (n 0: until stop closes), and returns how many it made.
// A busy machine skips ticks; the next one catches up on all that is due,
// so the offered load is the rate's whatever the scheduling.
func Paced(rate, n int, send func(), stop <-chan struct{}) int {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start, sent := time.Now(), 0
	for n == 0 || sent < n {
		due := int(time.Since(start).Seconds() * float64(rate))
		if n > 0 {
			due = min(due+1, n) // the first at once
		}
		for ; sent < due; sent++ {
			send()
		}
		if n > 0 && sent == n {
			break
		}
		select {
		case <-stop:
			return sent
		case <-tick.C:
		}
	}
	return sent
}

// FrozenQueue is the send-queue bound a Bounded consumer keeps: small, so
// that a frozen one fills it early in a run (the handlers' are larger:
// only the time to fill them differs).
const FrozenQueue = 256 << 10

// Bounded is a consumer that models a real socket's bounded send queue:
// while it reads, what it is handed goes at once; frozen (its client
// stopped reading), messages pile up until the next would pass
// FrozenQueue, which closes it, as ws.Conn closes a socket at its queue
// bound; its handler then leaves the route (Leave, on a goroutine of its
// own: the handler's, not the router's).
type Bounded struct {
	Leave func()

	frozen, closed     atomic.Bool
	frozenAt, closedAt atomic.Int64 // UnixNano
	handed             atomic.Int64
	mu                 sync.Mutex
	queued             int // bytes held while frozen
}

// Handed is how many messages the consumer was handed.
func (q *Bounded) Handed() int64 { return q.handed.Load() }

// Freeze stops the consumer reading.
func (q *Bounded) Freeze() {
	q.frozenAt.Store(time.Now().UnixNano())
	q.frozen.Store(true)
}

// Take is a message of n bytes handed to the consumer: false if the
// consumer is closed, by this message (past its bound) or before it.
func (q *Bounded) Take(n int) bool {
	q.handed.Add(1)
	if !q.frozen.Load() {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return false
	}
	if q.queued += n; q.queued > FrozenQueue {
		q.closedAt.Store(time.Now().UnixNano())
		q.closed.Store(true)
		go q.Leave()
		return false
	}
	return true
}

// Backpressure is how a frozen consumer's effect on an unrelated flow
// across the same nodes is measured.
type Backpressure struct {
	Size       int // a measured message's length on arrival
	Rate       int // the measured flow's messages a second (offered)
	BesideRate int // the other flow's, to the Bounded consumer
	// Slack is how many messages the frozen consumer may be handed past
	// its bound before it must be closed (those in flight to it).
	Slack int
}

// Run is one round's case: the measured flow sends b.N messages to to at
// c.Rate a second with send, while sendOther sends c.BesideRate a second
// to other, which reads ("beside-reading", frozen false) or stops reading
// as the run starts ("beside-frozen"), fills its queue, is closed at its
// bound and leaves, while its sender keeps sending. Reported: the measured
// flow's achieved rate (all its messages over the time to the last one's
// arrival) and that rate over the offered one (the goal: within 10% with
// the consumer frozen), and max-lag-ms, the most a message arrived after
// its paced send was due (a stall caught up by the end shows here); closed, 1 if the frozen consumer was closed (a run
// too short for its queue to fill, such as go test's first of one
// message, measured no back-pressure), and close-ms, when after the
// freeze; beside-msgs, what the other consumer was handed.
func (c Backpressure) Run(b *testing.B, frozen bool, to *Receiver, send func(), other *Bounded, sendOther func()) {
	p := NewProbe(c.Size, b.N, false)
	p.stamped, p.every = true, 1e9/float64(c.Rate)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	if frozen {
		other.Freeze()
	}
	b.ResetTimer()
	wg.Go(func() { Paced(c.BesideRate, 0, sendOther, stop) })
	start := time.Now()
	p.start = float64(start.UnixNano())
	defer to.measure(p)()
	Paced(c.Rate, b.N, send, stop)
	// Paced: the last message was due at (b.N-1)/Rate; a flow that keeps
	// up delivers it a hop's latency later.
	deadline := start.Add(time.Duration(b.N)*time.Second/time.Duration(c.Rate) + 10*time.Second)
	for p.Count() < int64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages delivered", p.Count(), b.N)
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	elapsed := time.Duration(p.last.Load() - start.UnixNano())
	offered := float64(c.Rate)
	achieved := offered
	if b.N > 1 {
		// n messages paced span n-1 intervals from the first send.
		achieved = float64(b.N-1) / elapsed.Seconds()
	}
	closed := other.closed.Load()
	if frozen && !closed && other.handed.Load() > int64(FrozenQueue/c.Size+c.Slack) {
		b.Fatalf("the frozen consumer was handed %d messages, past its bound, and not closed", other.handed.Load())
	}
	b.ReportMetric(achieved, "msgs/s")
	b.ReportMetric(achieved/offered, "achieved/offered")
	b.ReportMetric(float64(p.maxLag.Load())/1e6, "max-lag-ms")
	b.ReportMetric(map[bool]float64{false: 0, true: 1}[closed], "closed")
	if closed {
		b.ReportMetric(float64(other.closedAt.Load()-other.frozenAt.Load())/1e6, "close-ms")
	}
	b.ReportMetric(float64(other.handed.Load()), "beside-msgs")
}
