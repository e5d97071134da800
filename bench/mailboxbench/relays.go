// Package mailboxbench measures the mailbox relay (fastpath/mailbox) beside
// the yardsticks DESIGN.md names, each measured in the same run on the same
// machine, so that the ratios, not the absolute figures, are what counts:
//
//   - ComparePinned, what `make bench` reports: HEAD of a direction and GET
//     of one envelope against the plain net/http baseline in
//     bench/baseline/mailbox, and envelope PUTs synced before their 201
//     against raw Pebble commits of the same key and value sizes with
//     pebble.Sync, each server a process of its own (cmd/mailboxserve)
//     pinned to one core and the load generator to another: requests per
//     server CPU-second, and the share of the disk's synced-write ceiling
//     the request path keeps.
//   - ComparePut and CompareReads: the same in one process over loopback,
//     server and load generator sharing the cores (quicker to run; their
//     benchmarks, BenchmarkPut and BenchmarkRead, use them).
//   - BenchmarkServeHTTP: the HEAD and GET handlers called directly.
//   - CompareWatchMemory: the memory one idle watch socket costs, ours and
//     the baseline's, each in a server process of its own
//     (cmd/watchmem) holding thousands of sockets.
//
// Each comparison alternates the two sides round by round (package abtest)
// and reports medians over the counted rounds.
package mailboxbench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	baseline "edgerelay/bench/baseline/mailbox"
	"edgerelay/bench/relayserve"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

// The benchmark's app, bearer and mailboxes are relayserve's, shared with
// the signal benchmark.
const (
	app   = relayserve.App
	token = relayserve.Token
)

func mailboxID(i int) string   { return relayserve.MailboxID(i) }
func mailboxPath(i int) string { return relayserve.MailboxPath(i) }

// mailboxName is the store's name of the i-th mailbox, "<app>/<id>".
func mailboxName(i int) string { return app + "/" + mailboxID(i) }

// envelope writes an envelope of size bytes (at least 25) with sequence
// seq into dst's storage: the relay checks only the version byte and the
// sequence, so the ciphertext is filler.
func envelope(dst []byte, seq uint64, size int) []byte {
	dst = append(dst[:0], make([]byte, size)...)
	dst[0] = 0x01
	binary.BigEndian.PutUint64(dst[1:9], seq)
	// The rest stands for AES-GCM ciphertext and tag: bytes that look
	// random, so that the store's compression sees what it would see in
	// production (a repeating pattern would flatter snappy). xorshift64,
	// seeded by the sequence: cheap and the same on every side.
	x := seq*0x9e3779b97f4a7c15 | 1
	for i := 9; i < size; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		dst[i] = byte(x >> 56)
	}
	return dst
}

// newStepClock is the relays' clock in these benchmarks (see
// relayserve.StepClock): every reading moves it one second on, so every
// request finds its mailbox's rate-limit buckets refilled (2 envelopes and
// 4 fetches per second). That holds as long as no two requests in flight
// share a mailbox (see readOp): every writer and every connection has
// mailboxes of its own. The relays' idle timeout is set far beyond what a
// run can reach on this clock.
func newStepClock() *relayserve.StepClock { return relayserve.NewStepClock(time.Second) }

// relay is one server under test, listening on loopback.
type relay struct {
	name  string
	addr  string // host:port
	close func() error
}

func fromServe(r *relayserve.Relay) *relay { return &relay{name: r.Name, addr: r.Addr, close: r.Close} }

// ourHandler is the mailbox handler as the binary configures it, but for
// the clock and the idle timeout (see newStepClock), the touch interval
// and the per-direction caps, lifted so that rounds of synced writes into
// one mailbox never fill it: the cap checks still run on every write. The
// touch interval is lifted because the step clock moves a second per
// reading: with 64 writers a minute passed between two writes of one
// mailbox, so every write also stored the mailbox's record (three more
// keys in its batch), where with a real clock a mailbox written
// thousands of times a second stores it once a minute.
func ourHandler(log *store.EnvelopeLog, now func() time.Time, envelopeCache int) (*mailbox.Handler, error) {
	st, err := mailboxlocal.New(mailboxlocal.Config{
		Log: log,
		Limits: store.MailboxLimits{
			Idle:           relayserve.IdleForever,
			TouchEvery:     relayserve.IdleForever,
			MaxStored:      1 << 30,
			MaxStoredBytes: 1 << 40,
		},
		EnvelopeCache: envelopeCache,
	})
	if err != nil {
		return nil, err
	}
	return mailbox.New(mailbox.Config{
		Store:         st,
		Apps:          map[string]mailbox.App{app: {Name: app}},
		Now:           now,
		DetachSockets: true, // as the binary serves them
	})
}

