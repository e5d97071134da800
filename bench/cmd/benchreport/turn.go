package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
	"edgerelay/bench/turnbench"
)

// turnLoad is one load of the TURN comparison (bench/turnbench), with the
// goals issue 17 sets for it per payload (none: measured only).
type turnLoad struct {
	// name is the load in the rows; how says how it is made.
	name, how string
	// opts is the load's transport, GSO runs and baseline; rounds and
	// times come from the run's settings (turnLoadOptions).
	opts  turnbench.Options
	goals map[int]float64
}

// turnPayloads are the ChannelData payload sizes of every load.
var turnPayloads = []int{120, 1200}

// turnGSO is the GSO run of the GRO-coalesced loads: a burst a browser's
// SCTP sends at once is of that order, and 16 × 1,204 bytes is well
// inside a run's 65,507.
const turnGSO = 16

// turnLoads are the loads of issue 17, one datagram per send first (the
// one run with the full rounds).
func turnLoads() []turnLoad {
	return []turnLoad{
		{
			name:  "UDP, one datagram per send",
			how:   "clients send one datagram per send",
			goals: map[int]float64{120: 1.25, 1200: 1.15},
		},
		{
			name: fmt.Sprintf("UDP, GRO-coalesced input (GSO runs of %d)", turnGSO),
			how: fmt.Sprintf("clients send their windows as UDP GSO runs of %d (UDP_SEGMENT), which loopback delivers as one buffer: "+
				"our listener (UDP_GRO on) reads a run coalesced, coturn's one datagram at a time", turnGSO),
			opts: turnbench.Options{GSO: turnGSO},
		},
		{
			name: fmt.Sprintf("UDP, GRO-coalesced input on both legs (GSO runs of %d from clients and echo peers)", turnGSO),
			how: fmt.Sprintf("clients send their windows as UDP GSO runs of %d and the echo peers send back in runs of %d as well, "+
				"whatever shape the server sent them in: our listener and relay sockets (UDP_GRO on) read runs coalesced, coturn's "+
				"one datagram at a time", turnGSO, turnGSO),
			opts:  turnbench.Options{GSO: turnGSO, PeerGSO: true},
			goals: map[int]float64{120: 2.5, 1200: 2.5},
		},
		{
			name: "TCP",
			how:  "one TCP connection per allocation, ChannelData padded to 4 bytes, one write per frame",
			opts: turnbench.Options{Transport: turnbench.TCP},
		},
		{
			name: "TLS (turns:)",
			how:  "one TLS connection per allocation (the same P-256 certificate and TLS 1.2 suite for both), one write per frame",
			opts: turnbench.Options{Transport: turnbench.TLS},
		},
		{
			name: fmt.Sprintf("UDP_GRO on vs off, GSO runs of %d", turnGSO),
			how:  fmt.Sprintf("the GRO-coalesced load (GSO runs of %d), which the baseline (turnserve -no-gro) reads a datagram at a time", turnGSO),
			opts: turnbench.Options{GSO: turnGSO, BaselineNoGRO: true},
		},
	}
}

// turnLoadOptions are load i's options with the run's rounds and times:
// the first load gets -turn-rounds of -turn-round, the others at most 5
// rounds of half that, so that the other loads take about twice the time
// of the first alone.
func turnLoadOptions(s settings, bins servers, l turnLoad, i int, progress io.Writer) turnbench.Options {
	o := l.opts
	o.Payloads, o.Turnserve, o.Progress = turnPayloads, bins.path("turnserve"), progress
	o.Rounds, o.Duration = s.turnRounds, s.turnRound
	if i > 0 {
		o.Rounds, o.Duration = min(s.turnRounds, 5), s.turnRound/2
	}
	return o
}

// turnResults is the TURN comparison's reports, one per load, or that it
// was not asked for; err joins the loads' errors.
type turnResults struct {
	loads   []turnLoadResult
	err     error
	skipped bool
}

// turnLoadResult is one load's report or the error that stopped it.
type turnLoadResult struct {
	load turnLoad
	rep  turnbench.Report
	err  error
}

// runTURN runs bench/turnbench's comparison for every load in turn, each
// with servers of its own.
func runTURN(ctx context.Context, s settings, bins servers, progress io.Writer) turnResults {
	if !s.turn {
		fmt.Fprintf(progress, "\n== TURN: skipped (-turn=false)\n")
		return turnResults{skipped: true}
	}
	var r turnResults
	for i, l := range turnLoads() {
		o := turnLoadOptions(s, bins, l, i, progress)
		fmt.Fprintf(progress, "\n== TURN relay, %s: ours vs %s, each server a process of its own, %d rounds per payload of %v\n",
			l.name, baselineName(o), o.Rounds, o.Duration)
		lr := turnLoadResult{load: l}
		lr.rep, lr.err = turnbench.Compare(ctx, o)
		if lr.err != nil {
			fmt.Fprintf(progress, "comparison failed: %v\n", lr.err)
			r.err = errors.Join(r.err, fmt.Errorf("TURN %s: %w", l.name, lr.err))
		}
		for _, w := range lr.rep.Warnings {
			fmt.Fprintf(progress, "warning: %s\n", w)
		}
		if lr.rep.Coturn != "" {
			fmt.Fprintf(progress, "coturn %s\n", firstLine(lr.rep.Coturn))
		}
		r.loads = append(r.loads, lr)
	}
	return r
}

