package main

import (
	"fmt"
	"regexp"
	"strings"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
)

// The routers of cluster mode (store/cluster/{signalroute,channelroute,
// agentroute}) on a 3-node embedded cluster, beside raw core NATS of the
// same bytes between the same nodes (the floor), and beside the single
// node's router. Their benchmarks run their rounds themselves, alternating
// the cases, so each package runs with -count=1 and -benchtime=Nx; the
// report picks the first rounds with the -bench pattern.
const (
	// routeClusterRounds are the rounds of a full run (QUICK: one).
	routeClusterRounds = 3
	// routeClusterFrames is -benchtime of each case and round, as a count
	// (QUICK: routeClusterQuickFrames): frames in a stream or one by one,
	// and the back-pressure flow's frames, paced (2 s at its 10,000 a
	// second).
	routeClusterFrames      = "20000x"
	routeClusterQuickFrames = "2000x"
	// routeCPUGoal is issue 16's bound on a cross-node frame's CPU: at
	// most this many times the floor's.
	routeCPUGoal = 1.5
	// routeBackpressureGoal is issue 16's: the unrelated flow keeps its
	// rate within 10% while a consumer beside it is frozen.
	routeBackpressureGoal = 0.9
)

// routeFlow is one measured direction of a router's benchmarks.
type routeFlow struct {
	what  string // "signal frames, 200 B, side to side"
	bench string // "BenchmarkSignalFrames"
	// The cases' names; local and same "" when the benchmark has none.
	local, same, cross, floor string
	unit                      string // the stream's CPU unit
}

// routePackage is one router's benchmarks.
type routePackage struct {
	router string // "signal"
	dir    string // "./store/cluster/signalroute/"
	pkg    string // "edgerelay/store/cluster/signalroute"
	flows  []routeFlow
	// frozen is the back-pressure benchmark and what its consumer is.
	frozen, consumer string
}

var routePackages = []routePackage{
	{
		router: "signal", dir: "./store/cluster/signalroute/", pkg: "edgerelay/store/cluster/signalroute",
		flows: []routeFlow{{what: "signal frames (200 B) from one side to the other", bench: "BenchmarkSignalFrames",
			local: "local", same: "cluster-same-node", cross: "cluster-cross-node", floor: "raw-nats-cross-node", unit: "cpu-ns/frame"}},
		frozen: "BenchmarkSignalFrozenSide", consumer: "a second pair's receiving side",
	},
	{
		router: "channel", dir: "./store/cluster/channelroute/", pkg: "edgerelay/store/cluster/channelroute",
		flows: []routeFlow{
			{what: "channel frames (1 KiB) from a phone to its computer", bench: "BenchmarkPhoneToComputer",
				local: "local", same: "same-node", cross: "cross-node", floor: "raw-nats", unit: "cpu-ns/frame"},
			{what: "channel frames (1 KiB) from a computer to its phone", bench: "BenchmarkComputerToPhone",
				local: "local", same: "same-node", cross: "cross-node", floor: "raw-nats", unit: "cpu-ns/frame"},
		},
		frozen: "BenchmarkChannelFrozenPhone", consumer: "a second phone of the same computer",
	},
	{
		router: "agent", dir: "./store/cluster/agentroute/", pkg: "edgerelay/store/cluster/agentroute",
		flows: []routeFlow{{what: "agent lines (1 KiB) from a link to its client", bench: "BenchmarkAgentHop",
			cross: "route", floor: "raw-nats", unit: "cpu-ns/line"}},
		frozen: "BenchmarkAgentFrozenClient", consumer: "a second client of the same link",
	},
}

// routeClusterPattern selects the package's benchmarks, their cases of
// the first rounds ("#01", "#02", … are go test's names of a case's
// repeats, one a round); the modes beneath (stream, one-by-one) all run.
func (p routePackage) pattern(quick bool) string {
	benches := []string{strings.TrimPrefix(p.frozen, "Benchmark")}
	for _, f := range p.flows {
		benches = append(benches, strings.TrimPrefix(f.bench, "Benchmark"))
	}
	repeats := ""
	if !quick && routeClusterRounds > 1 {
		repeats = fmt.Sprintf("(#0[1-%d])?", routeClusterRounds-1)
	}
	return `^Benchmark(` + strings.Join(benches, "|") + `)$/^[a-z-]+` + repeats + `$`
}

