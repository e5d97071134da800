// Package channelbench compares our private channel relay with the baseline
// in bench/baseline/channel, both driven by the same load generator
// (bench/channelload) over real loopback WebSockets.
//
// Each relay runs in a process of its own (cmd/channelserve), pinned to one
// core where the machine allows and the load generator (this process) to
// another, so that the relay's CPU time and heap allocations are its own:
// the headline figure is frames forwarded per relay CPU-second, which
// compares the two relays' cost per frame fairly even when the one load
// core, not the relay, sets the pace. Wall frames per second and
// round-trip latencies are measured beside it.
//
// The figure that counts is the ratio, not the absolute rate: both relays
// run on the same machine in the same run, alternated round by round
// (ours, baseline, baseline, ours, …) so that drift in the machine (thermal
// state, other tenants, the garbage collector's pacing) falls on both
// sides alike, and the first round of each is dropped as warm-up.
//
// CompareIdle measures the other half of a relay's cost: the memory of
// thousands of idle phone channels.
package channelbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/channelload"
	"edgerelay/bench/serverproc"
)

// CompareOptions shapes a comparison. Zero fields take the defaults noted.
type CompareOptions struct {
	// Rounds is how many times each relay is run. The first round of each
	// warms up (connection pools, buffers, the scheduler) and is not
	// counted, so at least 2. Default 6.
	Rounds int
	// Frames is the round trips in one run, spread over the phones.
	// Default 100,000.
	Frames int
	// Phones is the concurrent phone channels on the one computer.
	// Default 4.
	Phones int
	// FrameSize is the bytes per phone frame. Default 1024.
	FrameSize int
	// Window is the frames in flight per phone (channelload's default
	// when 0).
	Window int
	// DataDir holds the relays' data (our relay's Pebble store); a
	// temporary directory when empty.
	DataDir string
	// ServerCPU and LoadCPU are the cores the relays and the load
	// generator are pinned to. Defaults 0 and 1; pinning is skipped (and
	// the report says so) on one core or without taskset.
	ServerCPU, LoadCPU int
	// Binary is cmd/channelserve; built into a temporary directory (from
	// the working directory, which must be inside the module) when empty.
	Binary string
	// Progress, when not nil, gets one line per run as it finishes.
	Progress io.Writer
}

func (o CompareOptions) withDefaults() (CompareOptions, error) {
	if o.Rounds == 0 {
		o.Rounds = 6
	}
	if o.Frames == 0 {
		o.Frames = 100_000
	}
	if o.Phones == 0 {
		o.Phones = 4
	}
	if o.FrameSize == 0 {
		o.FrameSize = 1024
	}
	if o.ServerCPU == 0 && o.LoadCPU == 0 {
		o.LoadCPU = 1
	}
	if o.Rounds < 2 {
		return o, fmt.Errorf("channelbench: Rounds %d: need at least 2 (the first is dropped)", o.Rounds)
	}
	if o.Frames < 1 || o.Phones < 1 {
		return o, errors.New("channelbench: Frames and Phones must be positive")
	}
	return o, nil
}

// Side is what one relay measured over the counted rounds.
type Side struct {
	// Name is "ours" or "baseline".
	Name string
	// FramesPerSec and PerCPUSec hold every counted round in order (round
	// trips per wall second, and per second of the relay's CPU time);
	// Median and MedianPerCPU are theirs.
	FramesPerSec, PerCPUSec []float64
	Median, MedianPerCPU    float64
	// CoreUse is the median over the rounds of the relay's CPU time over
	// wall time: how busy its core was.
	CoreUse float64
	// P50 and P99 are the medians over the counted rounds of each round's
	// round-trip latency quantiles.
	P50, P99 time.Duration
	// AllocsPerFrame is the relay process's heap allocations over the
	// counted runs divided by their round trips. Each run's claim and
	// dials are in it, amortised over the run's frames, so it is not
	// exactly zero even for a relay that allocates nothing per frame: see
	// fastpath/channel's AllocsPerRun test and BenchmarkForwardRoundTrip
	// for the relay alone.
	AllocsPerFrame float64
}

// Report is the outcome of Compare.
type Report struct {
	// Options are the options used, defaults filled in.
	Options        CompareOptions
	Ours, Baseline Side
	// Ratio is Ours.MedianPerCPU / Baseline.MedianPerCPU: above 1 means
	// ours forwards more frames per second of its CPU. RoundRatio is the
	// median over the counted rounds of each round's ours / baseline of
	// the same figure; the two relays of one round ran back to back, so it
	// shrugs off a machine whose speed drifts between rounds (other
	// tenants, thermal throttling) better than Ratio does. RoundRatios
	// are the rounds' ratios themselves.
	Ratio, RoundRatio float64
	RoundRatios       []float64
	// WallRatio and WallRoundRatio are the same for frames per wall second.
	WallRatio, WallRoundRatio float64
	// Pinned says the relays and the load generator ran on separate
	// cores; Warnings say why not when they did not.
	Pinned   bool
	Warnings []string
	// Elapsed is the wall time of the whole comparison, set-up included.
	Elapsed time.Duration
}

