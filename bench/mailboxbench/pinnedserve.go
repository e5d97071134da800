package mailboxbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"edgerelay/store"
)

// ServeOptions are what cmd/mailboxserve serves, from its flags.
type ServeOptions struct {
	// Relay is "ours" (fastpath/mailbox through fastpath/server, as the
	// binary serves it), "baseline" (bench/baseline/mailbox on net/http)
	// or "pebble" (no server: raw Pebble synced commits on command, the
	// PUT comparison's ceiling).
	Relay string
	// Dir is the data directory; it must not hold another process's store.
	Dir string
	// Listen is the relay's host:port ("127.0.0.1:0" for any port).
	Listen string
	// Mailboxes are claimed at start-up with the benchmark token, and
	// Stored envelopes of EnvelopeSize bytes put into each one's p2c
	// direction, before "ready" is written.
	Mailboxes, Stored, EnvelopeSize int
	// CPUProfile, when set, is where SIGUSR1 profiling goes: the first
	// SIGUSR1 starts a CPU profile, the next one stops it and writes the
	// file, and so on; a profile still running at exit is written then.
	CPUProfile string
	// MaxLife bounds the process's life, whatever its standard input does.
	MaxLife time.Duration
}

// ServePinned is cmd/mailboxserve, the server process of ComparePinned: it opens a store in c.Dir, seeds it, serves
// the relay c.Relay names on c.Listen with the benchmarks' step clock
// (so that the mailboxes' rate limits never refuse a benchmark, while
// still being consulted on every request), writes "ready <addr>" to out
// ("ready -" for pebble), then answers commands read from in, one per
// line, each with one line:
//
//	gc                   a full collection, then "ok"
//	mem                  "ok <heap allocations so far> <GC cycles so far>"
//	profile <file>       starts a CPU profile into file, "ok"
//	profile-stop         stops it and writes the file, "ok"
//	put <writers> <d>    pebble only: writers goroutines commit one synced
//	                     batch after another for duration d (each writer
//	                     its own keys, sequences rising across commands);
//	                     "ok <commits> <elapsed ns>"
//
// It stops when in ends, on SIGINT or SIGTERM, or after c.MaxLife.
func ServePinned(c ServeOptions, in io.Reader, out io.Writer) (err error) {
	if c.EnvelopeSize == 0 {
		c.EnvelopeSize = 1024
	}
	if c.MaxLife == 0 {
		c.MaxLife = 30 * time.Minute
	}
	if c.Dir == "" {
		return errors.New("mailboxserve: no data directory (-dir)")
	}
	if c.EnvelopeSize < 25 || c.EnvelopeSize > 65536 {
		return fmt.Errorf("mailboxserve: envelope size %d is not an envelope's (25 to 65,536 bytes)", c.EnvelopeSize)
	}
	var prof profiler
	defer func() { err = errors.Join(err, prof.stop()) }()
	if c.CPUProfile != "" {
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		go func() {
			for range usr1 {
				if err := prof.toggle(c.CPUProfile); err != nil {
					fmt.Fprintln(os.Stderr, "mailboxserve:", err)
				}
			}
		}()
	}

	var (
		addr = "-"
		put  func(writers int, d time.Duration) (uint64, time.Duration, error)
	)
	switch c.Relay {
	case "ours", "baseline":
		db, err := store.Open(c.Dir, nil)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()
		log := store.NewEnvelopeLog(db)
		clock := newStepClock()
		if err := seed(log, clock.Now, c.Mailboxes, c.Stored, c.EnvelopeSize); err != nil {
			return err
		}
		var r *relay
		if c.Relay == "ours" {
			r, _, err = startOurs(c.Listen, log, clock.Now)
		} else {
			r, _, err = startBaseline(c.Listen, log, clock.Now)
		}
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, r.close()) }()
		addr = r.addr
	case "pebble":
		raw, err := pebble.Open(filepath.Join(c.Dir, "raw"), &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, raw.Close()) }()
		put = rawWriters(raw, c.EnvelopeSize)
	default:
		return fmt.Errorf("mailboxserve: relay %q: want ours, baseline or pebble", c.Relay)
	}

	if _, err := fmt.Fprintf(out, "ready %s\n", addr); err != nil {
		return err
	}
	lines := make(chan string)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	deadline := time.NewTimer(c.MaxLife)
	defer deadline.Stop()
	for {
		var line string
		select {
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			line = l
		case <-stop:
			return nil
		case <-deadline.C:
			return fmt.Errorf("mailboxserve: still running after %v: stopping", c.MaxLife)
		}
		answer, err := command(line, &prof, put)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%s\n", answer); err != nil {
			return err
		}
	}
}

// command answers one command line.
func command(line string, prof *profiler, put func(int, time.Duration) (uint64, time.Duration, error)) (string, error) {
	cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch cmd {
	case "":
		return "ok", nil
	case "gc":
		runtime.GC()
		return "ok", nil
	case "mem":
		s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/cycles/total:gc-cycles"}}
		metrics.Read(s)
		return fmt.Sprintf("ok %d %d", s[0].Value.Uint64(), s[1].Value.Uint64()), nil
	case "profile":
		return "ok", prof.start(arg)
	case "profile-stop":
		return "ok", prof.stop()
	case "put":
		if put == nil {
			return "", errors.New("mailboxserve: put: only the pebble relay writes on command")
		}
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
		return fmt.Sprintf("ok %d %d", n, elapsed.Nanoseconds()), nil
	}
	return "", fmt.Errorf("mailboxserve: unknown command %q", line)
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

// profiler is at most one CPU profile at a time.
type profiler struct {
	mu sync.Mutex
	f  *os.File
}

func (p *profiler) start(file string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f != nil {
		return errors.New("mailboxserve: a CPU profile is already running")
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return errors.Join(err, f.Close())
	}
	p.f = f
	return nil
}

func (p *profiler) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := p.f.Close()
	p.f = nil
	return err
}

func (p *profiler) toggle(file string) error {
	p.mu.Lock()
	running := p.f != nil
	p.mu.Unlock()
	if running {
		return p.stop()
	}
	return p.start(file)
}