// routeClusterRuns are the routers' `go test -bench` runs, one a package.
func routeClusterRuns(quick bool) []benchRun {
	frames := routeClusterFrames
	if quick {
		frames = routeClusterQuickFrames
	}
	var runs []benchRun
	for _, p := range routePackages {
		runs = append(runs, benchRun{p.pattern(quick), []string{p.dir}, 1, frames})
	}
	return runs
}

// anyRepeat is a round's suffix on any level of a name
// ("Frames/local#01/stream").
var anyRepeat = regexp.MustCompile(`#\d+`)

// roundValues are a package's figures by name without the round
// suffixes ("BenchmarkSignalFrames/local/stream") and unit: one value a
// round, in the order the rounds ran.
func roundValues(bench benchResults, pkg string) map[string]map[string][]float64 {
	out := map[string]map[string][]float64{}
	for _, name := range bench.names(pkg) {
		key := anyRepeat.ReplaceAllString(name, "")
		if out[key] == nil {
			out[key] = map[string][]float64{}
		}
		for _, s := range bench.samples[pkg][name] {
			for unit, v := range s {
				out[key][unit] = append(out[key][unit], v)
			}
		}
	}
	return out
}

// routeClusterRows are the routers' cluster figures, per flow: CPU per
// frame across nodes beside the floor (issue 16's goal: at most 1.5×),
// on one node of the cluster beside the single node's router, the one-way
// latency across beside the floor's, allocations of ours per frame (the
// whole process's minus the floor's: goal 0); and per router the
// back-pressure figure (the goal: the unrelated flow within 10% of its
// offered rate while the other consumer is frozen and closed).
func routeClusterRows(bench benchResults) []row {
	var rows []row
	for _, p := range routePackages {
		v := roundValues(bench, p.pkg)
		for _, f := range p.flows {
			rows = append(rows, routeFlowRows(p, f, v)...)
		}
		rows = append(rows, routeBackpressureRow(p, v))
	}
	return rows
}

const routeSetting = "3-node embedded NATS cluster on loopback in this process, through the router's API (route.Signals, route.Channel, route.Agent) without the WebSocket layer; " +
	"CPU is the whole process's (the three nats-servers, both routers, sender and receiver) per frame in a stream, as is allocs/op; " +
	"on a machine shared with other work"

