package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"edgerelay/bench/channelbench"
	"edgerelay/bench/mailboxbench"
)

// The packages whose micro benchmarks go into the report.
const (
	pkgBucket  = "edgerelay/fastpath/bucket"
	pkgControl = "edgerelay/fastpath/channel/control"
	pkgChannel = "edgerelay/fastpath/channel"
	pkgMailbox = "edgerelay/bench/mailboxbench"
)

// The goals the design sets (DESIGN.md, "The hot path"; the brief of
// `make bench`).
const (
	goalChannelRatio = 1.3
	goalBucketRatio  = 3.0
	// Envelope PUTs keep this share of raw Pebble's synced commit rate,
	// with one writer and with many.
	goalPutOneWriter   = 0.90
	goalPutManyWriters = 0.75
	goalMailboxReads   = 5.0      // HEAD and GET, ours ÷ baseline
	goalWatchBytes     = 12 << 10 // resident bytes per idle watch socket
)

// row is one line of the report's table.
type row struct{ figure, ours, baseline, ratio, goal string }

// channelRows are the forwarding figures: the load-generator comparison,
// then the raw-client round trip from fastpath/channel's benchmark, which
// is where the relay's own allocations show (its clients allocate nothing).
func channelRows(rep *channelbench.Report, compareErr error, bench benchResults) []row {
	var rows []row
	if rep != nil {
		o := rep.Options
		rows = append(rows,
			row{
				figure: fmt.Sprintf("channel forwarding, frames/s (%d phones, %d B frames, median of %d rounds)",
					o.Phones, o.FrameSize, o.Rounds-1),
				ours:     thousands(rep.Ours.Median),
				baseline: thousands(rep.Baseline.Median),
				ratio:    times(rep.Ratio),
				goal:     verdict(fmt.Sprintf("≥ %.1f×", goalChannelRatio), rep.Ratio >= goalChannelRatio),
			},
			row{
				figure:   "channel forwarding, median of the per-round ratios (each round ran both relays back to back)",
				ours:     "—",
				baseline: "—",
				ratio:    times(rep.RoundRatio),
				goal:     verdict(fmt.Sprintf("≥ %.1f×", goalChannelRatio), rep.RoundRatio >= goalChannelRatio),
			},
			row{
				figure:   "channel forwarding, round-trip latency p50 / p99",
				ours:     fmt.Sprintf("%v / %v", roundDur(rep.Ours.P50), roundDur(rep.Ours.P99)),
				baseline: fmt.Sprintf("%v / %v", roundDur(rep.Baseline.P50), roundDur(rep.Baseline.P99)),
				ratio: times(float64(rep.Baseline.P50)/float64(rep.Ours.P50)) + " / " +
					times(float64(rep.Baseline.P99)/float64(rep.Ours.P99)),
				goal: "—",
			},
			row{
				figure:   "channel forwarding, allocs/frame, whole process (load generator's gorilla clients included)",
				ours:     fmt.Sprintf("%.2f", rep.Ours.AllocsPerFrame),
				baseline: fmt.Sprintf("%.2f", rep.Baseline.AllocsPerFrame),
				ratio:    times(rep.Baseline.AllocsPerFrame / rep.Ours.AllocsPerFrame),
				goal:     "— (the relay's own share is the next row)",
			})
	} else {
		rows = append(rows, row{figure: "channel forwarding comparison", ours: "failed", baseline: "failed",
			ratio: "—", goal: fmt.Sprintf("error: %v", compareErr)})
	}
	const rt = "BenchmarkForwardRoundTrip"
	if allocs, ok := bench.median(pkgChannel, rt, "allocs/op"); ok {
		ns, _ := bench.median(pkgChannel, rt, "ns/op")
		fps, _ := bench.median(pkgChannel, rt, "frames/s")
		rows = append(rows,
			row{
				figure:   "channel forwarding, relay allocs per round trip (raw clients that allocate nothing)",
				ours:     fmt.Sprintf("%g", allocs),
				baseline: "—",
				ratio:    "—",
				goal:     verdict("0 allocs/frame", allocs == 0),
			},
			row{
				figure:   "channel forwarding, one frame in flight with raw clients: frames/s (µs per round trip)",
				ours:     fmt.Sprintf("%s (%.1f µs)", thousands(fps), ns/1e3),
				baseline: "—",
				ratio:    "—",
				goal:     "—",
			})
	} else {
		rows = append(rows, row{figure: "channel forwarding, relay allocs per round trip", ours: "missing",
			baseline: "—", ratio: "—", goal: "0 allocs/frame — no result (see the raw output)"})
	}
	return rows
}

