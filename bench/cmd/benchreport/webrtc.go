package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
	"edgerelay/bench/turnbench"
)

// webrtcResults is the real-traffic TURN comparison's report, or the error
// that stopped it, or why it did not run (-webrtc=false, or no chromium).
type webrtcResults struct {
	rep     turnbench.WebRTCReport
	err     error
	skipped string
}

// runWebRTC runs bench/turnbench's WebRTC comparison: two headless
// Chromium pages over a relay-only data channel through ours and coturn.
// Without chromium it is skipped, and the report says so.
func runWebRTC(ctx context.Context, s settings, bins servers, progress io.Writer) webrtcResults {
	if !s.webrtc {
		fmt.Fprintf(progress, "\n== TURN WebRTC: skipped (-webrtc=false)\n")
		return webrtcResults{skipped: "-webrtc=false"}
	}
	fmt.Fprintf(progress, "\n== TURN relay, real WebRTC traffic: ours vs coturn, two headless Chromium pages, %d rounds of %d MB\n", s.webrtcRounds, s.webrtcMB)
	var r webrtcResults
	r.rep, r.err = turnbench.CompareWebRTC(ctx, turnbench.WebRTCOptions{Rounds: s.webrtcRounds, Bytes: s.webrtcMB * 1_000_000,
		Turnserve: bins.path("turnserve"), Progress: progress})
	if errors.Is(r.err, turnbench.ErrNoChromium) {
		fmt.Fprintf(progress, "skipped: %v\n", r.err)
		return webrtcResults{skipped: "chromium is not installed (apt-get install chromium)"}
	}
	if r.err != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", r.err)
	}
	for _, w := range r.rep.Warnings {
		fmt.Fprintf(progress, "warning: %s\n", w)
	}
	return r
}

func webrtcInfo(s settings, r webrtcResults) string {
	if r.skipped != "" {
		return "skipped: " + r.skipped
	}
	if r.err != nil {
		return "failed (see the table and the raw output)"
	}
	o := r.rep.Options
	pinned := "servers and browser not pinned (no taskset or one core)"
	if r.rep.Pinned {
		pinned = fmt.Sprintf("each server pinned to core %d, the browser to core %d", o.ServerCPU, o.LoadCPU)
	}
	return fmt.Sprintf("%d rounds (first dropped) of %d MB one way in %d B messages over a relay-only data channel, alternated; %s; %s; coturn %s",
		s.webrtcRounds, s.webrtcMB, o.Message, pinned, r.rep.ChromiumVersion, firstLine(r.rep.CoturnVersion))
}

// webrtcRows are the goal rows of issue 17 for real traffic: server CPU
// per MB against coturn's (≤ 0.8×), with the throughput beside it, and
// the kernel's drops on the servers' sockets (no more than coturn's).
func webrtcRows(r webrtcResults) []row {
	cpuGoal := fmt.Sprintf("≤ %.1f×", turnbench.GoalWebRTCCPURatio)
	if r.skipped != "" {
		return []row{{Figure: "TURN real WebRTC traffic vs coturn", Ours: "skipped", Baseline: "skipped", Ratio: "—",
			Goal: cpuGoal + " — skipped: " + r.skipped}}
	}
	if r.err != nil {
		return []row{failedRow("TURN real WebRTC traffic comparison against coturn", r.err)}
	}
	ours, coturn := r.rep.Ours, r.rep.Coturn
	perMB := func(s turnbench.WebRTCSide) []float64 { return abtest.Values(s.Runs, turnbench.WebRTCRun.CPUPerMB) }
	mbps := func(s turnbench.WebRTCSide) []float64 { return abtest.Values(s.Runs, turnbench.WebRTCRun.MBPerSec) }
	cell := func(s turnbench.WebRTCSide) string {
		return fmt.Sprintf("%.2f ms%s (%.1f MB/s%s)", s.CPUPerMB, benchfmt.Spread(perMB(s), func(v float64) string { return fmt.Sprintf("%.2f", v) }),
			s.MBPerSec, benchfmt.Spread(mbps(s), func(v float64) string { return fmt.Sprintf("%.1f", v) }))
	}
	where := "each server a process of its own"
	if r.rep.Pinned {
		where += " pinned to one core, the browser on another"
	}
	return []row{
		{
			Figure: fmt.Sprintf("TURN server CPU per MB of real WebRTC traffic (MB/s): two headless Chromium pages, relay-only data channel, %d MB in %d B messages; %s; baseline: coturn (lower is better)",
				r.rep.Options.Bytes/1_000_000, r.rep.Options.Message, where),
			Ours:     cell(ours),
			Baseline: cell(coturn),
			Ratio:    benchfmt.RoundRatio(r.rep.CPURatio, ratiosOf(perMB(ours), perMB(coturn)), r.rep.CPURatioOfMedians),
			Goal:     verdict(cpuGoal, r.rep.CPURatio <= turnbench.GoalWebRTCCPURatio),
		},
		{
			Figure:   "TURN datagrams the kernel dropped on the server's UDP sockets over those transfers (all counted rounds)",
			Ours:     thousands(float64(ours.Drops)),
			Baseline: thousands(float64(coturn.Drops)),
			Ratio:    "—",
			Goal:     verdict("no more than coturn", ours.Drops <= coturn.Drops),
		},
	}
}
