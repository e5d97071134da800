package mailboxbench

import (
	"fmt"
	"math"
	"strings"
)

// The goals DESIGN.md sets for these figures (as bench/cmd/benchreport
// states them): HEAD and GET at five times the baseline's requests per
// second per core; envelope PUTs at 90% (one writer) and 75% (many) of
// raw Pebble's synced commit rate.
const (
	PinnedGoalReads        = 5.0
	PinnedGoalPutOneWriter = 0.90
	PinnedGoalPutWriters   = 0.75
)

// Markdown renders the report as rows of the report's table
//
//	| figure | ours | baseline | ratio | goal |
//
// one line each, without the header: for each read, requests per server
// CPU-second (the goal's figure) then per wall second; for each PUT
// writer count, writes per wall second (the goal's figure) then per
// server CPU-second. Ratios are the medians of the per-round ratios, the
// ratio of the medians beside them. Warnings (such as running unpinned)
// go into every figure's text, so no row reads as pinned when it was not.
func (r PinnedReport) Markdown() string {
	var b strings.Builder
	o := r.Options
	where := fmt.Sprintf("server a process of its own pinned to core %d, load generator pinned to core %d", o.ServerCPU, o.LoadCPU)
	if !r.Pinned {
		where = "server a process of its own, NOT pinned: " + strings.Join(r.Warnings, "; ")
	}
	if o.ServerGOMAXPROCS > 0 {
		where += fmt.Sprintf(", servers run with GOMAXPROCS=%d", o.ServerGOMAXPROCS)
	}
	median := fmt.Sprintf("median of %d rounds of %v", o.Rounds-1, o.RoundTime)
	row := func(figure, ours, other, ratio, goal string) {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", figure, ours, other, ratio, goal)
	}
	for _, f := range r.Figures {
		if f.Writers == 0 {
			what := fmt.Sprintf("mailbox %s over loopback (%s; %d connections, one request in flight each; "+
				"baseline: net/http over its own store seeded alike; %s)", f.Name, where, o.Conns, median)
			row(what+": requests per server CPU-second",
				perCPUCell(f.Ours, "req"), perCPUCell(f.Other, "req"),
				ratioCell(f.CPURoundRatio, f.CPURatio, false),
				verdictCell(fmt.Sprintf("≥ %.0f×", PinnedGoalReads), f.CPURoundRatio >= PinnedGoalReads))
			row(what+": requests per wall second",
				thousandsCell(f.Ours.PerSec), thousandsCell(f.Other.PerSec),
				ratioCell(f.WallRoundRatio, f.WallRatio, false),
				"— (throughput of one load core; the goal is per server core)")
			continue
		}
		goal := PinnedGoalPutWriters
		writers := fmt.Sprintf("%d writers, each on its own mailbox", f.Writers)
		if f.Writers == 1 {
			goal, writers = PinnedGoalPutOneWriter, "1 writer"
		}
		what := fmt.Sprintf("mailbox envelope PUT synced before the 201, %s, %d B envelopes over loopback HTTP (%s; "+
			"baseline: raw Pebble, one Set of the same key and value sizes per batch applied with pebble.Sync by %s, "+
			"a pinned process of its own on the same disk; %s)",
			writers, o.EnvelopeSize, where, goroutines(f.Writers), median)
		row(what+": writes per wall second",
			thousandsCell(f.Ours.PerSec), thousandsCell(f.Other.PerSec),
			ratioCell(f.WallRoundRatio, f.WallRatio, true),
			verdictCell(fmt.Sprintf("≥ %.0f%% of raw Pebble", 100*goal), f.WallRoundRatio >= goal))
		row(what+": writes per server CPU-second",
			perCPUCell(f.Ours, "write"), perCPUCell(f.Other, "write"),
			ratioCell(f.CPURoundRatio, f.CPURatio, true),
			"— (CPU cost per write; the goal is on throughput)")
	}
	return b.String()
}

func goroutines(n int) string {
	if n == 1 {
		return "1 goroutine"
	}
	return fmt.Sprintf("%d goroutines", n)
}

// perCPUCell is operations per CPU-second, then the core's use and the
// allocations per operation that explain it.
func perCPUCell(s PinnedSide, unit string) string {
	return fmt.Sprintf("%s (%.1f µs CPU/%s, server core %.0f%% busy, %.1f allocs/%s)",
		thousandsCell(s.PerCPUSec), 1e6/s.PerCPUSec, unit, 100*s.CoreUse, s.AllocsPerOp, unit)
}

func ratioCell(round, medians float64, percent bool) string {
	if percent {
		return fmt.Sprintf("%s = %.0f%% (ratio of the medians %s)", timesCell(round), 100*round, timesCell(medians))
	}
	return fmt.Sprintf("**%s** (ratio of the medians %s)", timesCell(round), timesCell(medians))
}

func verdictCell(goal string, met bool) string {
	if met {
		return goal + " — met"
	}
	return goal + " — **not met**"
}

func timesCell(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", r)
}

// thousandsCell is v rounded, with thousands separated by commas.
func thousandsCell(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	s := fmt.Sprintf("%.0f", math.Abs(v))
	var b strings.Builder
	if v <= -0.5 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
