package mailboxbench

import (
	"fmt"
	"strings"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
	"edgerelay/store"
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

// Rows are the report's table rows,
//
//	| figure | ours | baseline | ratio | goal |
//
// for each read, requests per server CPU-second (the goal's figure) then
// per wall second; for each PUT writer count, writes per wall second (the
// goal's figure) then per server CPU-second. Each cell is the median over
// the counted rounds with the spread (lowest–highest) in brackets; ratios
// are the medians of the per-round ratios, with their spread and the
// ratio of the medians beside them. Warnings (such as running unpinned)
// go into every figure's text, so no row reads as pinned when it was not.
func (r PinnedReport) Rows() []benchfmt.Row {
	var rows []benchfmt.Row
	o := r.Options
	where := fmt.Sprintf("server a process of its own pinned to core %d, load generator pinned to core %d", o.ServerCPU, o.LoadCPU)
	if !r.Pinned {
		where = "server a process of its own, NOT pinned: " + strings.Join(r.Warnings, "; ")
	}
	if o.ServerGOMAXPROCS > 0 {
		where += fmt.Sprintf(", servers run with GOMAXPROCS=%d", o.ServerGOMAXPROCS)
	} else {
		where += fmt.Sprintf(", ours and the Pebble writers with GOMAXPROCS=%d as the relay runs, net/http with Go's default of 1", store.MinProcs)
	}
	if o.EnvelopeCache < 0 {
		where += ", ours with its envelope cache off (every GET a first read through Pebble)"
	}
	median := fmt.Sprintf("median of %d rounds of %v", o.Rounds-1, o.RoundTime)
	putMedian := fmt.Sprintf("median of %d rounds of %v", o.Rounds-1, o.PutRoundTime)
	for _, f := range r.Figures {
		cpu := [2][]float64{runValues(f.Ours, PinnedRun.PerCPUSec), runValues(f.Other, PinnedRun.PerCPUSec)}
		wall := [2][]float64{runValues(f.Ours, PinnedRun.PerSec), runValues(f.Other, PinnedRun.PerSec)}
		cpuRatio := benchfmt.RoundRatio(f.CPURoundRatio, ratios(cpu), f.CPURatio)
		wallRatio := benchfmt.RoundRatio(f.WallRoundRatio, ratios(wall), f.WallRatio)
		if f.Writers == 0 {
			inFlight := "one request in flight each"
			if f.Depth > 1 {
				inFlight = fmt.Sprintf("%d requests pipelined on each (written at once, then their answers read)", f.Depth)
			}
			what := fmt.Sprintf("mailbox %s over loopback (%s; %d connections, %s; "+
				"baseline: net/http over its own store seeded alike; %s)", f.Name, where, o.Conns, inFlight, median)
			rows = append(rows,
				benchfmt.Row{
					Figure: what + ": requests per server CPU-second",
					Ours:   perCPUCell(f.Ours, cpu[0], "req"), Baseline: perCPUCell(f.Other, cpu[1], "req"),
					Ratio: "**" + cpuRatio + "**",
					Goal:  benchfmt.Verdict(fmt.Sprintf("≥ %.0f×", PinnedGoalReads), f.CPURoundRatio >= PinnedGoalReads),
				},
				benchfmt.Row{
					Figure: what + ": requests per wall second",
					Ours:   benchfmt.Rate(f.Ours.PerSec, wall[0]), Baseline: benchfmt.Rate(f.Other.PerSec, wall[1]),
					Ratio: wallRatio,
					Goal:  "— (throughput of one load core; the goal is per server core)",
				})
			if floor, ok := r.Floors[f.Depth]; ok && f.Name == kindNames[kindHead] {
				rows = append(rows, floorRow(floor, f.Other, f.Depth, where, median))
			}
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
			writers, o.EnvelopeSize, where, goroutines(f.Writers), putMedian)
		rows = append(rows,
			benchfmt.Row{
				Figure: what + ": writes per wall second",
				Ours:   benchfmt.Rate(f.Ours.PerSec, wall[0]), Baseline: benchfmt.Rate(f.Other.PerSec, wall[1]),
				Ratio: percent(f.WallRoundRatio, wallRatio),
				Goal:  benchfmt.Verdict(fmt.Sprintf("≥ %.0f%% of raw Pebble", 100*goal), f.WallRoundRatio >= goal),
			},
			benchfmt.Row{
				Figure: what + ": writes per server CPU-second",
				Ours:   perCPUCell(f.Ours, cpu[0], "write"), Baseline: perCPUCell(f.Other, cpu[1], "write"),
				Ratio: percent(f.CPURoundRatio, cpuRatio),
				Goal:  "— (CPU cost per write; the goal is on throughput)",
			})
		if floor, ok := r.PutFloors[f.Writers]; ok {
			rows = append(rows, putFloorRow(floor, f, goal, where, putMedian))
		}
	}
	return rows
}

// putFloorRow sets the PUT floor server beside raw Pebble (measured next
// to each raw Pebble run that ours is set against): the share of raw
// Pebble's rate that an HTTP server doing nothing but the exchange and
// the synced commit keeps, which bounds the PUT goal; and ours against
// the floor, round by round.
func putFloorRow(floor, ours PinnedFigure, goal float64, where, median string) benchfmt.Row {
	wall := [2][]float64{runValues(floor.Ours, PinnedRun.PerSec), runValues(floor.Other, PinnedRun.PerSec)}
	return benchfmt.Row{
		Figure: fmt.Sprintf("HTTP floor for the PUT rows above, %s (%s; %s): a Go server that reads each request's header "+
			"and body, commits the body as the raw Pebble baseline does (one Set, pebble.Sync) and writes a canned 201, "+
			"under the same load, measured next to each raw Pebble run of the rows above: writes per wall second; the ratio is what an HTTP "+
			"server doing nothing but the exchange and the commit keeps of raw Pebble's rate",
			strings.TrimPrefix(floor.Name, "PUT synced, "), where, median),
		Ours:     benchfmt.Rate(floor.Ours.PerSec, wall[0]),
		Baseline: benchfmt.Rate(floor.Other.PerSec, wall[1]),
		Ratio: percent(floor.WallRoundRatio, benchfmt.RoundRatio(floor.WallRoundRatio, ratios(wall), floor.WallRatio)) +
			fmt.Sprintf("; ours runs at %.0f%% of the floor (median of the per-round ratios)",
				100*abtest.RoundRatio(runValues(ours.Ours, PinnedRun.PerSec), wall[0])),
		Goal: fmt.Sprintf("— (the ceiling of the ≥ %.0f%% goal on this machine)", 100*goal),
	}
}

// floorRow sets the floor server beside the baseline's HEAD: the ratio is
// the most any server, doing no work at all, could reach over net/http on
// this machine's loopback, so it bounds the ≥ 5× goal.
func floorRow(floor, baseline PinnedSide, depth int, where, median string) benchfmt.Row {
	load := "one read and one write per request"
	if depth > 1 {
		load = fmt.Sprintf("one read and one write per %d pipelined requests", depth)
	}
	return benchfmt.Row{
		Figure: fmt.Sprintf("HTTP floor for the HEAD rows above (%s; %s): a Go server that only finds the blank line ending each request "+
			"and writes a canned answer of the same size, %s, under the same load: "+
			"requests per server CPU-second; the ratio is what a server doing no work at all reaches over the net/http baseline", where, median, load),
		Ours:     perCPUCell(floor, runValues(floor, PinnedRun.PerCPUSec), "req"),
		Baseline: perCPUCell(baseline, runValues(baseline, PinnedRun.PerCPUSec), "req"),
		Ratio:    times(floor.PerCPUSec / baseline.PerCPUSec),
		Goal:     fmt.Sprintf("— (the ceiling of the ≥ %.0f× goal on this machine)", PinnedGoalReads),
	}
}

// times formats a ratio.
func times(r float64) string { return fmt.Sprintf("%.2f×", r) }

// Markdown is Rows as table lines, without the header.
func (r PinnedReport) Markdown() string {
	var b strings.Builder
	for _, row := range r.Rows() {
		b.WriteString(row.Markdown() + "\n")
	}
	return b.String()
}

func runValues(s PinnedSide, f func(PinnedRun) float64) []float64 { return abtest.Values(s.Runs, f) }

func ratios(v [2][]float64) []float64 { return abtest.RoundRatios(v[0], v[1]) }

func goroutines(n int) string {
	if n == 1 {
		return "1 goroutine"
	}
	return fmt.Sprintf("%d goroutines", n)
}

// perCPUCell is operations per CPU-second with their spread, then the
// core's use and the allocations per operation that explain it.
func perCPUCell(s PinnedSide, v []float64, unit string) string {
	return fmt.Sprintf("%s (%.1f µs CPU/%s, server core %.0f%% busy, %.1f allocs/%s)",
		benchfmt.Rate(s.PerCPUSec, v), 1e6/s.PerCPUSec, unit, 100*s.CoreUse, s.AllocsPerOp, unit)
}

// percent puts a share of raw Pebble's rate before its ratio cell.
func percent(r float64, cell string) string { return fmt.Sprintf("%.0f%% = %s", 100*r, cell) }
