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
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/serverproc"
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
		if o.Binary, err = serverproc.Build(ctx, "", dir, "edgerelay/bench/signalbench/cmd/signalserve"); err != nil {
			return rep, err
		}
	}
	pin, err := serverproc.Pin(o.ServerCPU, o.LoadCPU)
	if err != nil {
		return rep, err
	}
	defer pin.Release()
	rep.Pinned, rep.Warnings = pin.Pinned, append(rep.Warnings, pin.Warnings()...)

	var procs [2]*serverproc.Proc
	var pairs [2][]*pair
	defer func() {
		for side := range procs {
			err = errors.Join(err, closePairs(pairs[side]))
			if procs[side] != nil {
				err = errors.Join(err, procs[side].Stop())
			}
		}
	}()
	for side, name := range []string{"ours", "baseline"} {
		argv := []string{o.Binary, "-relay", name, "-data", filepath.Join(dir, name)}
		if procs[side], err = serverproc.Start(ctx, name, pin.ServerCPU, nil, argv...); err != nil {
			return rep, err
		}
		if pairs[side], err = openPairs(procs[side].Ready, o.Pairs); err != nil {
			return rep, fmt.Errorf("signalbench: %s: %w", name, err)
		}
	}

	for _, load := range o.Loads {
		f := newFrames(load.Size)
		runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (Run, error) {
			r, err := measure(ctx, procs[side], pairs[side], &f, load.Window, o.RoundTime)
			if err != nil {
				return r, fmt.Errorf("signalbench: %d B × %d, round %d, %s: %w", load.Size, load.Window, round, procs[side].Name, err)
			}
			if o.Progress != nil {
				note := ""
				if round == 0 {
					note = " (warm-up)"
				}
				fmt.Fprintf(o.Progress, "%5d B × %d round %d %-8s %9.0f frames/s %9.0f frames/core-s  core %3.0f%%  %.3f allocs/frame%s\n",
					load.Size, load.Window, round, procs[side].Name, r.PerSec(), r.PerCoreSec(),
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
func measure(ctx context.Context, p *serverproc.Proc, pairs []*pair, f *frames, window int, d time.Duration) (Run, error) {
	var r Run
	u, err := p.Measure(ctx, func() error {
		res, err := runLoad(ctx, pairs, f, window, d)
		r.Frames, r.Elapsed = res.Frames, res.Elapsed
		return err
	})
	r.CPU, r.Mallocs = u.CPU, u.Mallocs
	return r, err
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

func perCore(runs []Run) []float64 { return abtest.Values(runs, Run.PerCoreSec) }