func baselineName(o turnbench.Options) string {
	if o.BaselineNoGRO {
		return "ours with UDP_GRO off"
	}
	return "coturn"
}

func turnInfo(s settings, r turnResults) string {
	if r.skipped {
		return "skipped (-turn=false)"
	}
	if len(r.loads) == 0 || len(r.loads[0].rep.Results) == 0 {
		return "failed (see the table and the raw output)"
	}
	rep := r.loads[0].rep
	o := rep.Options
	pinned := "servers and load generator not pinned (no taskset or one core)"
	if rep.Pinned {
		pinned = fmt.Sprintf("each server pinned to core %d, the load generator to core %d", o.ServerCPU, o.LoadCPU)
	}
	quick := ""
	if s.quick {
		quick = "QUICK: one short counted round per payload; "
	}
	var took []string
	for _, lr := range r.loads {
		took = append(took, fmt.Sprintf("%s %v", lr.rep.Options.LoadName(), lr.rep.Elapsed.Round(time.Second)))
	}
	first := turnLoadOptions(s, servers{}, r.loads[0].load, 0, nil)
	other := turnLoadOptions(s, servers{}, r.loads[0].load, 1, nil)
	return fmt.Sprintf("%s%d loads, each with servers of its own: the first %d rounds per payload (first dropped) of %v, the others %d of %v, alternated; "+
		"%d allocations × %d datagrams in flight (twice the GSO run with GSO); %s; coturn %s; took %s",
		quick, len(r.loads), first.Rounds, first.Duration, other.Rounds, other.Duration,
		o.Allocations, o.Window, pinned, firstLine(rep.Coturn), strings.Join(took, ", "))
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

// turnRows are the TURN figures per load and payload: relayed packets per
// server CPU-second against the baseline (with the wall rate, the
// server's core use and the kernel's drops on its UDP sockets beside
// them, and for ours the heap allocations per relayed packet: coturn is
// C, the Go runtime's count has no equivalent there).
func turnRows(r turnResults) []row {
	if r.skipped {
		return []row{{Figure: "TURN relay vs coturn", Ours: "skipped", Baseline: "skipped", Ratio: "—",
			Goal: "— skipped (-turn=false)"}}
	}
	var rows []row
	for _, lr := range r.loads {
		rows = append(rows, turnLoadRows(lr)...)
	}
	return rows
}

func turnLoadRows(lr turnLoadResult) []row {
	var rows []row
	l, rep := lr.load, lr.rep
	if lr.err != nil {
		rows = append(rows, failedRow(fmt.Sprintf("TURN relay comparison, %s", l.name), lr.err))
	}
	o := rep.Options
	where := "each server a process of its own"
	if rep.Pinned {
		where += " pinned to one core, the load generator on another"
	}
	for _, p := range rep.Results {
		goal := "— (measured)"
		if g, ok := l.goals[p.Payload]; ok {
			goal = verdict(fmt.Sprintf("≥ %.2f×", g), p.RoundRatio >= g)
		}
		rows = append(rows, row{
			Figure: fmt.Sprintf("TURN relayed packets per server CPU-second, %s, %s B payloads (packets/s, server core use, kernel drops); %s; %s; "+
				"%d allocations × %d in flight, ChannelData to UDP echo peers; baseline: %s",
				l.name, thousands(float64(p.Payload)), l.how, where, o.Allocations, o.Window, baselineName(o)),
			Ours:     turnCell(p.Ours),
			Baseline: turnCell(p.Baseline),
			Ratio:    benchfmt.RoundRatio(p.RoundRatio, p.RoundRatios, p.Ratio),
			Goal:     goal,
		})
	}
	return rows
}

// turnCell is a side's figures; heap allocations per relayed packet for
// our servers only.
func turnCell(s turnbench.Side) string {
	allocs := ""
	if s.AllocsPerPacket >= 0 {
		allocs = fmt.Sprintf(", %.3f allocs/packet", s.AllocsPerPacket)
	}
	return fmt.Sprintf("%s (%s/s, %.0f%% of a core, %s drops%s)", benchfmt.Rate(s.PerCoreSec, turnPerCore(s)), thousands(s.PerSec), 100*s.CoreUse,
		thousands(float64(s.Drops)), allocs)
}

func turnPerCore(s turnbench.Side) []float64 { return abtest.Values(s.Runs, turnbench.Run.PerCoreSec) }
