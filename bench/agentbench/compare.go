// Package agentbench compares our agent relay (fastpath/agent) with the
// baseline in bench/baseline/agent, which decodes every line with
// encoding/json and encodes it again, as the reference relay does. Both
// are served over TLS 1.3 on loopback, each in a process of its own
// (cmd/agentserve) pinned to one core where the machine allows, and driven
// from this process, pinned to another core, by the same load generator:
// one instance and a few attached clients, spoken by hand so that the
// generator costs the same against both and little.
//
// Three figures per relay and direction (instance to client, client to
// instance):
//
//   - Frames per second, and frames per CPU-second of the relay's process:
//     the per-core figure, which compares the relays' cost per frame
//     fairly even when the load generator's one core sets the pace.
//   - The relay process's heap allocations per frame (see fastpath/agent's
//     Alloc tests for the exact count per routed frame).
//   - One-way latency through the relay, p50 and p99, with frames paced
//     at a quarter of the rate the slower relay sustained (per wall second
//     or per relay CPU-second, whichever is lower), the same rate for
//     both: how long a frame takes when the relays are busy but not
//     saturated. Beside it, the same measurement over one TLS connection
//     without a relay, at the same rate: the floor of the generator, TLS
//     and the kernel; the difference is what the relay adds (an estimate:
//     quantiles do not subtract exactly, and the path through a relay has
//     two TLS hops, not one).
//
// The relays run alternately, round by round (package abtest), and the
// first round of each is dropped as warm-up.
package agentbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/serverproc"
)

// Options shape a comparison. Zero fields take the defaults noted.
type Options struct {
	// Rounds is how many throughput rounds each relay runs; the first is
	// dropped, so at least 2. Default 6.
	Rounds int
	// Frames is the frames of one throughput run in each direction.
	// Default 200,000.
	Frames int
	// Clients is the attachments on the one instance. Default 4.
	Clients int
	// PayloadSize is the bytes of text in each frame's payload. Default
	// 1024.
	PayloadSize int
	// LatencyTime is how long each latency run lasts. Default 1 s.
	LatencyTime time.Duration
	// LatencyRounds is how many latency runs each relay and direction
	// get (alternating, as the throughput rounds); the quantiles are the
	// medians over them. Default 3.
	LatencyRounds int
	// DataDir holds our relay's store and key and the TLS certificate; a
	// temporary directory when empty.
	DataDir string
	// ServerCPU and LoadCPU are the cores the relays and the load
	// generator are pinned to. Defaults 0 and 1; pinning is skipped (and
	// the report says so) on one core or without taskset.
	ServerCPU, LoadCPU int
	// Binary is cmd/agentserve; built into a temporary directory (from the
	// working directory, which must be inside the module) when empty.
	Binary string
	// Progress, when not nil, gets one line per run.
	Progress io.Writer
}

func (o Options) withDefaults() (Options, error) {
	if o.Rounds == 0 {
		o.Rounds = 6
	}
	if o.Frames == 0 {
		o.Frames = 200_000
	}
	if o.Clients == 0 {
		o.Clients = 4
	}
	if o.PayloadSize == 0 {
		o.PayloadSize = 1024
	}
	if o.LatencyTime == 0 {
		o.LatencyTime = time.Second
	}
	if o.LatencyRounds == 0 {
		o.LatencyRounds = 3
	}
	if o.ServerCPU == 0 && o.LoadCPU == 0 {
		o.LoadCPU = 1
	}
	if o.Rounds < 2 {
		return o, fmt.Errorf("agentbench: Rounds %d: need at least 2 (the first is dropped)", o.Rounds)
	}
	if o.Clients < 1 || o.Clients > 64 {
		return o, errors.New("agentbench: Clients must be 1 to 64")
	}
	if o.Frames < batch*o.Clients {
		return o, fmt.Errorf("agentbench: Frames must be at least %d", batch*o.Clients)
	}
	return o, nil
}

