// Package signalbench compares the mailbox relay's signal forwarding
// (fastpath/mailbox, GET …/signal/<primary|companion>) with the plain
// net/http + gorilla/websocket baseline in bench/baseline/signal: frames
// forwarded per second of relay CPU, per wall second, and heap
// allocations per frame, at a small and a large frame size with a few
// frames in flight and at the small size strictly one at a time, both
// relays driven by the same load generator in the same run.
//
// Each relay runs in a process of its own (cmd/signalserve), pinned to one
// core with taskset where the machine allows, the load generator (this
// process) to another, so that the CPU time and the allocations counted
// are the relay's alone; the headline figure is frames per relay
// CPU-second. The load is many mailboxes, each with both sides open: the
// primary keeps a window of frames in flight, the companion echoes every
// one, so a round trip is two forwarded frames. The clients speak
// WebSocket by hand with frames prepared in advance and allocate nothing
// per frame. Rounds alternate the two relays in ABBA order (bench/abtest)
// and the first is a warm-up; figures are medians over the counted rounds.
//
// TestSignalForwardingAllocatesNothing proves the other half of the
// design's promise in one process: our relay allocates nothing per
// forwarded frame in steady state.
package signalbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"edgerelay/bench/abtest"
)

// Options shape a comparison. Zero fields take the defaults noted.
type Options struct {
	// Rounds per relay and frame size; the first is a warm-up, so at
	// least 2. Default 6.
	Rounds int
	// RoundTime is one relay's load time in one round. Default 1 s.
	RoundTime time.Duration
	// Loads are the shapes measured, each on its own. Default
	// DefaultLoads.
	Loads []Load
	// Pairs is the mailboxes with both sides open. Default 32.
	Pairs int
	// ServerCPU and LoadCPU are the cores the relays and the load
	// generator are pinned to. Defaults 0 and 1; pinning is skipped (and
	// the report says so) on one core or without taskset.
	ServerCPU, LoadCPU int
	// Binary is cmd/signalserve; built into a temporary directory when
	// empty.
	Binary string
	// Progress, when not nil, gets one line per run.
	Progress io.Writer
}

// Load is one shape of load: frames of Size bytes (at most 64 KiB), each
// primary keeping Window of them in flight.
type Load struct{ Size, Window int }

// DefaultLoads are a small and a large frame with a few in flight per
// rendezvous, as a burst of trickled ICE candidates or an offer and its
// candidates arrive, and small frames strictly one at a time (ping-pong),
// where every frame costs each relay a read and a write system call of
// its own and nothing can be batched.
var DefaultLoads = []Load{{256, 4}, {4096, 4}, {256, 1}}

func (o Options) withDefaults() (Options, error) {
	if o.Rounds == 0 {
		o.Rounds = 6
	}
	if o.RoundTime == 0 {
		o.RoundTime = time.Second
	}
	if len(o.Loads) == 0 {
		o.Loads = DefaultLoads
	}
	if o.Pairs == 0 {
		o.Pairs = 32
	}
	if o.ServerCPU == 0 && o.LoadCPU == 0 {
		o.LoadCPU = 1
	}
	switch {
	case o.Rounds < 2:
		return o, fmt.Errorf("signalbench: Rounds %d: need at least 2 (the first is a warm-up)", o.Rounds)
	case o.Pairs < 1:
		return o, errors.New("signalbench: Pairs must be positive")
	}
	for _, l := range o.Loads {
		if l.Size < 1 || l.Size > 64<<10 || l.Window < 1 {
			return o, fmt.Errorf("signalbench: load %+v: the relay forwards 1 to 65,536 bytes, and a window is at least 1", l)
		}
	}
	return o, nil
}

// Run is one counted run of one relay.
type Run struct {
	Frames  uint64        // frames forwarded, both directions
	Elapsed time.Duration // wall time of the run
	CPU     time.Duration // the relay process's CPU time over it
	Mallocs uint64        // the relay process's heap allocations over it
}

// PerSec is frames forwarded per wall second.
func (r Run) PerSec() float64 { return float64(r.Frames) / r.Elapsed.Seconds() }

// PerCoreSec is frames forwarded per second of the relay's CPU time.
func (r Run) PerCoreSec() float64 {
	if r.CPU <= 0 {
		return 0
	}
	return float64(r.Frames) / r.CPU.Seconds()
}