// bucketRows pair each BenchmarkSetTake shape with BenchmarkXRate's.
func bucketRows(bench benchResults) []row {
	var rows []row
	for _, name := range bench.names(pkgBucket) {
		shape, ok := strings.CutPrefix(name, "BenchmarkSetTake/")
		if !ok {
			continue
		}
		oursNs, _ := bench.median(pkgBucket, name, "ns/op")
		oursAllocs, _ := bench.median(pkgBucket, name, "allocs/op")
		rateNs, ok := bench.median(pkgBucket, "BenchmarkXRate/"+shape, "ns/op")
		if !ok {
			continue
		}
		rateAllocs, _ := bench.median(pkgBucket, "BenchmarkXRate/"+shape, "allocs/op")
		ratio := rateNs / oursNs
		rows = append(rows, row{
			figure:   "token bucket take, " + shape + " (vs golang.org/x/time/rate)",
			ours:     perOp(oursNs, oursAllocs),
			baseline: perOp(rateNs, rateAllocs),
			ratio:    times(ratio),
			goal:     verdict(fmt.Sprintf("≥ %.0f×, 0 allocs", goalBucketRatio), ratio >= goalBucketRatio && oursAllocs == 0),
		})
	}
	if len(rows) == 0 {
		rows = append(rows, row{figure: "token bucket take", ours: "missing", baseline: "missing",
			ratio: "—", goal: fmt.Sprintf("≥ %.0f×, 0 allocs — no result (see the raw output)", goalBucketRatio)})
	}
	return rows
}

// controlRows pair each codec benchmark of package control with its
// encoding/json twin. The design sets no ratio for them; they explain the
// channel figure.
func controlRows(bench benchResults) []row {
	var rows []row
	for _, name := range bench.names(pkgControl) {
		base, ok := strings.CutSuffix(name, "/control")
		if !ok {
			continue
		}
		oursNs, _ := bench.median(pkgControl, name, "ns/op")
		oursAllocs, _ := bench.median(pkgControl, name, "allocs/op")
		jsonNs, ok := bench.median(pkgControl, base+"/encoding_json", "ns/op")
		if !ok {
			continue
		}
		jsonAllocs, _ := bench.median(pkgControl, base+"/encoding_json", "allocs/op")
		fn, payload, _ := strings.Cut(strings.TrimPrefix(base, "Benchmark"), "/")
		rows = append(rows, row{
			figure:   fmt.Sprintf("control codec %s, %s (vs encoding/json)", fn, payload),
			ours:     perOp(oursNs, oursAllocs),
			baseline: perOp(jsonNs, jsonAllocs),
			ratio:    times(jsonNs / oursNs),
			goal:     verdict("0 allocs", oursAllocs == 0),
		})
	}
	return rows
}

