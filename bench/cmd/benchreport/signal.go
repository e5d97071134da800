package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
	"edgerelay/bench/pushbench"
	"edgerelay/bench/signalbench"
)

// The packages of the signal and push benchmarks the report reads.
const (
	pkgSignal = "edgerelay/bench/signalbench"
	pkgPush   = "edgerelay/bench/pushbench"
	pkgPushgw = "edgerelay/bench/pushgwbench"
)

// The goals the issues set for the mailbox extensions and the push
// gateway.
const (
	goalSignalRatio   = 1.3  // frames per relay CPU-second, ours ÷ baseline
	goalPushesPerCore = 4000 // pushes per CPU-second, fan-out and gateway alike
)

// signalResults is the signal comparison's report, or the error that
// stopped it.
type signalResults struct {
	rep signalbench.Report
	err error
}

// runSignal runs the signal comparison: ours and the baseline, each in a
// process of its own, under the same loads.
func runSignal(ctx context.Context, s settings, bins servers, progress io.Writer) signalResults {
	fmt.Fprintf(progress, "\n== mailbox signal forwarding: ours vs baseline, each relay in a process of its own, %d rounds of %v, %d rendezvous\n",
		s.rounds, s.signalRound, s.signalPairs)
	var r signalResults
	r.rep, r.err = signalbench.Compare(ctx, signalbench.Options{
		Rounds: s.rounds, RoundTime: s.signalRound, Pairs: s.signalPairs, Binary: bins.path("signalserve"), Progress: progress,
	})
	if r.err != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", r.err)
	}
	for _, w := range r.rep.Warnings {
		fmt.Fprintf(progress, "warning: %s\n", w)
	}
	return r
}

func signalInfo(s settings, r signalResults) string {
	if r.err != nil {
		return "failed (see the table and the raw output)"
	}
	return fmt.Sprintf("%d rounds per relay and load (first dropped) of %v, alternated; %d rendezvous with both sides open; %s",
		s.rounds, s.signalRound, s.signalPairs,
		pinnedText(r.rep.Pinned, r.rep.Options.ServerCPU, r.rep.Options.LoadCPU, "relay", r.rep.Warnings))
}

// loadText says what one signal load was.
func loadText(l signalbench.Load) string {
	if l.Window == 1 {
		return fmt.Sprintf("%d B frames one at a time per rendezvous (ping-pong)", l.Size)
	}
	return fmt.Sprintf("%d B frames, %d in flight per rendezvous", l.Size, l.Window)
}

// signalRows are the signal figures: per load, frames per relay
// CPU-second (the figure, with the wall rate and the relay's core
// use beside it) and the relay process's allocations per frame; then the
// exact allocation count of one round trip in one process, from the
// micro benchmark.
func signalRows(r signalResults, bench benchResults) []row {
	var rows []row
	if r.err != nil {
		rows = append(rows, failedRow("mailbox signal forwarding comparison", r.err))
	}
	pinned := "each relay a process of its own"
	if r.rep.Pinned {
		pinned += " pinned to one core"
	}
	for _, res := range r.rep.Results {
		o, b := res.Ours, res.Baseline
		rows = append(rows,
			row{
				Figure: fmt.Sprintf("mailbox signal forwarding, %s, %d rendezvous: frames per relay CPU-second (frames/s, relay core use); "+
					"%s; baseline: net/http + gorilla/websocket", loadText(res.Load), r.rep.Options.Pairs, pinned),
				Ours:     signalCell(o),
				Baseline: signalCell(b),
				Ratio:    benchfmt.RoundRatio(res.RoundRatio, ratiosOf(signalPerCore(o), signalPerCore(b)), res.Ratio),
				Goal:     verdict(fmt.Sprintf("≥ %.1f×", goalSignalRatio), res.RoundRatio >= goalSignalRatio),
			},
			row{
				Figure:   fmt.Sprintf("mailbox signal forwarding, %s: relay process heap allocations per forwarded frame", loadText(res.Load)),
				Ours:     fmt.Sprintf("%.3f", o.AllocsPerFrame),
				Baseline: fmt.Sprintf("%.3f", b.AllocsPerFrame),
				Ratio:    "—",
				Goal:     verdict("0 allocs/frame", o.AllocsPerFrame <= goalFrameAllocs),
			})
	}
	found := false
	for _, name := range bench.names(pkgSignal) {
		size, ok := strings.CutPrefix(name, "BenchmarkSignalRoundTrip/")
		if !ok {
			continue
		}
		found = true
		allocs, _ := bench.median(pkgSignal, name, "allocs/op")
		ns, _ := bench.median(pkgSignal, name, "ns/op")
		fps, _ := bench.median(pkgSignal, name, "frames/s")
		rows = append(rows, row{
			Figure: fmt.Sprintf("mailbox signal forwarding, %s B frames one in flight, one process with raw clients that allocate nothing: "+
				"relay allocs per round trip of two frames (frames/s, µs per round trip)", strings.TrimSuffix(size, "B")),
			Ours:     fmt.Sprintf("%g (%s%s frames/s, %.1f µs)", allocs, thousands(fps), benchfmt.RateSpread(bench.values(pkgSignal, name, "frames/s")), ns/1e3),
			Baseline: "—",
			Ratio:    "—",
			Goal:     verdict("0 allocs/frame", allocs == 0),
		})
	}
	if !found {
		rows = append(rows, row{Figure: "mailbox signal forwarding, relay allocs per round trip (one process, raw clients)", Ours: "missing",
			Baseline: "—", Ratio: "—", Goal: "0 allocs/frame — no result (see the raw output)"})
	}
	return rows
}