// Side is one relay at one frame size over the counted rounds.
type Side struct {
	Name string
	Runs []Run
	// Medians over the runs: frames per relay CPU-second, per wall
	// second, and the relay's core use (CPU time ÷ wall time).
	PerCoreSec, PerSec, CoreUse float64
	// AllocsPerFrame is the relay process's heap allocations per
	// forwarded frame over all counted runs.
	AllocsPerFrame float64
}

// LoadResult is both relays under one load.
type LoadResult struct {
	Load
	Ours, Baseline Side
	// Ratio is Ours.PerCoreSec ÷ Baseline.PerCoreSec; RoundRatio the
	// median of the per-round ratios (robust to drift between rounds);
	// ThroughputRatio compares PerSec.
	Ratio, RoundRatio, ThroughputRatio float64
}

// Report is the outcome of Compare.
type Report struct {
	Options  Options // defaults filled in
	Results  []LoadResult
	Pinned   bool // relays and load generator ran on separate cores
	Warnings []string
	Elapsed  time.Duration
}

// Compare starts both relays, opens o.Pairs rendezvous on each and runs
// the load against each, alternating, for every frame size. ctx bounds
// the whole comparison.
func Compare(ctx context.Context, o Options) (rep Report, err error) {
	start := time.Now()
	if o, err = o.withDefaults(); err != nil {
		return Report{}, err
	}
	rep.Options = o
	dir, err := os.MkdirTemp("", "signalbench-")
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	if o.Binary == "" {
		o.Binary = filepath.Join(dir, "signalserve")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.Binary, "edgerelay/bench/signalbench/cmd/signalserve")
		if out, err := build.CombinedOutput(); err != nil {
			return rep, fmt.Errorf("signalbench: building signalserve: %w\n%s", err, out)
		}
	}

	serverCPU := o.ServerCPU
	_, tasksetErr := exec.LookPath("taskset")
	rep.Pinned = runtime.NumCPU() >= 2 && tasksetErr == nil
	if !rep.Pinned {
		serverCPU = -1
		rep.Warnings = append(rep.Warnings, "not pinned: needs taskset and 2 cores; the relays and the load generator share the machine")
	} else {
		restore, err := pinSelf(ctx, o.LoadCPU)
		if err != nil {
			return rep, err
		}
		defer restore()
		// One core for the load generator: as many Ps as it may use.
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}

	var procs [2]*proc
	var pairs [2][]*pair
	defer func() {
		for side := range procs {
			err = errors.Join(err, closePairs(pairs[side]))
			if procs[side] != nil {
				err = errors.Join(err, procs[side].stop())
			}
		}
	}()
	for side, name := range []string{"ours", "baseline"} {
		if procs[side], err = startProc(ctx, o.Binary, name, filepath.Join(dir, name), serverCPU); err != nil {
			return rep, err
		}
		if pairs[side], err = openPairs(procs[side].addr, o.Pairs); err != nil {
			return rep, fmt.Errorf("signalbench: %s: %w", name, err)
		}
	}

	for _, load := range o.Loads {
		f := newFrames(load.Size)
		runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (Run, error) {
			r, err := measure(ctx, procs[side], pairs[side], &f, load.Window, o.RoundTime)
			if err != nil {
				return r, fmt.Errorf("signalbench: %d B × %d, round %d, %s: %w", load.Size, load.Window, round, procs[side].name, err)
			}
			if o.Progress != nil {
				note := ""
				if round == 0 {
					note = " (warm-up)"
				}
				fmt.Fprintf(o.Progress, "%5d B × %d round %d %-8s %9.0f frames/s %9.0f frames/core-s  core %3.0f%%  %.3f allocs/frame%s\n",
					load.Size, load.Window, round, procs[side].name, r.PerSec(), r.PerCoreSec(),
					100*r.CPU.Seconds()/r.Elapsed.Seconds(), float64(r.Mallocs)/float64(r.Frames), note)
			}
			return r, nil
		})
		if err != nil {
			return rep, err
		}
		sr := LoadResult{Load: load, Ours: summarize("ours", runs[0]), Baseline: summarize("baseline", runs[1])}
		sr.Ratio = sr.Ours.PerCoreSec / sr.Baseline.PerCoreSec
		sr.ThroughputRatio = sr.Ours.PerSec / sr.Baseline.PerSec
		sr.RoundRatio = abtest.RoundRatio(perCore(runs[0]), perCore(runs[1]))
		rep.Results = append(rep.Results, sr)
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// measure runs the load once on one relay, taking the relay process's
// CPU time and allocations over the run.
func measure(ctx context.Context, p *proc, pairs []*pair, f *frames, window int, d time.Duration) (Run, error) {
	m0, cpu0, err := p.stats()
	if err != nil {
		return Run{}, err
	}
	res, err := runLoad(ctx, pairs, f, window, d)
	if err != nil {
		return Run{}, err
	}
	m1, cpu1, err := p.stats()
	if err != nil {
		return Run{}, err
	}
	return Run{Frames: res.Frames, Elapsed: res.Elapsed, CPU: cpu1 - cpu0, Mallocs: m1 - m0}, nil
}