// Compare starts both relays, each in a process of its own, runs the load
// generator against each o.Rounds times, alternating, and reports median
// frames per relay CPU-second and per wall second, latencies and the
// relays' allocations per frame. ctx bounds the whole comparison.
//
// While it runs, the calling process is pinned to o.LoadCPU with
// GOMAXPROCS 1 (both restored on return): run nothing else in it
// meanwhile.
func Compare(ctx context.Context, o CompareOptions) (rep Report, err error) {
	start := time.Now()
	o, err = o.withDefaults()
	if err != nil {
		return Report{}, err
	}
	rep.Options = o
	tmp, err := os.MkdirTemp("", "channelbench-")
	if err != nil {
		return rep, fmt.Errorf("channelbench: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()
	if o.Binary == "" {
		if o.Binary, err = BuildChannelserve(ctx, "", tmp); err != nil {
			return rep, err
		}
	}
	dataDir := o.DataDir
	if dataDir == "" {
		dataDir = tmp
	}
	pin, err := serverproc.Pin(o.ServerCPU, o.LoadCPU)
	if err != nil {
		return rep, err
	}
	defer pin.Release()
	rep.Pinned, rep.Warnings = pin.Pinned, pin.Warnings()

	procs, err := serverproc.StartPair(func(name string) (*serverproc.Proc, error) {
		return startServe(ctx, o.Binary, name, dataDir, pin.ServerCPU)
	})
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, procs.Stop()) }()

	runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (run, error) {
		p := procs[side]
		res, err := measure(ctx, p, o)
		if err != nil {
			return run{}, fmt.Errorf("channelbench: round %d, %s: %w", round, p.Name, err)
		}
		if o.Progress != nil {
			note := ""
			if round == 0 {
				note = " (warm-up, not counted)"
			}
			fmt.Fprintf(o.Progress, "round %d %-8s %9.0f frames/s %9.0f frames/CPU-s  core %3.0f%%  p50 %v  p99 %v  %.3f relay allocs/frame%s\n",
				round, p.Name, res.FramesPerSec, res.perCPUSec(), 100*res.coreUse(), res.P50, res.P99, res.allocsPerFrame(), note)
		}
		return res, nil
	})
	if err != nil {
		return rep, err
	}
	rep.Ours, rep.Baseline = summarize("ours", runs[0]), summarize("baseline", runs[1])
	rep.Ratio = rep.Ours.MedianPerCPU / rep.Baseline.MedianPerCPU
	rep.RoundRatios = abtest.RoundRatios(rep.Ours.PerCPUSec, rep.Baseline.PerCPUSec)
	rep.RoundRatio = abtest.Median(rep.RoundRatios)
	rep.WallRatio = rep.Ours.Median / rep.Baseline.Median
	rep.WallRoundRatio = abtest.RoundRatio(rep.Ours.FramesPerSec, rep.Baseline.FramesPerSec)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// BuildChannelserve builds cmd/channelserve into dir and returns its path.
// moduleDir is any directory inside the edgerelay module.
func BuildChannelserve(ctx context.Context, moduleDir, dir string) (string, error) {
	return serverproc.Build(ctx, moduleDir, dir, "edgerelay/bench/channelbench/cmd/channelserve")
}

// startServe runs one relay's process, pinned to cpu unless negative, its
// data in a directory of its own below dataDir.
func startServe(ctx context.Context, bin, name, dataDir string, cpu int) (*serverproc.Proc, error) {
	dir, err := os.MkdirTemp(dataDir, name+"-")
	if err != nil {
		return nil, fmt.Errorf("channelbench: %w", err)
	}
	return serverproc.Start(ctx, name, cpu, nil, bin, "-relay", name, "-data", filepath.Join(dir))
}

// run is one load run and what it cost the relay's process.
type run struct {
	channelload.Result
	serverproc.Usage
}

func (r run) allocsPerFrame() float64 { return float64(r.Mallocs) / float64(r.Frames) }
func (r run) coreUse() float64        { return r.CPU.Seconds() / r.Elapsed.Seconds() }

func (r run) perCPUSec() float64 {
	if r.CPU <= 0 {
		return 0
	}
	return float64(r.Frames) / r.CPU.Seconds()
}

// measure runs the load generator once against the relay p with a fresh
// claim key, reading the relay's CPU time and allocations over the run.
func measure(ctx context.Context, p *serverproc.Proc, o CompareOptions) (run, error) {
	key, err := p.Ask(ctx, "key", 30*time.Second)
	if err != nil {
		return run{}, err
	}
	var r run
	r.Usage, err = p.Measure(ctx, func() (err error) {
		r.Result, err = channelload.Run(ctx, channelload.Options{
			Origin:    p.Ready,
			ClaimKey:  key,
			Phones:    o.Phones,
			FrameSize: o.FrameSize,
			Frames:    o.Frames,
			Window:    o.Window,
		})
		return err
	})
	return r, err
}

func summarize(name string, runs []run) Side {
	s := Side{Name: name}
	var p50, p99 []time.Duration
	var use []float64
	var mallocs, frames uint64
	for _, r := range runs {
		s.FramesPerSec = append(s.FramesPerSec, r.FramesPerSec)
		s.PerCPUSec = append(s.PerCPUSec, r.perCPUSec())
		use = append(use, r.coreUse())
		p50 = append(p50, r.P50)
		p99 = append(p99, r.P99)
		mallocs += r.Mallocs
		frames += uint64(r.Frames)
	}
	s.Median, s.MedianPerCPU, s.CoreUse = abtest.Median(s.FramesPerSec), abtest.Median(s.PerCPUSec), abtest.Median(use)
	s.P50, s.P99 = abtest.Median(p50), abtest.Median(p99)
	if frames > 0 {
		s.AllocsPerFrame = float64(mallocs) / float64(frames)
	}
	return s
}
