package main

import (
	"context"
	"fmt"
	"io"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
	"edgerelay/bench/turnbench"
)

// goalTURNRatio: our TURN server relays at least as many packets per
// server core as coturn.
const goalTURNRatio = 1.0

// turnResults is the TURN comparison's report, or the error that stopped
// it, or that it was not asked for.
type turnResults struct {
	rep     turnbench.Report
	err     error
	skipped bool
}

// runTURN runs bench/turnbench's comparison with its payloads (120 and
// 1,200 bytes), the run's rounds and time per run.
func runTURN(ctx context.Context, s settings, bins servers, progress io.Writer) turnResults {
	if !s.turn {
		fmt.Fprintf(progress, "\n== TURN: skipped (-turn=false)\n")
		return turnResults{skipped: true}
	}
	fmt.Fprintf(progress, "\n== TURN relay: ours vs coturn, each server a process of its own, %d rounds per payload of %v\n", s.turnRounds, s.turnRound)
	var r turnResults
	r.rep, r.err = turnbench.Compare(ctx, turnbench.Options{Rounds: s.turnRounds, Duration: s.turnRound,
		Turnserve: bins.path("turnserve"), Progress: progress})
	if r.err != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", r.err)
	}
	for _, w := range r.rep.Warnings {
		fmt.Fprintf(progress, "warning: %s\n", w)
	}
	if r.rep.Coturn != "" {
		fmt.Fprintf(progress, "coturn %s\n", firstLine(r.rep.Coturn))
	}
	return r
}

func turnInfo(s settings, r turnResults) string {
	if r.skipped {
		return "skipped (-turn=false)"
	}
	if r.err != nil {
		return "failed (see the table and the raw output)"
	}
	o := r.rep.Options
	pinned := "servers and load generator not pinned (no taskset or one core)"
	if r.rep.Pinned {
		pinned = fmt.Sprintf("each server pinned to core %d, the load generator to core %d", o.ServerCPU, o.LoadCPU)
	}
	quick := ""
	if s.quick {
		quick = "QUICK: one short counted round per payload; "
	}
	return fmt.Sprintf("%s%d rounds per payload (first dropped) of %v, alternated; %d allocations × %d datagrams in flight; %s; coturn %s",
		quick, s.turnRounds, s.turnRound, o.Allocations, o.Window, pinned, firstLine(r.rep.Coturn))
}

// firstLine is the first line of s ("" stays "").
func firstLine(s string) string {
	for i := range len(s) {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}

// turnRows are the TURN figures per payload: relayed packets per server
// CPU-second against coturn (with the wall rate and the server's core use
// beside them), and our server's allocations per relayed packet (coturn
// is C: the Go runtime's count has no equivalent there).
func turnRows(r turnResults) []row {
	if r.skipped {
		return []row{{Figure: "TURN relay vs coturn", Ours: "skipped", Baseline: "skipped", Ratio: "—",
			Goal: fmt.Sprintf("≥ %.1f× — skipped (-turn=false)", goalTURNRatio)}}
	}
	var rows []row
	if r.err != nil {
		rows = append(rows, failedRow("TURN relay comparison against coturn", r.err))
	}
	o := r.rep.Options
	where := "each server a process of its own"
	if r.rep.Pinned {
		where += " pinned to one core, the load generator on another"
	}
	for _, p := range r.rep.Results {
		rows = append(rows,
			row{
				Figure: fmt.Sprintf("TURN relayed packets per server CPU-second, %s B payloads (packets/s, server core use); %s; "+
					"%d allocations × %d in flight, ChannelData to UDP echo peers; baseline: coturn",
					thousands(float64(p.Payload)), where, o.Allocations, o.Window),
				Ours:     turnCell(p.Ours),
				Baseline: turnCell(p.Coturn),
				Ratio:    benchfmt.RoundRatio(p.RoundRatio, ratiosOf(turnPerCore(p.Ours), turnPerCore(p.Coturn)), p.Ratio),
				Goal:     verdict(fmt.Sprintf("≥ %.1f×", goalTURNRatio), p.RoundRatio >= goalTURNRatio),
			},
			row{
				Figure:   fmt.Sprintf("TURN heap allocations per relayed packet, %s B payloads (our server process)", thousands(float64(p.Payload))),
				Ours:     fmt.Sprintf("%.3f", p.Ours.AllocsPerPacket),
				Baseline: "— (coturn is C)",
				Ratio:    "—",
				Goal:     "—",
			})
	}
	return rows
}

func turnCell(s turnbench.Side) string {
	return fmt.Sprintf("%s (%s/s, %.0f%% of a core)", benchfmt.Rate(s.PerCoreSec, turnPerCore(s)), thousands(s.PerSec), 100*s.CoreUse)
}

func turnPerCore(s turnbench.Side) []float64 { return abtest.Values(s.Runs, turnbench.Run.PerCoreSec) }