// Direction is what one relay measured in one direction.
type Direction struct {
	// FramesPerSec and FramesPerCPUSec hold every counted round; the
	// medians are theirs.
	FramesPerSec, FramesPerCPUSec []float64
	Median, MedianPerCPU          float64
	// AllocsPerFrame is the relay process's mallocs over the counted
	// rounds divided by their frames.
	AllocsPerFrame float64
	// LatencyRate is the paced rate of the latency runs, the same for both
	// relays: a quarter of what the slower one sustained on its one core,
	// per wall second or per relay CPU-second, whichever is lower (the
	// load generator, on a core of its own, may set the pace), so that
	// both are busy and neither is saturated. (Not half: paced frames
	// arrive a few per write, which costs a relay more per frame than the
	// throughput rounds' batches of 32, and half of the batched capacity
	// already saturates the baseline.) P50 and P99 are the one-way
	// latencies through the relay (medians over the latency rounds),
	// LatencyFrames how many frames arrived in all.
	LatencyRate   float64
	P50, P99      time.Duration
	LatencyFrames int
	// DirectP50 and DirectP99 are the same measurement at the same rate
	// over one TLS connection without a relay: the floor of the
	// generator, TLS and the kernel, the same for both relays (the lowest
	// of the direction's floor runs, each relay's rounds having one each,
	// so that a run disturbed by other work on the machine is not
	// subtracted). AddedP50 and AddedP99 are the differences, what the
	// relay adds (never below zero).
	DirectP50, DirectP99 time.Duration
	AddedP50, AddedP99   time.Duration
}

// Side is one relay's figures.
type Side struct {
	Name                 string
	ToClient, ToInstance Direction
}

// Report is the outcome of Compare.
type Report struct {
	Options        Options
	Ours, Baseline Side
	// RatioToClient and RatioToInstance are ours / baseline of the median
	// frames per CPU-second (per core); RoundRatio* the median of each
	// round's ratio, which shrugs off drift between rounds better.
	RatioToClient, RatioToInstance           float64
	RoundRatioToClient, RoundRatioToInstance float64
	// WallRatio* compare frames per second of wall time.
	WallRatioToClient, WallRatioToInstance float64
	// Pinned says the relays and the load generator ran on separate
	// cores; Warnings say why not when they did not.
	Pinned   bool
	Warnings []string
	Elapsed  time.Duration
}

// round is one throughput round of one relay.
type round struct{ toClient, toInstance sample }

