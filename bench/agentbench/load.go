package agentbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Direction names.
const (
	toClient   = "to client"
	toInstance = "to instance"
)

// window bounds the frames in flight between the writers and the readers
// of a throughput run, so that neither relay drops a client for reading
// too slowly: the runs measure routing, not queue overflow.
type window struct {
	mu    sync.Mutex
	cond  *sync.Cond
	avail int
	dead  bool
}

func newWindow(n int) *window {
	w := &window{avail: n}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// take waits for n credits; false once the run is over.
func (w *window) take(n int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.avail < n && !w.dead {
		w.cond.Wait()
	}
	w.avail -= n
	return !w.dead
}

func (w *window) give(n int) {
	w.mu.Lock()
	w.avail += n
	w.mu.Unlock()
	w.cond.Broadcast()
}

func (w *window) kill() {
	w.mu.Lock()
	w.dead = true
	w.mu.Unlock()
	w.cond.Broadcast()
}

// sample is what one measured run cost.
type sample struct {
	frames  int
	wall    time.Duration
	cpu     time.Duration // user + system time of the relay's process
	mallocs uint64        // heap allocations of the relay's process
}

func (s sample) perSec() float64    { return float64(s.frames) / s.wall.Seconds() }
func (s sample) perCPUSec() float64 { return float64(s.frames) / s.cpu.Seconds() }
func (s sample) allocs() float64    { return float64(s.mallocs) / float64(s.frames) }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measured runs fn and records its wall time and what it cost the relay:
// the CPU time and allocations of t's process when it runs in one of its
// own, else of this whole process (the relay and the load generator,
// which allocates next to nothing). A collection first makes every run
// start with the same heap.
func measured(ctx context.Context, t *target, frames int, fn func() error) (sample, error) {
	if t.proc != nil {
		var wall time.Duration
		u, err := t.proc.Measure(ctx, func() error {
			t0 := time.Now()
			err := fn()
			wall = time.Since(t0)
			return err
		})
		return sample{frames: frames, wall: wall, cpu: u.CPU, mallocs: u.Mallocs}, err
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0, t0 := cpuTime(), time.Now()
	err := fn()
	wall, cpu := time.Since(t0), cpuTime()-cpu0
	runtime.ReadMemStats(&after)
	return sample{frames: frames, wall: wall, cpu: cpu, mallocs: after.Mallocs - before.Mallocs}, err
}

// batch is how many frames one write carries in a throughput run, and
// inFlight how many frames may be on their way at once.
const (
	batch    = 32
	inFlight = 16 * batch
)

// runToClient has the instance send frames round-robin to every client as
// fast as the window allows, and the clients read them.
func runToClient(ctx context.Context, r *rig, frames, size int) (sample, error) {
	n := len(r.clients)
	frames -= frames % (batch * n)
	var buf []byte
	for k := range batch * n {
		line, _ := instanceLine(r.t.instance, r.sessions[k%n], size)
		buf = append(buf, line...)
	}
	win := newWindow(inFlight * n)
	stop := context.AfterFunc(ctx, win.kill)
	defer stop()
	return measured(ctx, r.t, frames, func() error {
		errs := make(chan error, n+1)
		for _, c := range r.clients {
			go func() { errs <- readServerFrames(c, frames/n, win, nil) }()
		}
		go func() {
			for sent := 0; sent < frames; sent += batch * n {
				if !win.take(batch * n) {
					errs <- ctx.Err()
					return
				}
				if _, err := r.inst.conn.Write(buf); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
		return collect(errs, n+1, win)
	})
}

// runToInstance has every client send frames as fast as the window allows,
// and the instance read them.
func runToInstance(ctx context.Context, r *rig, frames, size int) (sample, error) {
	n := len(r.clients)
	frames -= frames % (batch * n)
	msg, _ := clientMessage(size)
	buf := bytes.Repeat(msg, batch)
	win := newWindow(inFlight * n)
	stop := context.AfterFunc(ctx, win.kill)
	defer stop()
	return measured(ctx, r.t, frames, func() error {
		errs := make(chan error, n+1)
		go func() { errs <- readLines(r.inst, frames, win, nil) }()
		for _, c := range r.clients {
			go func() {
				for sent := 0; sent < frames/n; sent += batch {
					if !win.take(batch) {
						errs <- ctx.Err()
						return
					}
					if _, err := c.conn.Write(buf); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		return collect(errs, n+1, win)
	})
}

// collect waits for n goroutines; the first error ends the run.
func collect(errs chan error, n int, win *window) error {
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
			win.kill()
		}
	}
	return first
}

// readServerFrames reads want text frames from a client's socket, giving
// credits back in batches. With lat set, each frame's payload is read and
// its latency recorded; otherwise it is skipped.
func readServerFrames(c *peer, want int, win *window, lat *latencies) error {
	credit := 0
	var payload []byte
	for got := 0; got < want; got++ {
		op, n, err := c.readServerFrame()
		if err != nil {
			return err
		}
		if op != 0x1 {
			return fmt.Errorf("client got opcode %d", op)
		}
		if lat == nil {
			if _, err := c.br.Discard(n); err != nil {
				return err
			}
		} else {
			payload = slices.Grow(payload[:0], n)[:n]
			if _, err := io.ReadFull(c.br, payload); err != nil {
				return err
			}
			lat.record(payload)
		}
		if win != nil {
			if credit++; credit == batch || c.br.Buffered() == 0 {
				win.give(credit)
				credit = 0
			}
		}
	}
	return nil
}

// readLines reads want lines at the instance.
func readLines(p *peer, want int, win *window, lat *latencies) error {
	credit := 0
	for got := 0; got < want; {
		line, err := p.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if lat != nil {
				return errors.New("a line longer than the read buffer in a latency run")
			}
			continue
		}
		if err != nil {
			return err
		}
		if lat != nil {
			lat.record(line)
		}
		got++
		if win != nil {
			if credit++; credit == batch || p.br.Buffered() == 0 {
				win.give(credit)
				credit = 0
			}
		}
	}
	return nil
}

// latencies records, per sequence number, when a frame was sent and how
// long it took to arrive.
type latencies struct {
	start time.Time
	sent  []int64 // nanoseconds since start; written by the sender before the write
	took  []int64 // written by the one receiver of each frame
	mu    sync.Mutex
	stray int
}

func newLatencies(n int) *latencies {
	return &latencies{start: time.Now(), sent: make([]int64, n), took: make([]int64, n)}
}

func (l *latencies) now() int64 { return int64(time.Since(l.start)) }

func (l *latencies) record(frame []byte) {
	now := l.now()
	seq := findSeq(frame)
	if seq < 0 || seq >= len(l.sent) {
		l.mu.Lock()
		l.stray++
		l.mu.Unlock()
		return
	}
	atomic.StoreInt64(&l.took[seq], now-atomic.LoadInt64(&l.sent[seq]))
}

// quantiles returns the p50 and p99 of the recorded latencies.
func (l *latencies) quantiles() (p50, p99 time.Duration, n int) {
	v := make([]int64, 0, len(l.took))
	for i := range l.took {
		if d := atomic.LoadInt64(&l.took[i]); d > 0 {
			v = append(v, d)
		}
	}
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	at := func(q float64) time.Duration { return time.Duration(v[min(int(q*float64(len(v))), len(v)-1)]) }
	return at(0.50), at(0.99), len(v)
}

// tick is the pacing period of the latency runs: the sender wakes every
// tick and writes the frames that fell due since in one write, as a busy
// runtime streaming to many clients does. A frame's latency counts from
// that write, so the wait for the tick is the generator's, not the
// relay's. The period must be short, or the frames of one write queue
// behind each other at every stage and the run measures bursts instead of
// a steady rate; time.Sleep wakes a millisecond late here, so the pacer
// sleeps with nanosleep (sleepFor), which overshoots by about 70 µs.
const tick = 100 * time.Microsecond

// paced calls send(from, to) about once per tick with the frames due since
// the last call, so that frames go out at rate per second on average.
func paced(ctx context.Context, frames int, rate float64, send func(from, to int) error) error {
	start := time.Now()
	for next := 0; next < frames; {
		if err := ctx.Err(); err != nil {
			return err
		}
		elapsed := time.Since(start)
		due := min(int(elapsed.Seconds()*rate)+1, frames)
		if due > next {
			if err := send(next, due); err != nil {
				return err
			}
			next = due
		}
		sleepFor(tick - elapsed%tick)
	}
	return nil
}

// latencyToClient sends frames from the instance at rate for d, round-robin
// to the clients, and returns the one-way latencies through the relay.
func latencyToClient(ctx context.Context, r *rig, rate float64, d time.Duration, size int) (*latencies, error) {
	n := len(r.clients)
	frames := max(int(rate*d.Seconds())/n*n, n)
	lat := newLatencies(frames)
	lines := make([][]byte, n)
	slots := make([]int, n)
	for i := range n {
		lines[i], slots[i] = instanceLine(r.t.instance, r.sessions[i], size)
	}
	errs := make(chan error, n+1)
	for _, c := range r.clients {
		go func() { errs <- readServerFrames(c, frames/n, nil, lat) }()
	}
	var buf []byte
	go func() {
		errs <- paced(ctx, frames, rate, func(from, to int) error {
			buf = buf[:0]
			now := lat.now()
			for seq := from; seq < to; seq++ {
				c := seq % n
				putSeq(lines[c][slots[c]:], seq)
				buf = append(buf, lines[c]...)
				atomic.StoreInt64(&lat.sent[seq], now)
			}
			_, err := r.inst.conn.Write(buf)
			return err
		})
	}()
	return lat, waitAll(ctx, errs, n+1, r)
}

// latencyToInstance has the clients send at rate in all for d, round-robin
// from one pacer, and returns the one-way latencies through the relay.
func latencyToInstance(ctx context.Context, r *rig, rate float64, d time.Duration, size int) (*latencies, error) {
	n := len(r.clients)
	frames := max(int(rate*d.Seconds())/n*n, n)
	lat := newLatencies(frames)
	msgs := make([][]byte, n)
	slots := make([]int, n)
	bufs := make([][]byte, n)
	for i := range n {
		msgs[i], slots[i] = clientMessage(size)
	}
	errs := make(chan error, 2)
	go func() { errs <- readLines(r.inst, frames, nil, lat) }()
	go func() {
		errs <- paced(ctx, frames, rate, func(from, to int) error {
			for i := range bufs {
				bufs[i] = bufs[i][:0]
			}
			now := lat.now()
			for seq := from; seq < to; seq++ {
				c := seq % n
				putSeq(msgs[c][slots[c]:], seq)
				bufs[c] = append(bufs[c], msgs[c]...)
				atomic.StoreInt64(&lat.sent[seq], now)
			}
			for i, b := range bufs {
				if len(b) > 0 {
					if _, err := r.clients[i].conn.Write(b); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}()
	return lat, waitAll(ctx, errs, 2, r)
}

// waitAll waits for n goroutines; on the first error (or ctx's end) the
// rig's connections are closed so that the others return too.
func waitAll(ctx context.Context, errs chan error, n int, r *rig) error {
	var first error
	for range n {
		select {
		case err := <-errs:
			if err != nil && first == nil {
				first = err
				r.close()
			}
		case <-ctx.Done():
			if first == nil {
				first = ctx.Err()
				r.close()
			}
		}
	}
	return first
}

// directPair is two generator peers joined by one TLS 1.3 connection and
// no relay: the floor under the latency through a relay (the generator's
// pacing and reading, TLS, the kernel).
type directPair struct {
	w *tls.Conn
	r *peer
}

func newDirectPair(ctx context.Context, ts tlsSetup) (*directPair, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	accepted := make(chan *tls.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		tc := tls.Server(c, ts.server)
		if tc.HandshakeContext(ctx) != nil {
			tc.Close()
			tc = nil
		}
		accepted <- tc
	}()
	d := tls.Dialer{Config: ts.client}
	nc, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	sc := <-accepted
	if sc == nil {
		nc.Close()
		return nil, errors.New("agentbench: direct pair: handshake failed")
	}
	return &directPair{w: nc.(*tls.Conn), r: &peer{conn: sc, br: bufio.NewReaderSize(sc, 64<<10)}}, nil
}

func (p *directPair) close() {
	p.w.Close()
	p.r.conn.Close()
}

// latencyDirect paces lines like latencyToClient over the direct pair.
func latencyDirect(ctx context.Context, p *directPair, rate float64, d time.Duration, size int) (*latencies, error) {
	frames := max(int(rate*d.Seconds()), 1)
	lat := newLatencies(frames)
	line, slot := instanceLine("inst-direct", "att-direct", size)
	errs := make(chan error, 2)
	go func() { errs <- readLines(p.r, frames, nil, lat) }()
	var buf []byte
	go func() {
		errs <- paced(ctx, frames, rate, func(from, to int) error {
			buf = buf[:0]
			now := lat.now()
			for seq := from; seq < to; seq++ {
				putSeq(line[slot:], seq)
				buf = append(buf, line...)
				atomic.StoreInt64(&lat.sent[seq], now)
			}
			_, err := p.w.Write(buf)
			return err
		})
	}()
	var first error
	for range 2 {
		select {
		case err := <-errs:
			if err != nil && first == nil {
				first = err
				p.close()
			}
		case <-ctx.Done():
			p.close()
			return lat, ctx.Err()
		}
	}
	return lat, first
}