func routeFlowRows(p routePackage, f routeFlow, v map[string]map[string][]float64) []row {
	get := func(c, mode, unit string) []float64 { return v[f.bench+"/"+c+"/"+mode][unit] }
	cross, floor := get(f.cross, "stream", f.unit), get(f.floor, "stream", f.unit)
	missing := func(figure, goal string) row {
		return row{Figure: figure, Ours: "missing", Baseline: "missing", Ratio: "—", Goal: goal + " — no result (see the raw output)"}
	}
	n := func(r []float64) string {
		return fmt.Sprintf("median of %d round%s alternated", len(r), plural(fmt.Sprint(len(r))))
	}
	var rows []row

	per := strings.TrimPrefix(f.unit, "cpu-ns/") // "frame", "line"
	figure := fmt.Sprintf("%s router across nodes: %s, from one node to another (%s), CPU per %s vs raw core NATS publish/subscribe of the same bytes between the same nodes (the floor)",
		p.router, f.what, routeSetting, per)
	goal := fmt.Sprintf("≤ %.1f× the floor's CPU per %s", routeCPUGoal, per)
	if len(cross) == 0 || len(floor) == 0 {
		rows = append(rows, missing(figure, goal))
	} else {
		r := abtest.RoundRatios(cross, floor)
		m := abtest.Median(r)
		rows = append(rows, row{Figure: figure + "; " + n(r), Ours: cpuCell(cross, per), Baseline: cpuCell(floor, per),
			Ratio: benchfmt.RoundRatio(m, r, abtest.Median(cross)/abtest.Median(floor)), Goal: verdict(goal, m <= routeCPUGoal)})
	}

	if f.local != "" {
		same, local := get(f.same, "stream", f.unit), get(f.local, "stream", f.unit)
		figure := fmt.Sprintf("%s router, both ends on one node of the cluster vs the single node's router (route.NewLocal…): %s, CPU per frame in a stream (no NATS on the way)", p.router, f.what)
		if len(same) == 0 || len(local) == 0 {
			rows = append(rows, missing(figure, "— (measured)"))
		} else {
			r := abtest.RoundRatios(same, local)
			rows = append(rows, row{Figure: figure + "; " + n(r), Ours: cpuCell(same, per), Baseline: cpuCell(local, per),
				Ratio: benchfmt.RoundRatio(abtest.Median(r), r, abtest.Median(same)/abtest.Median(local)), Goal: "— (measured)"})
		}
	}

	op50, op99 := get(f.cross, "one-by-one", "p50-µs"), get(f.cross, "one-by-one", "p99-µs")
	fp50, fp99 := get(f.floor, "one-by-one", "p50-µs"), get(f.floor, "one-by-one", "p99-µs")
	figure = fmt.Sprintf("%s router across nodes: %s, one-way latency of frames sent one at a time (each once the one before arrived), p50 / p99, vs the floor's (raw core NATS, same nodes, same bytes)", p.router, f.what)
	if len(op50) == 0 || len(fp50) == 0 {
		rows = append(rows, missing(figure, "— (measured)"))
	} else {
		r := abtest.RoundRatios(op50, fp50)
		rows = append(rows, row{Figure: figure + "; " + n(r) + "; ratio of the p50s, ours ÷ the floor's", Ours: routeLatencyCell(op50, op99), Baseline: routeLatencyCell(fp50, fp99),
			Ratio: benchfmt.RoundRatio(abtest.Median(r), r, abtest.Median(op50)/abtest.Median(fp50)),
			Goal:  fmt.Sprintf("— (measured; added p50 %+.1f µs, p99 %+.1f µs)", abtest.Median(op50)-abtest.Median(fp50), abtest.Median(op99)-abtest.Median(fp99))})
	}

	oa, fa := get(f.cross, "stream", "allocs/op"), get(f.floor, "stream", "allocs/op")
	figure = fmt.Sprintf("%s router across nodes: %s, allocations of ours per %s in steady state: the whole process's allocs per %s in a stream minus the floor's (a raw publish and its receipt by nats.go)", p.router, f.what, per, per)
	goal = "0 of ours per " + per
	if len(oa) == 0 || len(fa) == 0 {
		rows = append(rows, missing(figure, goal))
	} else {
		d := make([]float64, min(len(oa), len(fa)))
		for i := range d {
			d[i] = oa[i] - fa[i]
		}
		m := abtest.Median(d)
		rows = append(rows, row{Figure: figure + "; " + n(d), Ours: allocsCell(oa, per), Baseline: allocsCell(fa, per),
			Ratio: fmt.Sprintf("%+g%s per %s", m, benchfmt.Spread(d, func(x float64) string { return fmt.Sprintf("%+g", x) }), per),
			Goal:  verdict(goal, m <= 0)})
	}
	return rows
}