// Compare starts both relays, measures their throughput in alternating
// rounds, then their latency at one paced rate, and reports. ctx
// bounds the whole comparison.
func Compare(ctx context.Context, o Options) (rep Report, err error) {
	start := time.Now()
	if o, err = o.withDefaults(); err != nil {
		return Report{}, err
	}
	dir := o.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "agentbench-"); err != nil {
			return Report{}, fmt.Errorf("agentbench: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	ts, err := newTLS(dir)
	if err != nil {
		return Report{}, fmt.Errorf("agentbench: TLS: %w", err)
	}
	if o.Binary == "" {
		if o.Binary, err = serverproc.Build(ctx, "", dir, "edgerelay/bench/agentbench/cmd/agentserve"); err != nil {
			return Report{}, err
		}
	}
	pin, err := serverproc.Pin(o.ServerCPU, o.LoadCPU)
	if err != nil {
		return Report{}, err
	}
	defer pin.Release()
	// The relays' processes serve the certificate newTLS made in dir
	// (EnsureDevCert reuses valid files), which the generator trusts.
	ours, err := startProcess(ctx, o.Binary, "ours", dir, pin.ServerCPU, ts)
	if err != nil {
		return Report{}, fmt.Errorf("agentbench: starting our relay: %w", err)
	}
	defer func() { err = errors.Join(err, ours.close()) }()
	base, err := startProcess(ctx, o.Binary, "baseline", dir, pin.ServerCPU, ts)
	if err != nil {
		return Report{}, fmt.Errorf("agentbench: starting the baseline: %w", err)
	}
	defer func() { err = errors.Join(err, base.close()) }()

	targets := [2]*target{ours, base}
	var rigs [2]*rig
	for i, t := range targets {
		if rigs[i], err = setUp(ctx, t, o.Clients); err != nil {
			return Report{}, fmt.Errorf("agentbench: %s: %w", t.name, err)
		}
		defer rigs[i].close()
	}

	runs, err := abtest.Alternate(o.Rounds, 1, func(side, n int) (round, error) {
		r := rigs[side]
		var res round
		var err error
		if res.toClient, err = runToClient(ctx, r, o.Frames, o.PayloadSize); err != nil {
			return res, fmt.Errorf("agentbench: round %d, %s, %s: %w", n, r.t.name, toClient, err)
		}
		if res.toInstance, err = runToInstance(ctx, r, o.Frames, o.PayloadSize); err != nil {
			return res, fmt.Errorf("agentbench: round %d, %s, %s: %w", n, r.t.name, toInstance, err)
		}
		if o.Progress != nil {
			note := ""
			if n == 0 {
				note = " (warm-up, not counted)"
			}
			for _, d := range []struct {
				name string
				s    sample
			}{{toClient, res.toClient}, {toInstance, res.toInstance}} {
				fmt.Fprintf(o.Progress, "round %d %-8s %-11s %9.0f frames/s %9.0f frames/CPU-s %6.2f allocs/frame%s\n",
					n, r.t.name, d.name, d.s.perSec(), d.s.perCPUSec(), d.s.allocs(), note)
			}
		}
		return res, nil
	})
	if err != nil {
		return Report{}, err
	}
	rep = Report{Options: o, Ours: summarize("ours", runs[0]), Baseline: summarize("baseline", runs[1]),
		Pinned: pin.Pinned, Warnings: pin.Warnings()}

	// Latency at a quarter of the slower relay's capacity, and the floor
	// at the same rate without a relay.
	direct, err := newDirectPair(ctx, ts)
	if err != nil {
		return Report{}, fmt.Errorf("agentbench: direct pair: %w", err)
	}
	defer direct.close()
	if err := measureLatency(ctx, o, &rep, rigs, direct); err != nil {
		return Report{}, err
	}

	rep.RatioToClient = rep.Ours.ToClient.MedianPerCPU / rep.Baseline.ToClient.MedianPerCPU
	rep.RatioToInstance = rep.Ours.ToInstance.MedianPerCPU / rep.Baseline.ToInstance.MedianPerCPU
	rep.WallRatioToClient = rep.Ours.ToClient.Median / rep.Baseline.ToClient.Median
	rep.WallRatioToInstance = rep.Ours.ToInstance.Median / rep.Baseline.ToInstance.Median
	rep.RoundRatioToClient = abtest.RoundRatio(rep.Ours.ToClient.FramesPerCPUSec, rep.Baseline.ToClient.FramesPerCPUSec)
	rep.RoundRatioToInstance = abtest.RoundRatio(rep.Ours.ToInstance.FramesPerCPUSec, rep.Baseline.ToInstance.FramesPerCPUSec)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// latencyRun is one latency round of one relay and direction, and of the
// direct pair at the same rate.
type latencyRun struct {
	p50, p99, directP50, directP99 [2]time.Duration // by direction
	frames                         [2]int
}

// measureLatency runs the latency rounds, alternating the relays, and
// fills in the report's latency figures.
func measureLatency(ctx context.Context, o Options, rep *Report, rigs [2]*rig, direct *directPair) error {
	sides := [2]*Side{&rep.Ours, &rep.Baseline}
	// One rate per direction for both relays, so that their latencies
	// compare at the same offered load.
	rate := func(d Direction) float64 { return min(d.MedianPerCPU, d.Median) / 4 }
	rateToClient := min(rate(rep.Ours.ToClient), rate(rep.Baseline.ToClient))
	rateToInstance := min(rate(rep.Ours.ToInstance), rate(rep.Baseline.ToInstance))
	for _, side := range sides {
		side.ToClient.LatencyRate, side.ToInstance.LatencyRate = rateToClient, rateToInstance
	}
	runs, err := abtest.Alternate(o.LatencyRounds+1, 1, func(i, n int) (latencyRun, error) {
		var res latencyRun
		for k, d := range []struct {
			dir  *Direction
			name string
			run  func(context.Context, *rig, float64, time.Duration, int) (*latencies, error)
		}{{&sides[i].ToClient, toClient, latencyToClient}, {&sides[i].ToInstance, toInstance, latencyToInstance}} {
			lat, err := d.run(ctx, rigs[i], d.dir.LatencyRate, o.LatencyTime, o.PayloadSize)
			if err != nil {
				return res, fmt.Errorf("agentbench: latency, %s, %s: %w", sides[i].Name, d.name, err)
			}
			res.p50[k], res.p99[k], res.frames[k] = lat.quantiles()
			floor, err := latencyDirect(ctx, direct, d.dir.LatencyRate, o.LatencyTime, o.PayloadSize)
			if err != nil {
				return res, fmt.Errorf("agentbench: latency, direct: %w", err)
			}
			res.directP50[k], res.directP99[k], _ = floor.quantiles()
			if o.Progress != nil {
				note := ""
				if n == 0 {
					note = " (warm-up, not counted)"
				}
				fmt.Fprintf(o.Progress, "latency round %d %-8s %-11s at %8.0f frames/s: p50 %v p99 %v; without a relay p50 %v p99 %v%s\n",
					n, sides[i].Name, d.name, d.dir.LatencyRate, res.p50[k], res.p99[k], res.directP50[k], res.directP99[k], note)
			}
		}
		return res, nil
	})
	if err != nil {
		return err
	}
	for k := range 2 {
		var d50, d99 []time.Duration
		for i := range sides {
			for _, r := range runs[i] {
				d50, d99 = append(d50, r.directP50[k]), append(d99, r.directP99[k])
			}
		}
		floor50, floor99 := slices.Min(d50), slices.Min(d99)
		for i, side := range sides {
			dir := [2]*Direction{&side.ToClient, &side.ToInstance}[k]
			var p50, p99 []time.Duration
			for _, r := range runs[i] {
				p50, p99 = append(p50, r.p50[k]), append(p99, r.p99[k])
				dir.LatencyFrames += r.frames[k]
			}
			dir.P50, dir.P99 = abtest.Median(p50), abtest.Median(p99)
			dir.DirectP50, dir.DirectP99 = floor50, floor99
			dir.AddedP50, dir.AddedP99 = max(dir.P50-floor50, 0), max(dir.P99-floor99, 0)
		}
	}
	return nil
}

func summarize(name string, rounds []round) Side {
	s := Side{Name: name}
	var tc, ti []sample
	for _, r := range rounds {
		tc = append(tc, r.toClient)
		ti = append(ti, r.toInstance)
	}
	s.ToClient, s.ToInstance = direction(tc), direction(ti)
	return s
}

func direction(samples []sample) Direction {
	var d Direction
	var mallocs, frames uint64
	for _, s := range samples {
		d.FramesPerSec = append(d.FramesPerSec, s.perSec())
		d.FramesPerCPUSec = append(d.FramesPerCPUSec, s.perCPUSec())
		mallocs += s.mallocs
		frames += uint64(s.frames)
	}
	d.Median, d.MedianPerCPU = abtest.Median(d.FramesPerSec), abtest.Median(d.FramesPerCPUSec)
	if frames > 0 {
		d.AllocsPerFrame = float64(mallocs) / float64(frames)
	}
	return d
}
