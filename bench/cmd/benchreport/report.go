package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
	"edgerelay/bench/channelbench"
	"edgerelay/bench/serverproc"
)

// The packages whose micro benchmarks go into the report.
const (
	pkgBucket  = "edgerelay/fastpath/bucket"
	pkgControl = "edgerelay/fastpath/channel/control"
	pkgChannel = "edgerelay/fastpath/channel"
	pkgMailbox = "edgerelay/bench/mailboxbench"
	pkgLink    = "edgerelay/sdk/link"
)

// The goals the design sets (DESIGN.md, "The hot path"; the brief of
// `make bench`).
const (
	goalChannelRatio = 1.3
	goalBucketRatio  = 3.0
	goalMailboxReads = 5.0      // HEAD and GET, ours ÷ baseline
	goalWatchBytes   = 12 << 10 // resident bytes per idle watch socket
	// goalSealTime: sealing and opening take at most this many times raw
	// AES-256-GCM's time, without allocating.
	goalSealTime = 1.2
	// goalFrameAllocs bounds a relay process's allocations per frame
	// counted over a whole run: zero per frame, but the process also
	// answers the comparison's usage queries, and each run's set-up (a
	// claim, dials) is in its window: a handful of allocations in a run
	// of 100,000s of frames. One frame in a thousand allocating would
	// fail it.
	goalFrameAllocs = 0.001
)

// row is one line of the report's table.
type row = benchfmt.Row

// The report's formats are benchfmt's, shared with the comparisons' own
// commands.
var (
	thousands = benchfmt.Thousands
	times     = benchfmt.Times
	verdict   = benchfmt.Verdict
)

// channelRows are the forwarding figures: the pinned load-generator
// comparison (frames per relay CPU-second, the judged figure; frames per
// wall second; latency; the relay process's allocations), then the
// raw-client round trip from fastpath/channel's benchmark, which is where
// the relay's own allocations show exactly (its clients allocate nothing).
func channelRows(rep *channelbench.Report, compareErr error, bench benchResults) []row {
	var rows []row
	if rep != nil {
		o := rep.Options
		where := "each relay a process of its own"
		if rep.Pinned {
			where += fmt.Sprintf(" pinned to core %d, the load generator to core %d", o.ServerCPU, o.LoadCPU)
		} else {
			where += ", NOT pinned: " + strings.Join(rep.Warnings, "; ")
		}
		load := fmt.Sprintf("%d phones, %d B frames, %s; median of %d rounds of %s round trips",
			o.Phones, o.FrameSize, where, o.Rounds-1, thousands(float64(o.Frames)))
		rows = append(rows,
			row{
				Figure: "channel forwarding phone→computer→phone, round trips per relay CPU-second (" + load +
					"; baseline: net/http + gorilla/websocket + encoding/json) (relay core use)",
				Ours:     channelCPUCell(rep.Ours),
				Baseline: channelCPUCell(rep.Baseline),
				Ratio:    benchfmt.RoundRatio(rep.RoundRatio, rep.RoundRatios, rep.Ratio),
				Goal:     verdict(fmt.Sprintf("≥ %.1f×", goalChannelRatio), rep.RoundRatio >= goalChannelRatio),
			},
			row{
				Figure:   "channel forwarding, round trips per wall second (the same runs)",
				Ours:     benchfmt.Rate(rep.Ours.Median, rep.Ours.FramesPerSec),
				Baseline: benchfmt.Rate(rep.Baseline.Median, rep.Baseline.FramesPerSec),
				Ratio: benchfmt.RoundRatio(rep.WallRoundRatio,
					ratiosOf(rep.Ours.FramesPerSec, rep.Baseline.FramesPerSec), rep.WallRatio),
				Goal: "— (throughput of one load-generator core; the goal is judged per relay core)",
			},
			row{
				Figure:   "channel forwarding, round-trip latency p50 / p99 (medians over the rounds)",
				Ours:     fmt.Sprintf("%v / %v", roundDur(rep.Ours.P50), roundDur(rep.Ours.P99)),
				Baseline: fmt.Sprintf("%v / %v", roundDur(rep.Baseline.P50), roundDur(rep.Baseline.P99)),
				Ratio: times(float64(rep.Baseline.P50)/float64(rep.Ours.P50)) + " / " +
					times(float64(rep.Baseline.P99)/float64(rep.Ours.P99)),
				Goal: "—",
			},
			row{
				Figure:   "channel forwarding, relay process heap allocations per round trip (each run's claim and dials included)",
				Ours:     fmt.Sprintf("%.3f", rep.Ours.AllocsPerFrame),
				Baseline: fmt.Sprintf("%.3f", rep.Baseline.AllocsPerFrame),
				Ratio:    times(rep.Baseline.AllocsPerFrame / rep.Ours.AllocsPerFrame),
				Goal:     "— (the exact count per frame is the next row's)",
			})
	} else {
		rows = append(rows, failedRow("channel forwarding comparison", compareErr))
	}
	const rt = "BenchmarkForwardRoundTrip"
	if allocs, ok := bench.median(pkgChannel, rt, "allocs/op"); ok {
		ns, _ := bench.median(pkgChannel, rt, "ns/op")
		fps, _ := bench.median(pkgChannel, rt, "frames/s")
		rows = append(rows,
			row{
				Figure:   "channel forwarding, relay allocs per round trip (raw clients that allocate nothing)",
				Ours:     fmt.Sprintf("%g", allocs),
				Baseline: "—",
				Ratio:    "—",
				Goal:     verdict("0 allocs/frame", allocs == 0),
			},
			row{
				Figure: "channel forwarding, one frame in flight with raw clients: frames/s (µs per round trip)",
				Ours: fmt.Sprintf("%s%s (%.1f µs)", thousands(fps), benchfmt.RateSpread(bench.values(pkgChannel, rt, "frames/s")),
					ns/1e3),
				Baseline: "—",
				Ratio:    "—",
				Goal:     "—",
			})
	} else {
		rows = append(rows, row{Figure: "channel forwarding, relay allocs per round trip", Ours: "missing",
			Baseline: "—", Ratio: "—", Goal: "0 allocs/frame — no result (see the raw output)"})
	}
	return rows
}

