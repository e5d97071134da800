// Package pushbench measures the mailbox relay's push fan-out end to end:
// envelopes written with X-Relay-Notify: alert over loopback HTTP into the
// real mailbox handler (fastpath/mailbox behind fastpath/server, as the
// binary serves it), each stored durably and then pushed by the handler's
// push senders to a registered device, over HTTP/2 to the fake APNs of
// push/pushtest, which verifies every provider token and payload.
//
// Many mailboxes each register a device of their own through the real
// registration endpoint (sealed at rest under the bearer, as in
// production), so every push reads and opens a registration. Everything
// runs in one process: the CPU figures include the writers' HTTP client,
// the synced envelope writes and the fake provider, so they understate
// the push path's own throughput. There is no baseline; DESIGN.md sets a
// floor of pushes per second per core.
package pushbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"edgerelay/bench/relayserve"
	"edgerelay/fastpath/mailbox"
	"edgerelay/push/apns"
	"edgerelay/push/pushtest"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

// The benchmark's app and the bearer every mailbox is claimed with
// (relayserve's, as in the other mailbox benchmarks), its APNs topic and
// the provider credentials the fake expects.
const (
	app    = relayserve.App
	token  = relayserve.Token
	topic  = "com.example.chat"
	teamID = "TEAM123456"
	keyID  = "KEY1234567"
	// envelopeSize is a short chat message sealed: 25 bytes of envelope
	// framing around about a hundred of text.
	envelopeSize = 128
)

// Options shape a rig. Zero fields take the defaults.
type Options struct {
	// Mailboxes is how many mailboxes, each with its own registered
	// device, the writes spread over. Default DefaultMailboxes.
	Mailboxes int
	// Writers is the concurrent writers, each with mailboxes of its own
	// and one request in flight. Default DefaultWriters.
	Writers int
}

// The defaults of Options, which BenchmarkPushFanout uses.
const (
	DefaultMailboxes = 256
	DefaultWriters   = 32
)

// Rig is one mailbox relay with push on, its fake APNs, and the writers'
// client.
type Rig struct {
	APNs   *pushtest.FakeAPNs
	o      Options
	addr   string
	client *fasthttp.HostClient
	reg    *prometheus.Registry
	// seqs[i] is the last envelope sequence written to mailbox i; each
	// mailbox belongs to one writer, so only that writer touches it.
	seqs []uint64
	env  []byte // the envelope's filler, sequence patched per write
}

// The relay's clock here is a step clock (relayserve.StepClock) moving two
// seconds per reading, so that every write finds its mailbox's envelope
// bucket (2 per second) and its direction's push bucket (1 per 2 seconds)
// refilled and no push is skipped for a rate limit, while both buckets are
// still consulted on every write as in production. Each writer owns its
// mailboxes, so no two writes in flight share a bucket.
const clockStep = 2 * time.Second