// routeBackpressureRow: the measured flow's achieved rate over its
// offered one with the other consumer frozen (rounds in which it was
// closed at its bound only: a round in which it was not measured no
// back-pressure) beside the same with it reading.
func routeBackpressureRow(p routePackage, v map[string]map[string][]float64) row {
	reading, frozen := v[p.frozen+"/beside-reading"], v[p.frozen+"/beside-frozen"]
	figure := fmt.Sprintf("%s router back-pressure: a flow from one node to another paced at a fixed rate, while %s on that node stops reading, fills its send queue (256 KiB), "+
		"is closed at its bound and leaves, its sender still sending; the flow's achieved rate ÷ its offered rate, with the other consumer frozen vs reading, "+
		"and the most any of its frames arrived after its paced send was due (a stall caught up by the run's end shows there only) (%s)", p.router, p.consumer, routeSetting)
	goal := fmt.Sprintf("the flow keeps its rate within %.0f%% (≥ %.2f of offered) with the consumer frozen", 100*(1-routeBackpressureGoal), routeBackpressureGoal)
	if frozen == nil || reading == nil || len(frozen["achieved/offered"]) == 0 || len(reading["achieved/offered"]) == 0 {
		return row{Figure: figure, Ours: "missing", Baseline: "missing", Ratio: "—", Goal: goal + " — no result (see the raw output)"}
	}
	// The rounds in which the frozen consumer was closed, and the same
	// rounds' reading case (each round ran both, back to back).
	var ratio, rate, lag, readRatio, readRate, readLag []float64
	rounds := min(len(frozen["achieved/offered"]), len(frozen["msgs/s"]), len(frozen["closed"]),
		len(reading["achieved/offered"]), len(reading["msgs/s"]))
	lagged := len(frozen["max-lag-ms"]) >= rounds && len(reading["max-lag-ms"]) >= rounds
	for i := range rounds {
		if frozen["closed"][i] == 1 {
			ratio, rate = append(ratio, frozen["achieved/offered"][i]), append(rate, frozen["msgs/s"][i])
			readRatio, readRate = append(readRatio, reading["achieved/offered"][i]), append(readRate, reading["msgs/s"][i])
			if lagged {
				lag, readLag = append(lag, frozen["max-lag-ms"][i]), append(readLag, reading["max-lag-ms"][i])
			}
		}
	}
	closeMs := frozen["close-ms"] // reported only when closed
	if len(ratio) == 0 {
		return row{Figure: figure, Ours: fmt.Sprintf("never closed in %d round%s", rounds, plural(fmt.Sprint(rounds))), Baseline: backpressureCell(reading["achieved/offered"][:rounds], reading["msgs/s"][:rounds]),
			Ratio: "—", Goal: verdict(goal+" (no round in which the frozen consumer was closed)", false)}
	}
	m := abtest.Median(ratio)
	offered := abtest.Median(rate) / m
	r := abtest.RoundRatios(ratio, readRatio)
	return row{
		Figure: fmt.Sprintf("%s; offered %s/s; median of %d round%s in which the frozen consumer was closed, of %d", figure, thousands(offered), len(ratio), plural(fmt.Sprint(len(ratio))), rounds),
		Ours: fmt.Sprintf("%s frozen%s; closed at its bound %s ms%s after the freeze", backpressureCell(ratio, rate), lagCell(lag),
			msBare(abtest.Median(closeMs)), benchfmt.Spread(closeMs, msBare)),
		Baseline: backpressureCell(readRatio, readRate) + " reading" + lagCell(readLag),
		Ratio:    benchfmt.RoundRatio(abtest.Median(r), r, m/abtest.Median(readRatio)) + " frozen ÷ reading",
		Goal:     verdict(goal, m >= routeBackpressureGoal),
	}
}

// cpuCell: "6.14 µs [4.70 µs–6.92 µs] CPU/frame" of a stream's CPU per
// frame (per line for the agent's).
func cpuCell(ns []float64, per string) string {
	return benchfmt.Nanoseconds(abtest.Median(ns)) + benchfmt.Spread(ns, benchfmt.Nanoseconds) + " CPU/" + per
}

// routeLatencyCell: "p50 32.4 µs [32.2–39.6], p99 99.0 µs [88.7–224]".
func routeLatencyCell(p50, p99 []float64) string {
	us := func(v float64) string { return fmt.Sprintf("%.3g", v) }
	return fmt.Sprintf("p50 %s µs%s, p99 %s µs%s", us(abtest.Median(p50)), benchfmt.Spread(p50, us), us(abtest.Median(p99)), benchfmt.Spread(p99, us))
}

// allocsCell: "5 [5–6] allocs/frame".
func allocsCell(a []float64, per string) string {
	return fmt.Sprintf("%g%s allocs/%s", abtest.Median(a), benchfmt.Spread(a, func(x float64) string { return fmt.Sprintf("%g", x) }), per)
}

// backpressureCell: "0.999 [0.993–1.000] of offered (9,995/s)".
func backpressureCell(ratio, rate []float64) string {
	f := func(x float64) string { return fmt.Sprintf("%.3f", x) }
	return fmt.Sprintf("%s%s of offered (%s/s)", f(abtest.Median(ratio)), benchfmt.Spread(ratio, f), thousands(abtest.Median(rate)))
}

// lagCell: ", max lag 44.0 ms [11.1–134]" of the rounds' largest lags
// behind the pace, or "" for none reported.
func lagCell(ms []float64) string {
	if len(ms) == 0 {
		return ""
	}
	return fmt.Sprintf(", max lag %s ms%s", msBare(abtest.Median(ms)), benchfmt.Spread(ms, msBare))
}