// mailboxRows are the mailbox figures: synced PUTs against raw Pebble,
// HEAD and GET against the net/http baseline over loopback and with the
// handlers called directly (from the micro benchmarks), and the memory of
// an idle watch socket. The load figures are judged by the median of the
// per-round ratios, each round having run both sides back to back: on a
// machine shared with other work (and a disk whose sync time wanders) it
// is the steadier of the two ratios; the ratio of the medians is shown
// beside it.
func mailboxRows(m mailboxResults, bench benchResults) []row {
	var rows []row
	if m.putErr != nil {
		rows = append(rows, failedRow("mailbox envelope PUT comparison", m.putErr))
	}
	for _, f := range m.put.Figures {
		goal, writers := goalPutManyWriters, fmt.Sprintf("%d writers, each on its own mailbox", f.Writers)
		if f.Writers == 1 {
			goal, writers = goalPutOneWriter, "1 writer"
		}
		rows = append(rows, row{
			figure: fmt.Sprintf("mailbox envelope PUT synced before the 201, %s, %d B envelopes over loopback HTTP: writes/s "+
				"(baseline: raw Pebble, one Set of the same key and value sizes per batch, applied with pebble.Sync on the same disk)",
				writers, m.put.Options.EnvelopeSize),
			ours:     thousands(f.OursMedian),
			baseline: thousands(f.PebbleMedian),
			ratio:    fmt.Sprintf("%s = %.0f%% (ratio of the medians %s)", times(f.RoundRatio), 100*f.RoundRatio, times(f.Ratio)),
			goal:     verdict(fmt.Sprintf("≥ %.0f%% of raw Pebble", 100*goal), f.RoundRatio >= goal),
		})
	}
	if m.readsErr != nil {
		rows = append(rows, failedRow("mailbox HEAD and GET comparison", m.readsErr))
	}
	for _, f := range m.reads.Figures {
		rows = append(rows, row{
			figure: fmt.Sprintf("mailbox %s over loopback, requests/s (%d connections, one request in flight each; "+
				"baseline: net/http over the same store)", f.Name, m.reads.Options.Conns),
			ours:     thousands(f.OursMedian),
			baseline: thousands(f.BaselineMedian),
			ratio:    fmt.Sprintf("%s (ratio of the medians %s)", times(f.RoundRatio), times(f.Ratio)),
			goal:     verdict(fmt.Sprintf("≥ %.0f×", goalMailboxReads), f.RoundRatio >= goalMailboxReads),
		})
	}
	for _, c := range []struct{ slug, name string }{{"head-direction", "HEAD of a direction"}, {"get-envelope", "GET of one envelope"}} {
		name := "BenchmarkServeHTTP/" + c.slug
		oursNs, ok := bench.median(pkgMailbox, name+"/ours", "ns/op")
		baseNs, ok2 := bench.median(pkgMailbox, name+"/baseline", "ns/op")
		if !ok || !ok2 {
			rows = append(rows, row{figure: "mailbox " + c.name + ", handler called directly", ours: "missing",
				baseline: "missing", ratio: "—", goal: "no result (see the raw output)"})
			continue
		}
		oursAllocs, _ := bench.median(pkgMailbox, name+"/ours", "allocs/op")
		baseAllocs, _ := bench.median(pkgMailbox, name+"/baseline", "allocs/op")
		ratio := baseNs / oursNs
		goal, met := fmt.Sprintf("≥ %.0f×", goalMailboxReads), ratio >= goalMailboxReads
		if c.slug == "head-direction" {
			goal, met = goal+", 0 allocs", met && oursAllocs == 0
		}
		rows = append(rows, row{
			figure:   "mailbox " + c.name + ", handler called directly (no server, no socket; net/http's own per-request cost left out of the baseline)",
			ours:     perOp(oursNs, oursAllocs),
			baseline: perOp(baseNs, baseAllocs),
			ratio:    times(ratio),
			goal:     verdict(goal, met),
		})
	}
	if m.watchErr != nil {
		rows = append(rows, failedRow("mailbox idle watch socket memory", m.watchErr))
	} else if len(m.watch.Ours) > 0 {
		o, b := medianWatch(m.watch.Ours), medianWatch(m.watch.Baseline)
		rows = append(rows, row{
			figure: fmt.Sprintf("mailbox idle watch socket, resident memory per socket with %s open (server in a process of its own; "+
				"baseline: net/http + gorilla/websocket)", thousands(float64(m.watch.Options.Sockets))),
			ours:     watchCell(o),
			baseline: watchCell(b),
			ratio:    times(m.watch.Ratio),
			goal:     verdict(fmt.Sprintf("≤ %d KiB per socket", goalWatchBytes>>10), m.watch.OursMedian <= goalWatchBytes),
		})
	}
	return rows
}

