package mailboxbench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	baseline "edgerelay/bench/baseline/mailbox"
	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
)

// WatchStats is what a watch-memory server reports of itself.
type WatchStats struct {
	// RSS is the resident set (VmRSS of /proc/self/status) after a
	// collection that gave freed memory back to the system.
	RSS uint64 `json:"rss"`
	// HeapInuse, StackInuse and Sys are runtime.MemStats' fields.
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Sys        uint64 `json:"sys"`
	Goroutines int    `json:"goroutines"`
	// Sockets is the watch sockets the handler holds.
	Sockets int `json:"sockets"`
}

// ServeWatchmem is the watch-memory server (cmd/watchmem): it serves our
// mailbox handler (impl "ours") or the baseline ("baseline") on a loopback
// port over a fresh store in a temporary directory, writes "ready <addr>"
// to out, then answers commands read from in, one per line:
//
//	count            {"sockets":n}, cheaply, to wait for sockets to arrive
//	stats            WatchStats as JSON, after a full collection
//	profile <file>   writes a heap profile to file, answers "ok"
//
// It stops when in ends or after maxLife, whichever comes first, so that
// a benchmark that dies cannot leave it behind. The relays use the real
// clock and the spec's ping (30 s) and silence (75 s) timers: sockets
// whose clients never answer a ping are closed after 75 s, which bounds
// how long a measurement may take.
func ServeWatchmem(impl string, in io.Reader, out io.Writer, maxLife time.Duration) (err error) {
	if err := raiseFileLimit(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "watchmem-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	db, err := store.Open(dir, nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	log := store.NewEnvelopeLog(db)

	var r *relay
	var open func() int
	switch impl {
	case "ours":
		var h *mailbox.Handler
		if r, h, err = startOurs(loopback, log, time.Now); err == nil {
			open = h.Open
		}
	case "baseline":
		var h *baseline.Handler
		if r, h, err = startBaseline(loopback, log, time.Now); err == nil {
			open = h.Open
		}
	default:
		return fmt.Errorf("watchmem: impl %q: want ours or baseline", impl)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.close()) }()

	if _, err := fmt.Fprintf(out, "ready %s\n", r.addr); err != nil {
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
	deadline := time.NewTimer(maxLife)
	defer deadline.Stop()
	for {
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
			if !ok {
				return nil
			}
		case <-deadline.C:
			return fmt.Errorf("watchmem: still running after %v: stopping", maxLife)
		}
		cmd, arg, _ := strings.Cut(line, " ")
		var answer []byte
		switch cmd {
		case "count":
			answer = fmt.Appendf(nil, `{"sockets":%d}`, open())
		case "stats":
			var s WatchStats
			s, err = selfStats()
			s.Sockets = open()
			if err == nil {
				answer, err = json.Marshal(s)
			}
		case "profile":
			err = writeHeapProfile(arg)
			answer = []byte("ok")
		default:
			err = fmt.Errorf("watchmem: unknown command %q", line)
		}
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%s\n", answer); err != nil {
			return err
		}
	}
}

// selfStats collects, gives freed memory back, and reads the process's
// resident set and the runtime's own accounts.
func selfStats() (WatchStats, error) {
	runtime.GC()
	debug.FreeOSMemory()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return WatchStats{}, err
	}
	var s WatchStats
	for line := range bytes.Lines(status) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, err := strconv.ParseUint(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			if err != nil {
				return WatchStats{}, fmt.Errorf("watchmem: VmRSS %q: %w", v, err)
			}
			s.RSS = kb << 10
		}
	}
	if s.RSS == 0 {
		return WatchStats{}, errors.New("watchmem: no VmRSS in /proc/self/status")
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.HeapInuse, s.StackInuse, s.Sys = ms.HeapInuse, ms.StackInuse, ms.Sys
	s.Goroutines = runtime.NumGoroutine()
	return s, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	return errors.Join(pprof.Lookup("heap").WriteTo(f, 0), f.Close())
}

// raiseFileLimit lifts the soft limit on open files to the hard one: ten
// thousand sockets need ten thousand descriptors on each side.
func raiseFileLimit() error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	return nil
}

// fileLimit is the soft limit on open files.
func fileLimit() (uint64, error) {
	var lim syscall.Rlimit
	err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur, err
}
