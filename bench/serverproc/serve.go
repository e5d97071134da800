// Package serverproc runs a server under test in a process of its own, the
// way every out-of-process comparison of `make bench` does: the server's
// program calls Serve, the benchmark starts it with Start (pinned to a
// core through package proccpu when asked) and talks to it over its
// standard input and output, one command per line and one answer per
// line.
//
// A process of its own is what makes a figure the server's alone: its CPU
// time, its heap allocations and its resident memory leave out the load
// generator's, and it can be pinned to a core that the load generator
// does not use. Dividing the work done in a window by the server's CPU
// time over the same window gives work per server CPU-second.
package serverproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Commands are what a server answers beyond the built-in commands, by
// command word: each gets the rest of the line and returns the answer's
// text, sent after "ok ". An error ends the server (and so the
// benchmark's run of it, which reads the error on its standard error).
type Commands map[string]func(arg string) (string, error)

// ServeOptions shape Serve.
type ServeOptions struct {
	// Ready follows "ready " on the first line: what the benchmark needs
	// to reach the server (its address, and whatever else the server
	// made at start-up, separated by spaces).
	Ready string
	// MaxLife bounds the process's life whatever its standard input
	// does, so that a benchmark that dies cannot leave it behind.
	// Default 30 minutes.
	MaxLife time.Duration
	// Commands are the server's own commands.
	Commands Commands
	// CPUProfile, when set, is where SIGUSR1 profiling goes: the first
	// SIGUSR1 starts a CPU profile, the next one stops it and writes the
	// file, and so on; a profile still running at exit is written then.
	CPUProfile string
}

// Serve is the body of a server process: it writes "ready <o.Ready>" to
// out, then answers each command line read from in with one line, "ok"
// followed by the answer's text if any:
//
//	gc                 a full collection
//	usage              "ok <heap objects allocated so far> <CPU ns so far>":
//	                   the process's allocations (MemStats.Mallocs) and
//	                   its user plus system time (getrusage, to the
//	                   microsecond, where /proc counts 10 ms ticks)
//	mem                "ok <Mem as JSON>", after a collection that gives
//	                   freed memory back to the system
//	profile <file>     starts a CPU profile into file
//	profile-stop       stops it and writes the file
//	heap-profile <file> writes a heap profile, after a collection
//
// and the commands in o.Commands. It returns when in ends, on SIGINT or
// SIGTERM, or after o.MaxLife (an error), and when a command fails.
func Serve(o ServeOptions, in io.Reader, out io.Writer) (err error) {
	if o.MaxLife == 0 {
		o.MaxLife = 30 * time.Minute
	}
	var prof profiler
	defer func() { err = errors.Join(err, prof.stop()) }()
	if o.CPUProfile != "" {
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		go func() {
			for range usr1 {
				if err := prof.toggle(o.CPUProfile); err != nil {
					fmt.Fprintln(os.Stderr, "serverproc:", err)
				}
			}
		}()
	}
	commands := Commands{
		"gc":    func(string) (string, error) { runtime.GC(); return "", nil },
		"usage": func(string) (string, error) { return usage(), nil },
		"mem": func(string) (string, error) {
			m, err := ReadMem()
			if err != nil {
				return "", err
			}
			b, err := json.Marshal(m)
			return string(b), err
		},
		"profile":      func(file string) (string, error) { return "", prof.start(file) },
		"profile-stop": func(string) (string, error) { return "", prof.stop() },
		"heap-profile": func(file string) (string, error) { return "", writeHeapProfile(file) },
	}
	for name, c := range o.Commands {
		commands[name] = c
	}

	if _, err := fmt.Fprintf(out, "ready %s\n", o.Ready); err != nil {
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
	deadline := time.NewTimer(o.MaxLife)
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
			return fmt.Errorf("serverproc: still running after %v: stopping", o.MaxLife)
		}
		word, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		answer := ""
		if word != "" { // an empty line is a ping
			c, ok := commands[word]
			if !ok {
				return fmt.Errorf("serverproc: unknown command %q", line)
			}
			if answer, err = c(arg); err != nil {
				return fmt.Errorf("serverproc: %s: %w", word, err)
			}
		}
		if answer != "" {
			answer = " " + answer
		}
		if _, err := fmt.Fprintf(out, "ok%s\n", answer); err != nil {
			return err
		}
	}
}

// usage is the usage command's answer: heap objects allocated so far and
// CPU nanoseconds so far. The count is MemStats.Mallocs, which stops the
// world for a moment but is exact: runtime/metrics' counters lag by the
// objects of the spans each P has cached, a few hundred per size class,
// which a figure of zero allocations per frame cannot afford.
func usage() string {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return fmt.Sprintf("%d %d", ms.Mallocs, selfCPU().Nanoseconds())
}

// selfCPU is this process's user plus system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Mem is what a server process reports of its memory.
type Mem struct {
	// RSS is the resident set (VmRSS of /proc/self/status) after a
	// collection that gave freed memory back to the system.
	RSS uint64 `json:"rss"`
	// HeapInuse, StackInuse and Sys are runtime.MemStats' fields.
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Sys        uint64 `json:"sys"`
	Goroutines int    `json:"goroutines"`
}

// ReadMem collects, gives freed memory back, and reads the process's
// resident set and the runtime's own accounts.
func ReadMem() (Mem, error) {
	runtime.GC()
	debug.FreeOSMemory()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return Mem{}, fmt.Errorf("serverproc: %w", err)
	}
	var m Mem
	for line := range bytes.Lines(status) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, err := strconv.ParseUint(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			if err != nil {
				return Mem{}, fmt.Errorf("serverproc: VmRSS %q: %w", v, err)
			}
			m.RSS = kb << 10
		}
	}
	if m.RSS == 0 {
		return Mem{}, errors.New("serverproc: no VmRSS in /proc/self/status")
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.HeapInuse, m.StackInuse, m.Sys = ms.HeapInuse, ms.StackInuse, ms.Sys
	m.Goroutines = runtime.NumGoroutine()
	return m, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	return errors.Join(pprof.Lookup("heap").WriteTo(f, 0), f.Close())
}

// RaiseFileLimit lifts the soft limit on open files to the hard one and
// returns the limit: ten thousand sockets need ten thousand descriptors on
// each side, server and load generator.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("serverproc: open-file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("serverproc: raising the open-file limit: %w", err)
		}
	}
	return lim.Cur, nil
}

// EnsureFiles raises the open-file limit (RaiseFileLimit) and says, as an
// error, when it is still too low for sockets descriptors and headroom
// more (what a process needs besides: its store's files, listeners,
// pipes). A benchmark that holds its sockets open calls it before it
// starts, rather than fail with EMFILE halfway through. The error says
// nothing of whose sockets they are: the caller's prefix does.
func EnsureFiles(sockets, headroom int) error {
	limit, err := RaiseFileLimit()
	if err != nil || limit < uint64(sockets)+uint64(headroom) {
		return fmt.Errorf("%d sockets need as many open files; the limit is %d (%v)", sockets, limit, err)
	}
	return nil
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
		return errors.New("a CPU profile is already running")
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