func summarize(name string, runs []Run) Side {
	s := Side{Name: name, Runs: runs}
	var perSec, use []float64
	var frames, mallocs uint64
	for _, r := range runs {
		perSec = append(perSec, r.PerSec())
		use = append(use, r.CPU.Seconds()/r.Elapsed.Seconds())
		frames += r.Frames
		mallocs += r.Mallocs
	}
	s.PerCoreSec = abtest.Median(perCore(runs))
	s.PerSec = abtest.Median(perSec)
	s.CoreUse = abtest.Median(use)
	if frames > 0 {
		s.AllocsPerFrame = float64(mallocs) / float64(frames)
	}
	return s
}

func perCore(runs []Run) []float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.PerCoreSec()
	}
	return v
}

// proc is one relay's process (cmd/signalserve).
type proc struct {
	name  string
	addr  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its standard output, line by line
	done  chan error
}

// startProc runs bin serving relay, pinned to cpu unless it is negative,
// and reads its address.
func startProc(ctx context.Context, bin, relay, dataDir string, cpu int) (*proc, error) {
	argv := []string{bin, "-relay", relay, "-data", dataDir}
	if cpu >= 0 {
		argv = append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("signalbench: starting signalserve: %w", err)
	}
	p := &proc{name: relay, cmd: cmd, stdin: stdin, lines: make(chan string, 1), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() { p.done <- cmd.Wait() }()
	line, err := p.line()
	if err != nil {
		return nil, errors.Join(err, p.stop())
	}
	addr, ok := strings.CutPrefix(line, "signalserve addr=")
	if !ok {
		return nil, errors.Join(fmt.Errorf("signalbench: %s start-up line %q", relay, line), p.stop())
	}
	p.addr = addr
	return p, nil
}

// line is the process's next line of output.
func (p *proc) line() (string, error) {
	select {
	case l, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("signalbench: the %s relay's process has exited", p.name)
		}
		return l, nil
	case <-time.After(10 * time.Second):
		return "", fmt.Errorf("signalbench: the %s relay's process said nothing for 10 s", p.name)
	}
}

// stats asks the process for its allocations and CPU time so far.
func (p *proc) stats() (mallocs uint64, cpu time.Duration, err error) {
	if _, err := io.WriteString(p.stdin, "stats\n"); err != nil {
		return 0, 0, fmt.Errorf("signalbench: %s: %w", p.name, err)
	}
	l, err := p.line()
	if err != nil {
		return 0, 0, err
	}
	var ns int64
	if _, err := fmt.Sscanf(l, "stats mallocs=%d cpu_ns=%d", &mallocs, &ns); err != nil {
		return 0, 0, fmt.Errorf("signalbench: %s: stats line %q: %w", p.name, l, err)
	}
	return mallocs, time.Duration(ns), nil
}

// stop closes the process's input, which makes it shut its relay down
// and exit; it is killed when that takes more than 15 s.
func (p *proc) stop() error {
	_ = p.stdin.Close()
	select {
	case err := <-p.done:
		if err != nil {
			return fmt.Errorf("signalbench: the %s relay's process: %w", p.name, err)
		}
		return nil
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("signalbench: the %s relay's process did not stop within 15 s", p.name)
	}
}

// pinSelf moves every thread of this process to cpu (threads made later
// inherit it) and returns a function that restores the previous set.
func pinSelf(ctx context.Context, cpu int) (func(), error) {
	pid := strconv.Itoa(os.Getpid())
	out, err := exec.CommandContext(ctx, "taskset", "-pc", pid).Output()
	if err != nil {
		return nil, fmt.Errorf("signalbench: taskset: %w", err)
	}
	// "pid 123's current affinity list: 0,1"
	_, prev, _ := strings.Cut(strings.TrimSpace(string(out)), ": ")
	if out, err := exec.CommandContext(ctx, "taskset", "-a", "-pc", strconv.Itoa(cpu), pid).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("signalbench: pinning the load generator: %w: %s", err, out)
	}
	return func() { _ = exec.Command("taskset", "-a", "-pc", prev, pid).Run() }, nil
}