func channelCPUCell(s channelbench.Side) string {
	return fmt.Sprintf("%s (%.0f%% of a core)", benchfmt.Rate(s.MedianPerCPU, s.PerCPUSec), 100*s.CoreUse)
}

// ratiosOf are the per-round ratios a[i] / b[i].
func ratiosOf(a, b []float64) []float64 { return abtest.RoundRatios(a, b) }

// channelIdleRows is the memory of idle phone channels, ours against the
// baseline, each relay in a process of its own. No goal is set for it;
// the goal cell says what the memory is.
func channelIdleRows(r *channelbench.IdleReport, err error) []row {
	if err != nil {
		return []row{failedRow("private channel idle phone channels memory", err)}
	}
	if r == nil || len(r.Ours) == 0 {
		return nil
	}
	o, b := medianIdle(r.Ours), medianIdle(r.Baseline)
	return []row{{
		Figure: fmt.Sprintf("private channel idle phone channel, resident memory per phone with %s open on %s computers' control sockets "+
			"(%d phones each; the control sockets opened before the first reading; each relay a process of its own; "+
			"baseline: net/http + gorilla/websocket)",
			thousands(float64(r.Options.Phones)), thousands(float64(r.Computers)), r.Options.PerComputer),
		Ours:     idleCell(o),
		Baseline: idleCell(b),
		Ratio:    times(r.Ratio),
		Goal:     "— (no goal set; ours: " + dominant(o) + ")",
	}}
}

// medianIdle is the round whose bytes per socket are the median's (the
// lower middle one for an even count), so that its breakdown is shown.
func medianIdle(costs []serverproc.IdleCost) serverproc.IdleCost {
	s := append([]serverproc.IdleCost(nil), costs...)
	sort.Slice(s, func(i, j int) bool { return s[i].PerSocket < s[j].PerSocket })
	return s[(len(s)-1)/2]
}

// idleCell is bytes per socket, then what the runtime says they are.
func idleCell(c serverproc.IdleCost) string {
	return fmt.Sprintf("%.1f KiB (stacks %.1f, heap %.1f KiB; %.2f goroutines)",
		c.PerSocket/1024, c.StackPerSocket/1024, c.HeapPerSocket/1024, c.GoroutinesPerSocket)
}

// dominant says which of a socket's costs is the largest: goroutine
// stacks, heap, or the rest of the resident set (the runtime's metadata,
// and what the process has not given back).
func dominant(c serverproc.IdleCost) string {
	rest := c.PerSocket - c.StackPerSocket - c.HeapPerSocket
	what, v := "goroutine stacks", c.StackPerSocket
	if c.HeapPerSocket > v {
		what, v = "heap", c.HeapPerSocket
	}
	if rest > v {
		what, v = "resident memory outside the stacks and heap", rest
	}
	share := 0.0
	if c.PerSocket > 0 {
		share = 100 * v / c.PerSocket
	}
	return fmt.Sprintf("%s dominate, %.0f%% of it, with %.2f goroutines per socket", what, share, c.GoroutinesPerSocket)
}

// bucketRows pair each BenchmarkSetTake shape with BenchmarkXRate's.
func bucketRows(bench benchResults) []row {
	var rows []row
	for _, name := range bench.names(pkgBucket) {
		shape, ok := strings.CutPrefix(name, "BenchmarkSetTake/")
		if !ok {
			continue
		}
		ours, rate := bench.op(pkgBucket, name), bench.op(pkgBucket, "BenchmarkXRate/"+shape)
		if !rate.ok {
			continue
		}
		ratio := rate.ns / ours.ns
		rows = append(rows, row{
			Figure:   "token bucket take, " + shape + " (vs golang.org/x/time/rate)",
			Ours:     ours.String(),
			Baseline: rate.String(),
			Ratio:    times(ratio),
			Goal:     verdict(fmt.Sprintf("≥ %.0f×, 0 allocs", goalBucketRatio), ratio >= goalBucketRatio && ours.allocs == 0),
		})
	}
	if len(rows) == 0 {
		rows = append(rows, row{Figure: "token bucket take", Ours: "missing", Baseline: "missing",
			Ratio: "—", Goal: fmt.Sprintf("≥ %.0f×, 0 allocs — no result (see the raw output)", goalBucketRatio)})
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
		ours, json := bench.op(pkgControl, name), bench.op(pkgControl, base+"/encoding_json")
		if !json.ok {
			continue
		}
		fn, payload, _ := strings.Cut(strings.TrimPrefix(base, "Benchmark"), "/")
		rows = append(rows, row{
			Figure:   fmt.Sprintf("control codec %s, %s (vs encoding/json)", fn, payload),
			Ours:     ours.String(),
			Baseline: json.String(),
			Ratio:    times(json.ns / ours.ns),
			Goal:     verdict("0 allocs", ours.allocs == 0),
		})
	}
	return rows
}