func signalCell(s signalbench.Side) string {
	return fmt.Sprintf("%s (%s/s, %.0f%% of a core)", benchfmt.Rate(s.PerCoreSec, signalPerCore(s)), thousands(s.PerSec), 100*s.CoreUse)
}

func signalPerCore(s signalbench.Side) []float64 {
	return abtest.Values(s.Runs, signalbench.Run.PerCoreSec)
}

// pushFanoutRows is the mailbox's push fan-out figure, from
// BenchmarkPushFanout: pushes the fake APNs accepted per CPU-second of
// the whole process, with the wall rate, the allocations per push and the
// pushes the relay skipped beside it.
func pushFanoutRows(bench benchResults) []row {
	const name = "BenchmarkPushFanout"
	what := fmt.Sprintf("mailbox push fan-out to the fake APNs: envelope PUTs with X-Relay-Notify: alert through the real handler over loopback, "+
		"%d mailboxes each with its own registered device, %d writers: pushes per CPU-second of the whole process "+
		"(writers' client, synced envelope writes, relay, fake APNs over HTTP/2) (pushes/s; allocs per push, whole process; pushes skipped)",
		pushbench.DefaultMailboxes, pushbench.DefaultWriters)
	goal := fmt.Sprintf("≥ %s/s per core", thousands(goalPushesPerCore))
	perCore, ok := bench.median(pkgPush, name, "pushes/cpu-s")
	if !ok {
		return []row{{Figure: what, Ours: "missing", Baseline: "—", Ratio: "—", Goal: goal + " — no result (see the raw output)"}}
	}
	perSec, _ := bench.median(pkgPush, name, "pushes/s")
	allocs, _ := bench.median(pkgPush, name, "allocs/op")
	skipped, _ := bench.median(pkgPush, name, "skipped/op")
	return []row{{
		Figure:   what,
		Ours:     fmt.Sprintf("%s (%s/s; %.0f allocs; %.1f%% skipped)", benchfmt.Rate(perCore, bench.values(pkgPush, name, "pushes/cpu-s")), thousands(perSec), allocs, 100*skipped),
		Baseline: "— (no baseline)",
		Ratio:    "—",
		Goal:     verdict(goal+", none skipped", perCore >= goalPushesPerCore && skipped == 0),
	}}
}

// pushgwRows are the push gateway's figures, from BenchmarkSendAPNs: per
// variant (budget off and on), pushes per CPU-second of the whole
// process, with the wall rate and allocations per send.
func pushgwRows(bench benchResults) []row {
	goal := fmt.Sprintf("≥ %s/s per core", thousands(goalPushesPerCore))
	var rows []row
	for _, name := range bench.names(pkgPushgw) {
		variant, ok := strings.CutPrefix(name, "BenchmarkSendAPNs/")
		if !ok {
			continue
		}
		perCore, _ := bench.median(pkgPushgw, name, "pushes/cpu-s")
		perSec, _ := bench.median(pkgPushgw, name, "pushes/s")
		allocs, _ := bench.median(pkgPushgw, name, "allocs/op")
		rows = append(rows, row{
			Figure: fmt.Sprintf("push gateway POST /send → fake APNs over HTTP/2, daily budget %s, 8 concurrent senders per core over loopback: "+
				"pushes per CPU-second of the whole process (client, gateway, provider client, fake APNs) (pushes/s; allocs per send, whole process)",
				map[bool]string{true: "on (metered)", false: "off"}[variant == "metered"]),
			Ours:     fmt.Sprintf("%s (%s/s; %.0f allocs)", benchfmt.Rate(perCore, bench.values(pkgPushgw, name, "pushes/cpu-s")), thousands(perSec), allocs),
			Baseline: "— (no baseline)",
			Ratio:    "—",
			Goal:     verdict(goal, perCore >= goalPushesPerCore),
		})
	}
	if len(rows) == 0 {
		rows = append(rows, row{Figure: "push gateway POST /send → fake APNs: pushes per CPU-second", Ours: "missing",
			Baseline: "— (no baseline)", Ratio: "—", Goal: goal + " — no result (see the raw output)"})
	}
	return rows
}