// NewRig starts a relay with o.Mailboxes claimed mailboxes, each with an
// APNs device registered on its p2c direction; it stops when tb ends.
func NewRig(tb testing.TB, o Options) *Rig {
	tb.Helper()
	if o.Mailboxes <= 0 {
		o.Mailboxes = DefaultMailboxes
	}
	if o.Writers <= 0 {
		o.Writers = DefaultWriters
	}
	if o.Writers > o.Mailboxes {
		tb.Fatalf("pushbench: %d writers for %d mailboxes: each writer needs one of its own", o.Writers, o.Mailboxes)
	}
	p8, priv := pushtest.NewAPNsKey(tb)
	fake := pushtest.NewAPNs(tb, teamID, keyID, &priv.PublicKey)
	fake.RequireTopic(topic)
	ac, err := apns.New(apns.Config{KeyFile: pushtest.WriteFile(tb, "AuthKey.p8", p8), KeyID: keyID, TeamID: teamID,
		BaseURL: fake.URL(), RootCAs: fake.RootCAs()})
	if err != nil {
		tb.Fatal(err)
	}
	db, err := store.Open(tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	clock := relayserve.NewStepClock(clockStep)
	reg := prometheus.NewRegistry()
	st, err := mailboxlocal.New(mailboxlocal.Config{
		Log: store.NewEnvelopeLog(db),
		Limits: store.MailboxLimits{
			Idle:           relayserve.IdleForever,
			MaxStored:      1 << 30, // rounds never fill a direction
			MaxStoredBytes: 1 << 40,
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	h, err := mailbox.New(mailbox.Config{
		Store: st,
		Apps:  map[string]mailbox.App{app: {Name: app, PushTopic: topic}},
		// Production logging, written nowhere: its cost is part of a push.
		Log:           slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Metrics:       mailbox.NewMetrics(reg),
		Push:          mailbox.Pushers{APNs: ac},
		DetachSockets: true,
		Now:           clock.Now,
	})
	if err != nil {
		tb.Fatal(err)
	}
	l, err := relayserve.Mailbox("", h)
	if err != nil {
		tb.Fatal(err)
	}
	// The push senders alone: the sweeper's once-a-minute work is not
	// part of a push, and on the step clock it would evict the mailboxes
	// from memory between writes.
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		h.SendPushes(ctx)
	}()
	r := &Rig{APNs: fake, o: o, addr: l.Addr, reg: reg, seqs: make([]uint64, o.Mailboxes)}
	r.client = &fasthttp.HostClient{Addr: r.addr, MaxConns: o.Writers, ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Second}
	r.env = make([]byte, envelopeSize)
	r.env[0] = 0x01
	for i := 9; i < envelopeSize; i++ {
		r.env[i] = byte(i * 131)
	}
	tb.Cleanup(func() {
		r.client.CloseIdleConnections()
		_ = l.Close()
		cancel()
		<-sent
		ac.Close()
		_ = db.Close()
	})
	for i := range o.Mailboxes {
		if err := r.do("PUT", mailboxPath(i), nil, "", fasthttp.StatusCreated); err != nil {
			tb.Fatal(err)
		}
		reg := fmt.Appendf(nil, `{"service":"apns","token":"%064x","environment":"production","tag":"t%d","alert":"New message"}`, i+1, i)
		if err := r.do("PUT", mailboxPath(i)+"/p2c/push", reg, "", fasthttp.StatusNoContent); err != nil {
			tb.Fatal(err)
		}
	}
	return r
}

func mailboxPath(i int) string { return relayserve.MailboxPath(i) }

// do sends one request with the bearer and checks its status.
func (r *Rig) do(method, path string, body []byte, notify string, want int) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + r.addr + path)
	req.Header.Set("Authorization", "Bearer "+token)
	if notify != "" {
		req.Header.Set("X-Relay-Notify", notify)
	}
	if body != nil {
		req.Header.SetContentType("application/octet-stream")
		req.SetBodyRaw(body)
	}
	if err := r.client.Do(req, resp); err != nil {
		return fmt.Errorf("pushbench: %s %s: %w", method, path, err)
	}
	if resp.StatusCode() != want {
		return fmt.Errorf("pushbench: %s %s: %d %s, want %d", method, path, resp.StatusCode(), resp.Body(), want)
	}
	return nil
}

// window is the most pushes the writers leave outstanding (written and
// neither sent nor skipped yet), a quarter of the relay's push queue:
// writes are faster than pushes on most disks, and unpaced writers would
// fill the queue and have pushes skipped, which would measure writes
// that push nothing. The writers wait for the push senders instead.
const window = 256

// Write makes n envelope writes with X-Relay-Notify: alert, shared evenly
// among the writers, each writer cycling through its own mailboxes, and
// returns when every write has been answered 201 (the pushes follow
// asynchronously, at most window of them behind).
func (r *Rig) Write(n int) error {
	p, err := r.startPacer()
	if err != nil {
		return err
	}
	defer p.stop()
	errs := make([]error, r.o.Writers)
	var wg sync.WaitGroup
	for w := range r.o.Writers {
		quota := n / r.o.Writers
		if w < n%r.o.Writers {
			quota++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = r.writer(w, quota, p)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// writer is one writer's loop: quota writes, each to the next of its
// mailboxes with that mailbox's next sequence, one request reused
// throughout.
func (r *Rig) writer(w, quota int, p *pacer) error {
	var req fasthttp.Request
	var resp fasthttp.Response
	req.Header.SetMethod(fasthttp.MethodPut)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Relay-Notify", "alert")
	req.Header.SetContentType("application/octet-stream")
	env := append([]byte(nil), r.env...)
	var paths [][]byte
	for i := w; i < r.o.Mailboxes; i += r.o.Writers {
		paths = append(paths, []byte("http://"+r.addr+mailboxPath(i)+"/p2c/"))
	}
	var uri []byte
	for k := range quota {
		p.admit()
		j := k % len(paths)
		i := w + j*r.o.Writers
		r.seqs[i]++
		seq := r.seqs[i]
		binary.BigEndian.PutUint64(env[1:9], seq)
		uri = strconv.AppendUint(append(uri[:0], paths[j]...), seq, 10)
		req.SetRequestURIBytes(uri)
		req.SetBodyRaw(env)
		if err := r.client.Do(&req, &resp); err != nil {
			return fmt.Errorf("pushbench: PUT %s: %w", uri, err)
		}
		if resp.StatusCode() != fasthttp.StatusCreated {
			return fmt.Errorf("pushbench: PUT %s: %d %s", uri, resp.StatusCode(), resp.Body())
		}
	}
	return nil
}

// pacer holds writers back while window pushes are outstanding. It learns
// how many pushes are done from the relay's metrics, read every
// millisecond by a goroutine of its own (a read costs a few dozen
// allocations: a thousandth of the pushes' own).
type pacer struct {
	mu       sync.Mutex
	cond     sync.Cond
	admitted int     // writes let through
	done     float64 // pushes that ended, as of the last reading
	base     float64 // pushes that had ended when the pacer started
	quit     chan struct{}
	stopped  chan struct{}
}

func (r *Rig) startPacer() (*pacer, error) {
	base, err := r.ended()
	if err != nil {
		return nil, err
	}
	p := &pacer{base: base, done: base, quit: make(chan struct{}), stopped: make(chan struct{})}
	p.cond.L = &p.mu
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
			}
			done, err := r.ended()
			if err != nil {
				continue
			}
			p.mu.Lock()
			if done != p.done {
				p.done = done
				p.cond.Broadcast()
			}
			p.mu.Unlock()
		}
	}()
	return p, nil
}

// admit waits until fewer than window pushes are outstanding.
func (p *pacer) admit() {
	p.mu.Lock()
	for float64(p.admitted)-(p.done-p.base) >= window {
		p.cond.Wait()
	}
	p.admitted++
	p.mu.Unlock()
}

func (p *pacer) stop() {
	close(p.quit)
	<-p.stopped
}

// ended is the pushes that have ended so far, whatever the outcome.
func (r *Rig) ended() (float64, error) {
	p, err := r.Pushes()
	if err != nil {
		return 0, err
	}
	n := 0.0
	for outcome, v := range p {
		if outcome != "stale_removed" { // counted beside the refusal that caused it
			n += v
		}
	}
	return n, nil
}

// Pushes are the relay's push outcomes so far, from its metrics: "sent"
// (the provider said 200), and the skips ("queue_full", "rate_limited",
// "foreground") and failures ("failed", "refused", "unopenable", …).
// Outcomes that have not happened are left out (the relay exports every
// outcome's series from the start, at zero).
func (r *Rig) Pushes() (map[string]float64, error) {
	families, err := r.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "edgerelay_mailbox_pushes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && m.GetCounter().GetValue() > 0 {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// WaitSent waits until the relay has counted n pushes sent in all, or
// fails after timeout with what it counted instead.
func (r *Rig) WaitSent(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		p, err := r.Pushes()
		if err != nil {
			return err
		}
		if int(p["sent"]) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pushbench: %v pushes sent after %v, want %d (outcomes %v)", p["sent"], timeout, n, p)
		}
		time.Sleep(time.Millisecond)
	}
}

// CPUTime is the process's user plus system CPU time so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
