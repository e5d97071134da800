// Package channelbench compares our private channel relay with the baseline
// in bench/baseline/channel, both driven by the same load generator
// (bench/channelload) over real loopback WebSockets in one process.
//
// The figure that counts is the ratio, not the absolute rate: both relays
// run on the same machine in the same run, alternated round by round
// (ours, baseline, baseline, ours, …) so that drift in the machine (thermal
// state, other tenants, the garbage collector's pacing) falls on both
// sides alike, and the first round of each is dropped as warm-up.
package channelbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/channelload"
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
	// DataDir holds our relay's Pebble store; a temporary directory when
	// empty.
	DataDir string
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
	// FramesPerSec holds every counted round in order; Median is theirs.
	FramesPerSec []float64
	Median       float64
	// P50 and P99 are the medians over the counted rounds of each round's
	// round-trip latency quantiles.
	P50, P99 time.Duration
	// AllocsPerFrame is the process-wide malloc count over the counted
	// runs divided by their frames. It includes the load generator's own
	// allocations (gorilla/websocket clients) and each run's claim and
	// dials, amortised over its frames, so it is not zero even for a relay
	// that allocates nothing: compare the two sides, and see
	// fastpath/channel's AllocsPerRun test for the relay alone.
	AllocsPerFrame float64
}

// Report is the outcome of Compare.
type Report struct {
	// Options are the options used, defaults filled in.
	Options        CompareOptions
	Ours, Baseline Side
	// Ratio is Ours.Median / Baseline.Median: above 1 means ours forwards
	// more frames per second.
	Ratio float64
	// RoundRatio is the median over the counted rounds of each round's
	// ours / baseline. The two relays of one round ran back to back, so
	// this figure shrugs off a machine whose speed drifts between rounds
	// (other tenants, thermal throttling) better than Ratio does.
	RoundRatio float64
	// Elapsed is the wall time of the whole comparison, set-up included.
	Elapsed time.Duration
}

// Compare starts both relays on loopback, runs the load generator against
// each o.Rounds times, alternating, and reports median frames per second,
// latencies and allocations per frame for each. ctx bounds the whole
// comparison.
func Compare(ctx context.Context, o CompareOptions) (rep Report, err error) {
	start := time.Now()
	o, err = o.withDefaults()
	if err != nil {
		return Report{}, err
	}
	ours, err := startOurs(o.DataDir, o.Rounds)
	if err != nil {
		return Report{}, fmt.Errorf("channelbench: starting our relay: %w", err)
	}
	defer func() { err = errors.Join(err, ours.close()) }()
	base, err := startBaseline(o.Rounds)
	if err != nil {
		return Report{}, fmt.Errorf("channelbench: starting the baseline: %w", err)
	}
	defer func() { err = errors.Join(err, base.close()) }()

	relays := [2]*relay{ours, base}
	runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (run, error) {
		r := relays[side]
		res, err := measure(ctx, r, o)
		if err != nil {
			return run{}, fmt.Errorf("channelbench: round %d, %s: %w", round, r.name, err)
		}
		if o.Progress != nil {
			note := ""
			if round == 0 {
				note = " (warm-up, not counted)"
			}
			fmt.Fprintf(o.Progress, "round %d %-8s %9.0f frames/s  p50 %v  p99 %v  %.2f allocs/frame%s\n",
				round, r.name, res.FramesPerSec, res.P50, res.P99, res.allocsPerFrame(), note)
		}
		return res, nil
	})
	if err != nil {
		return Report{}, err
	}
	runsOurs, runsBase := runs[0], runs[1]
	rep = Report{
		Options:  o,
		Ours:     summarize("ours", runsOurs),
		Baseline: summarize("baseline", runsBase),
	}
	rep.Ratio = rep.Ours.Median / rep.Baseline.Median
	rep.RoundRatio = abtest.RoundRatio(rep.Ours.FramesPerSec, rep.Baseline.FramesPerSec)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// run is one load run and the process-wide mallocs it cost.
type run struct {
	channelload.Result
	mallocs uint64
}

func (r run) allocsPerFrame() float64 { return float64(r.mallocs) / float64(r.Frames) }

// measure runs the load generator once against r with a fresh claim key.
// A collection first makes every run start with the same heap, so one
// run's garbage is not collected on the next run's time.
func measure(ctx context.Context, r *relay, o CompareOptions) (run, error) {
	key, err := r.nextKey()
	if err != nil {
		return run{}, err
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := channelload.Run(ctx, channelload.Options{
		Origin:    r.origin,
		ClaimKey:  key,
		Phones:    o.Phones,
		FrameSize: o.FrameSize,
		Frames:    o.Frames,
		Window:    o.Window,
	})
	runtime.ReadMemStats(&after)
	if err != nil {
		return run{}, err
	}
	return run{Result: res, mallocs: after.Mallocs - before.Mallocs}, nil
}

func summarize(name string, runs []run) Side {
	s := Side{Name: name}
	var p50, p99 []time.Duration
	var mallocs, frames uint64
	for _, r := range runs {
		s.FramesPerSec = append(s.FramesPerSec, r.FramesPerSec)
		p50 = append(p50, r.P50)
		p99 = append(p99, r.P99)
		mallocs += r.mallocs
		frames += uint64(r.Frames)
	}
	s.Median = abtest.Median(s.FramesPerSec)
	s.P50, s.P99 = abtest.Median(p50), abtest.Median(p99)
	if frames > 0 {
		s.AllocsPerFrame = float64(mallocs) / float64(frames)
	}
	return s
}