func failedRow(what string, err error) row {
	return row{figure: what, ours: "failed", baseline: "failed", ratio: "—", goal: fmt.Sprintf("error: %v", err)}
}

// medianWatch is the round whose bytes per socket are the median's (the
// lower middle one for an even count), so that its breakdown is shown.
func medianWatch(sides []mailboxbench.WatchSide) mailboxbench.WatchSide {
	s := append([]mailboxbench.WatchSide(nil), sides...)
	sort.Slice(s, func(i, j int) bool { return s[i].PerSocket < s[j].PerSocket })
	return s[(len(s)-1)/2]
}

// watchCell is bytes per socket, then what the runtime says they are.
func watchCell(s mailboxbench.WatchSide) string {
	return fmt.Sprintf("%.1f KiB (stacks %.1f, heap %.1f KiB; %.2f goroutines)",
		s.PerSocket/1024, s.StackPerSocket/1024, s.HeapPerSocket/1024, s.GoroutinesPerSocket)
}

// runInfo is the report's header: what ran where, and for how long.
type runInfo struct {
	date      time.Time
	cpu       string
	cores     int
	procs     int
	goVersion string
	osArch    string
	quick     bool
	compare   string // what the comparison ran
	mailbox   string // what the mailbox comparisons ran
	signal    string // what the signal comparison ran
	turn      string // what the TURN comparison ran
	micro     string // what the micro and push benchmarks ran
	elapsed   time.Duration
}

// render writes the whole report: header, table, raw output.
func render(info runInfo, rows []row, raw string) string {
	var b strings.Builder
	b.WriteString("# Benchmark report\n\n")
	mode := "full"
	if info.quick {
		mode = "QUICK=1 (short: figures are indicative only)"
	}
	fmt.Fprintf(&b, "- Date: %s\n", info.date.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- Machine: %s, %d cores (GOMAXPROCS %d), %s\n", info.cpu, info.cores, info.procs, info.osArch)
	fmt.Fprintf(&b, "- Go: %s\n", info.goVersion)
	fmt.Fprintf(&b, "- Run: %s, %v in all\n", mode, info.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "  - channel comparison: %s\n", info.compare)
	fmt.Fprintf(&b, "  - mailbox comparisons: %s\n", info.mailbox)
	fmt.Fprintf(&b, "  - signal comparison: %s\n", info.signal)
	fmt.Fprintf(&b, "  - TURN comparison: %s\n", info.turn)
	fmt.Fprintf(&b, "  - micro and push benchmarks: %s\n", info.micro)
	b.WriteString("\nRatio is how many times better ours is: ours ÷ baseline for rates, " +
		"baseline ÷ ours for times and allocations. Per-operation cells are the median over " +
		"the runs: time per operation, then allocations per operation. Ours and the baseline " +
		"ran on this machine in this run.\n\n")
	b.WriteString("| figure | ours | baseline | ratio | goal |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n",
			cell(r.figure), cell(r.ours), cell(r.baseline), cell(r.ratio), cell(r.goal))
	}
	b.WriteString("\n<details><summary>Raw output</summary>\n\n```\n")
	b.WriteString(strings.TrimRight(raw, "\n"))
	b.WriteString("\n```\n\n</details>\n")
	return b.String()
}

// cell keeps a table cell on its line and its pipes literal.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

func verdict(goal string, met bool) string {
	if met {
		return goal + " — met"
	}
	return goal + " — **not met**"
}

func times(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", r)
}

func perOp(ns, allocs float64) string {
	return fmt.Sprintf("%s, %g allocs", nsString(ns), allocs)
}

func nsString(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.2f µs", ns/1e3)
	default:
		return fmt.Sprintf("%.1f ns", ns)
	}
}

func roundDur(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// thousands formats a rate as a whole number with comma separators.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
