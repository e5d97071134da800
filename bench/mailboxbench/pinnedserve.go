package mailboxbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"edgerelay/bench/serverproc"
	"edgerelay/store"
)

// ServeOptions are what cmd/mailboxserve serves, from its flags.
type ServeOptions struct {
	// Relay is "ours" (fastpath/mailbox through fastpath/server, as the
	// binary serves it), "baseline" (bench/baseline/mailbox on net/http)
	// "floor" (the least an HTTP/1.1 server can do per request, see
	// floorServer), "floorput" (the same plus raw Pebble's synced commit
	// of each request's body: the least an HTTP server can do per synced
	// write) or "pebble" (no server: raw Pebble synced commits on command,
	// the PUT comparison's ceiling).
	Relay string
	// Dir is the data directory; it must not hold another process's store.
	Dir string
	// Listen is the relay's host:port ("127.0.0.1:0" for any port).
	Listen string
	// Mailboxes are claimed at start-up with the benchmark token, and
	// Stored envelopes of EnvelopeSize bytes put into each one's p2c
	// direction, before "ready" is written.
	Mailboxes, Stored, EnvelopeSize int
	// EnvelopeCache is ours' mailboxlocal.Config.EnvelopeCache (0: the
	// default, as serve runs; negative: none, every GET a first read).
	EnvelopeCache int
	// CPUProfile and MaxLife are serverproc.ServeOptions'.
	CPUProfile string
	MaxLife    time.Duration
}

// ServePinned is cmd/mailboxserve, the server process of ComparePinned: it
// opens a store in c.Dir, seeds it, serves the relay c.Relay names on
// c.Listen with the benchmarks' step clock (so that the mailboxes' rate
// limits never refuse a benchmark, while still being consulted on every
// request), then serves serverproc's commands (serverproc.Serve: "ready
// <addr>", "ready -" for pebble, then gc, usage, mem, profile, …) and one
// of its own:
//
//	put <writers> <d>    pebble only: writers goroutines commit one synced
//	                     batch after another for duration d (each writer
//	                     its own keys, sequences rising across commands);
//	                     "ok <commits> <elapsed ns>"
//	settle               every relay with a store: wait until Pebble has
//	                     no flush or compaction running (settleCommand);
//	                     "ok <waited ns>"
//
// It stops when in ends, on SIGINT or SIGTERM, or after c.MaxLife.
func ServePinned(c ServeOptions, in io.Reader, out io.Writer) (err error) {
	if c.EnvelopeSize == 0 {
		c.EnvelopeSize = 1024
	}
	if c.Dir == "" {
		return errors.New("mailboxserve: no data directory (-dir)")
	}
	if c.EnvelopeSize < 25 || c.EnvelopeSize > 65536 {
		return fmt.Errorf("mailboxserve: envelope size %d is not an envelope's (25 to 65,536 bytes)", c.EnvelopeSize)
	}
	addr := "-"
	commands := serverproc.Commands{}
	// The processes that commit to Pebble run with the Ps the relay runs
	// with (store.EnsureProcs, as serve does): at least two, unless the
	// benchmark sets GOMAXPROCS. The net/http baseline and the HEAD floor
	// keep Go's default, one P on one pinned core, their best (measured:
	// net/http 13 µs CPU per HEAD with one P, 17 µs with two).
	switch c.Relay {
	case "ours", "floorput", "pebble":
		store.EnsureProcs()
	}
	switch c.Relay {
	case "ours", "baseline":
		db, err := store.Open(c.Dir, nil)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()
		commands["settle"] = settleCommand(db.Busy)
		log := store.NewEnvelopeLog(db)
		clock := newStepClock()
		if err := seed(log, clock.Now, c.Mailboxes, c.Stored, c.EnvelopeSize); err != nil {
			return err
		}
		var r *relay
		if c.Relay == "ours" {
			r, _, err = startOurs(c.Listen, log, clock.Now, c.EnvelopeCache)
		} else {
			r, _, err = startBaseline(c.Listen, log, clock.Now)
		}
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, r.close()) }()
		addr = r.addr
	case "floor", "floorput":
		var raw *pebble.DB
		if c.Relay == "floorput" {
			if raw, err = pebble.Open(filepath.Join(c.Dir, "raw"), &pebble.Options{Logger: quietPebble{}}); err != nil {
				return err
			}
			defer func() { err = errors.Join(err, raw.Close()) }()
			commands["settle"] = settleCommand(func() bool { return store.PebbleBusy(raw) })
		}
		f, err := startFloor(c.Listen, raw)
		if err != nil {
			return err
		}
		// The floor stops (every commit done) before Pebble closes.
		defer func() { err = errors.Join(err, f.close()) }()
		addr = f.addr()
	case "pebble":
		raw, err := pebble.Open(filepath.Join(c.Dir, "raw"), &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, raw.Close()) }()
		commands["put"] = putCommand(rawWriters(raw, c.EnvelopeSize))
		commands["settle"] = settleCommand(func() bool { return store.PebbleBusy(raw) })
	default:
		return fmt.Errorf("mailboxserve: relay %q: want ours, baseline, floor, floorput or pebble", c.Relay)
	}
	return serverproc.Serve(serverproc.ServeOptions{Ready: addr, MaxLife: c.MaxLife, Commands: commands, CPUProfile: c.CPUProfile}, in, out)
}