// sdkRows pair the SDK's envelope seal and open (sdk/link) with raw
// AES-256-GCM doing the same work (BenchmarkSeal and BenchmarkOpen, ours
// and raw per size). The goal is on time: ours takes at most 1.2 times
// raw's, and allocates nothing.
func sdkRows(bench benchResults) []row {
	var rows []row
	for _, name := range bench.names(pkgLink) {
		base, ok := strings.CutSuffix(name, "/ours")
		if !ok {
			continue
		}
		ours, raw := bench.op(pkgLink, name), bench.op(pkgLink, base+"/raw")
		if !raw.ok {
			continue
		}
		fn, size, _ := strings.Cut(strings.TrimPrefix(base, "Benchmark"), "/")
		took := ours.ns / raw.ns
		rows = append(rows, row{
			Figure:   fmt.Sprintf("SDK envelope %s, %s (sdk/link vs raw AES-256-GCM: cipher.NewGCM built once, same nonce and AAD shape)", strings.ToLower(fn), size),
			Ours:     ours.String(),
			Baseline: raw.String(),
			Ratio:    fmt.Sprintf("%s (ours takes %.2f× raw's time)", times(raw.ns/ours.ns), took),
			Goal:     verdict(fmt.Sprintf("≤ %.1f× raw's time, 0 allocs", goalSealTime), took <= goalSealTime && ours.allocs == 0),
		})
	}
	if len(rows) == 0 {
		rows = append(rows, row{Figure: "SDK envelope seal and open vs raw AES-256-GCM", Ours: "missing", Baseline: "missing",
			Ratio: "—", Goal: fmt.Sprintf("≤ %.1f× raw's time, 0 allocs — no result (see the raw output)", goalSealTime)})
	}
	return rows
}

func failedRow(what string, err error) row {
	return row{Figure: what, Ours: "failed", Baseline: "failed", Ratio: "—", Goal: fmt.Sprintf("error: %v", err)}
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
	// parts says what each part of the run ran and how long it took, in
	// the order they ran: {"channel comparison", "8 rounds …; 57s"}.
	parts   [][2]string
	elapsed time.Duration
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
	for _, p := range info.parts {
		fmt.Fprintf(&b, "  - %s: %s\n", p[0], p[1])
	}
	b.WriteString("\nRatio is how many times better ours is: ours ÷ baseline for rates, " +
		"baseline ÷ ours for times, memory and allocations. Load comparisons alternate ours and the baseline " +
		"round by round (ABBA), drop the first round and give medians; their ratio is the median of the " +
		"per-round ratios (each round ran both sides back to back), the ratio of the medians beside it. " +
		"Brackets give the spread: the lowest and the highest value over the counted rounds (load comparisons) " +
		"or over the -count runs (micro benchmarks). Per-operation cells of the micro benchmarks are the median " +
		"time per operation, then allocations per operation. \"Per relay (server) CPU-second\" divides the work " +
		"done by the CPU time of the server's own process, pinned to a core apart from the load generator's. " +
		"Ours and the baseline ran on this machine in this run. The mailbox HEAD, GET and PUT figures come from " +
		"the pinned out-of-process comparison (mailboxbench.ComparePinned), which replaces the earlier " +
		"in-process loopback rows: those shared two cores between server and load generator. Its \"HTTP floor\" rows " +
		"measure servers that do nothing but the HTTP exchange (and, for PUT, raw Pebble's synced commit) under the " +
		"same load: what no HTTP server can beat on this machine, so a goal above a floor's ratio cannot be met here. " +
		"Its pipelined rows write 16 requests per connection at once, as TechEmpower's plaintext test does, so that " +
		"the kernel's cost of a round trip is shared and each server's own cost per request shows. Before each PUT " +
		"round every server with a Pebble store waits until none of them has a flush or compaction running, so that " +
		"no process's background work from earlier rounds runs on the shared server core during another's round.\n\n")
	b.WriteString("| figure | ours | baseline | ratio | goal |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r.Markdown() + "\n")
	}
	b.WriteString("\n<details><summary>Raw output</summary>\n\n```\n")
	b.WriteString(strings.TrimRight(raw, "\n"))
	b.WriteString("\n```\n\n</details>\n")
	return b.String()
}

func roundDur(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
