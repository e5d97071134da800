package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/agentbench"
	"edgerelay/bench/benchfmt"
)

// agentResults is the agent routing comparison's report, or the error
// that stopped it.
type agentResults struct {
	rep agentbench.Report
	err error
}

// runAgent runs the agent routing comparison: ours and the
// encoding/json baseline, each in a process of its own, under the same
// load in both directions, then their latency at one rate.
func runAgent(ctx context.Context, s settings, bins servers, progress io.Writer) agentResults {
	fmt.Fprintf(progress, "\n== agent routing: ours vs baseline, each relay in a process of its own, %d rounds of %s frames per direction, then %d latency rounds of %v\n",
		s.agentRounds, thousands(float64(s.agentFrames)), s.agentLatencyRounds, s.agentLatency)
	var r agentResults
	r.rep, r.err = agentbench.Compare(ctx, agentbench.Options{
		Rounds: s.agentRounds, Frames: s.agentFrames, LatencyTime: s.agentLatency, LatencyRounds: s.agentLatencyRounds,
		Binary: bins.path("agentserve"), Progress: progress,
	})
	if r.err != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", r.err)
	}
	for _, w := range r.rep.Warnings {
		fmt.Fprintf(progress, "warning: %s\n", w)
	}
	return r
}

func agentInfo(r agentResults) string {
	if r.err != nil {
		return "failed (see the table and the raw output)"
	}
	o := r.rep.Options
	return fmt.Sprintf("%d rounds per relay (first dropped) of %s frames each way, %d clients on one instance, %d B payloads, alternated; "+
		"%d latency rounds (first dropped) of %v per direction; %s",
		o.Rounds, thousands(float64(o.Frames)), o.Clients, o.PayloadSize, o.LatencyRounds+1, o.LatencyTime,
		pinnedText(r.rep.Pinned, r.rep.Options.ServerCPU, r.rep.Options.LoadCPU, "relay", r.rep.Warnings))
}

// pinnedText says where a comparison's servers and load generator ran.
func pinnedText(pinned bool, serverCPU, loadCPU int, server string, warnings []string) string {
	if !pinned {
		return fmt.Sprintf("each %s a process of its own, NOT pinned (%s)", server, strings.Join(warnings, "; "))
	}
	return fmt.Sprintf("each %s a process of its own pinned to core %d, the load generator to core %d", server, serverCPU, loadCPU)
}

// agentRows are the agent routing figures per direction: frames per relay
// CPU-second against the encoding/json baseline (with the wall rate), the
// relay process's allocations per frame, and the latency the relay adds.
// The agent relay's issue set the goals: at least 3x the baseline per
// core, 0 allocations per frame, and an added p99 under 250 µs at half the
// measured capacity. The latency runs pace both relays at one rate the
// baseline can carry, a small fraction of ours: the goal cell says which.
func agentRows(r agentResults) []row {
	if r.err != nil {
		return []row{failedRow("agent routing comparison", r.err)}
	}
	o := r.rep.Options
	where := pinnedText(r.rep.Pinned, o.ServerCPU, o.LoadCPU, "relay", r.rep.Warnings)
	var rows []row
	for _, d := range []struct {
		name             string
		ours, base       agentbench.Direction
		ratio, wallRatio float64
		round            float64
	}{
		{"instance → client", r.rep.Ours.ToClient, r.rep.Baseline.ToClient, r.rep.RatioToClient, r.rep.WallRatioToClient, r.rep.RoundRatioToClient},
		{"client → instance", r.rep.Ours.ToInstance, r.rep.Baseline.ToInstance, r.rep.RatioToInstance, r.rep.WallRatioToInstance, r.rep.RoundRatioToInstance},
	} {
		what := fmt.Sprintf("agent routing %s, %d B payloads, %d clients on one instance over TLS 1.3", d.name, o.PayloadSize, o.Clients)
		rows = append(rows,
			row{
				Figure: what + fmt.Sprintf(": frames per relay CPU-second (%s; median of %d rounds of %s frames; baseline: net/http + gorilla/websocket + encoding/json)",
					where, o.Rounds-1, thousands(float64(o.Frames))),
				Ours:     benchfmt.Rate(d.ours.MedianPerCPU, d.ours.FramesPerCPUSec),
				Baseline: benchfmt.Rate(d.base.MedianPerCPU, d.base.FramesPerCPUSec),
				Ratio:    benchfmt.RoundRatio(d.round, ratiosOf(d.ours.FramesPerCPUSec, d.base.FramesPerCPUSec), d.ratio),
				Goal:     verdict("≥ 3×", d.round >= 3),
			},
			row{
				Figure:   what + ": frames per wall second (the same runs; one load-generator core)",
				Ours:     benchfmt.Rate(d.ours.Median, d.ours.FramesPerSec),
				Baseline: benchfmt.Rate(d.base.Median, d.base.FramesPerSec),
				Ratio: benchfmt.RoundRatio(abtest.RoundRatio(d.ours.FramesPerSec, d.base.FramesPerSec),
					ratiosOf(d.ours.FramesPerSec, d.base.FramesPerSec), d.wallRatio),
				Goal: "—",
			},
			row{
				Figure: what + ": relay process heap allocations per frame (crypto/tls allocates one small object per socket read, " +
					"many frames per read under load; the relay's own code allocates none: `go test -run Alloc ./fastpath/agent/` over plain TCP)",
				Ours:     fmt.Sprintf("%.3f", d.ours.AllocsPerFrame),
				Baseline: fmt.Sprintf("%.3f", d.base.AllocsPerFrame),
				Ratio:    times(d.base.AllocsPerFrame / d.ours.AllocsPerFrame),
				Goal:     verdict("0 allocs/frame", d.ours.AllocsPerFrame <= goalFrameAllocs),
			},
			row{
				Figure: what + fmt.Sprintf(": latency the relay adds, p50 / p99, at %s frames/s for both relays "+
					"(through the relay, less the same load over one TLS connection without a relay; medians of %d rounds of %v)",
					thousands(d.ours.LatencyRate), o.LatencyRounds, o.LatencyTime),
				Ours:     latencyCell(d.ours),
				Baseline: latencyCell(d.base),
				Ratio: times(float64(d.base.AddedP50)/float64(d.ours.AddedP50)) + " / " +
					times(float64(d.base.AddedP99)/float64(d.ours.AddedP99)),
				Goal: verdict(fmt.Sprintf("p99 added < 250 µs at half capacity (run here at %.0f%% of ours)", 100*d.ours.LatencyRate/d.ours.Median),
					d.ours.AddedP99 < 250*time.Microsecond),
			})
	}
	return rows
}

// latencyCell is the added latency, then the latency through the relay and
// the floor it was reckoned from.
func latencyCell(d agentbench.Direction) string {
	return fmt.Sprintf("%v / %v (through the relay %v / %v; floor %v / %v)",
		roundDur(d.AddedP50), roundDur(d.AddedP99), roundDur(d.P50), roundDur(d.P99), roundDur(d.DirectP50), roundDur(d.DirectP99))
}