// settleCommand answers "settle" once busy (a Pebble flush or compaction
// in progress) has stayed false for settleQuiet, or after settleLimit at
// most: "ok <waited ns>". The PUT comparison settles every server before
// each measured round, so that no process's background work from earlier
// rounds runs on the shared server core during another's round.
func settleCommand(busy func() bool) func(string) (string, error) {
	return func(string) (string, error) {
		start := time.Now()
		quietSince := start
		for time.Since(start) < settleLimit {
			if busy() {
				quietSince = time.Now()
			} else if time.Since(quietSince) >= settleQuiet {
				break
			}
			time.Sleep(settlePoll)
		}
		return strconv.FormatInt(int64(time.Since(start)), 10), nil
	}
}

// How settleCommand waits: polls every settlePoll until settleQuiet has
// passed with nothing running, giving up after settleLimit (the report
// then measures with the work still running, as production would).
const (
	settlePoll  = 5 * time.Millisecond
	settleQuiet = 50 * time.Millisecond
	settleLimit = 20 * time.Second
)

// putCommand answers "put <writers> <duration>" with put's commits and
// elapsed nanoseconds.
func putCommand(put func(int, time.Duration) (uint64, time.Duration, error)) func(string) (string, error) {
	return func(arg string) (string, error) {
		ws, ds, _ := strings.Cut(arg, " ")
		writers, err := strconv.Atoi(ws)
		if err != nil || writers < 1 {
			return "", fmt.Errorf("mailboxserve: put: writers %q", ws)
		}
		d, err := time.ParseDuration(ds)
		if err != nil || d <= 0 {
			return "", fmt.Errorf("mailboxserve: put: duration %q", ds)
		}
		n, elapsed, err := put(writers, d)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d %d", n, elapsed.Nanoseconds()), nil
	}
}

// rawWriters is the pebble relay's put command: writer w commits, one
// after another, batches of one Set each with pebble.Sync (rawOp, as
// ComparePut's Pebble side), its sequences rising from one command to the
// next.
func rawWriters(db *pebble.DB, size int) func(int, time.Duration) (uint64, time.Duration, error) {
	var next []uint64
	return func(writers int, d time.Duration) (uint64, time.Duration, error) {
		for len(next) < writers {
			next = append(next, 0)
		}
		counts := make([]uint64, writers)
		start := time.Now()
		_, err := load(context.Background(), d, writers, func(w int) func() error {
			op := rawOp(db, w, &next[w], size)
			return func() error {
				err := op()
				counts[w]++
				return err
			}
		})
		elapsed := time.Since(start)
		var n uint64
		for _, c := range counts {
			n += c
		}
		return n, elapsed, err
	}
}