// loopback is where the in-process comparisons listen.
const loopback = relayserve.Loopback

// startOurs serves, on addr, our handler as the binary does
// (relayserve.Mailbox: fastpath/server with the binary's buffer sizes,
// timeouts and JSON error answers, and no connection caps), with an
// envelope cache of envelopeCache bytes (mailboxlocal.Config.EnvelopeCache:
// 0 the default, negative none).
func startOurs(addr string, log *store.EnvelopeLog, now func() time.Time, envelopeCache int) (*relay, *mailbox.Handler, error) {
	h, err := ourHandler(log, now, envelopeCache)
	if err != nil {
		return nil, nil, err
	}
	r, err := relayserve.Mailbox(addr, h)
	if err != nil {
		return nil, nil, err
	}
	return fromServe(r), h, nil
}

// startBaseline serves the net/http baseline with the same timeouts and
// header limit.
func startBaseline(addr string, log *store.EnvelopeLog, now func() time.Time) (*relay, *baseline.Handler, error) {
	h := baseline.New(baseline.Config{Store: log, Apps: []string{app}, Now: now})
	r, err := relayserve.Baseline("baseline", addr, h, nil, h.CloseSockets)
	if err != nil {
		return nil, nil, err
	}
	return fromServe(r), h, nil
}

// seed claims mailboxes 0..n-1 with the benchmark token straight in the
// store and stores envelopes 1..stored of size bytes in each one's p2c
// direction. Mailboxes are seeded concurrently so that their synced
// commits share syncs.
func seed(log *store.EnvelopeLog, now func() time.Time, n, stored, size int) error {
	hash := store.Hash(sha256.Sum256([]byte(token)))
	return serverproc.ForEach(context.Background(), n, 64, func(i int) error {
		name := mailboxName(i)
		rec := store.MailboxRecord{Token: hash, LastActive: now().UnixNano()}
		if err := log.Claim(name, rec, 0, true); err != nil {
			return err
		}
		var env []byte
		for seq := uint64(1); seq <= uint64(stored); seq++ {
			prev := rec.LastActive
			rec.LastActive = now().UnixNano()
			env = envelope(env, seq, size)
			if err := log.Put(name, store.DirP2C, seq, env, &rec, prev); err != nil {
				return err
			}
		}
		return nil
	})
}

// newClient is the load generator's HTTP client for one relay: fasthttp's
// keep-alive client, the same for both sides, allocation-free per request
// so that the client's share of the two cores stays small.
func newClient(addr string, conns int) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:                     addr,
		MaxConns:                 conns,
		ReadTimeout:              10 * time.Second,
		WriteTimeout:             10 * time.Second,
		NoDefaultUserAgentHeader: true,
	}
}

// load runs workers goroutines, each calling the op newOp made for it
// until d has passed, ctx ends or an op fails, and returns the completed
// ops per second over the time until the last worker stopped.
func load(ctx context.Context, d time.Duration, workers int, newOp func(worker int) func() error) (float64, error) {
	var deadline time.Time
	return drive(ctx, workers, newOp, func() bool { return time.Now().Before(deadline) }, func(start time.Time) {
		deadline = start.Add(d)
	})
}

// loadN is load for exactly n ops in all, for benchmarks' b.N.
func loadN(ctx context.Context, n, workers int, newOp func(worker int) func() error) (float64, error) {
	var left atomic.Int64
	left.Store(int64(n))
	return drive(ctx, workers, newOp, func() bool { return left.Add(-1) >= 0 }, func(time.Time) {})
}

// drive makes every worker's op first (dials, buffers), calls started
// with the start time, then runs the workers while more says so.
func drive(ctx context.Context, workers int, newOp func(worker int) func() error, more func() bool, started func(time.Time)) (float64, error) {
	ops := make([]func() error, workers)
	for w := range ops {
		ops[w] = newOp(w)
	}
	counts := make([]int, workers)
	errs := make([]error, workers)
	start := time.Now()
	started(start)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for ctx.Err() == nil && more() {
				if err := ops[w](); err != nil {
					errs[w] = err
					break
				}
				n++
			}
			counts[w] = n
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return 0, err
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	return float64(total) / elapsed.Seconds(), nil
}
