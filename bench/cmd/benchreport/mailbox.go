package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"edgerelay/bench/mailboxbench"
	"edgerelay/store"
)

// mailboxWriters are the PUT comparison's writer counts: one writer, and
// many each on a mailbox of its own.
var mailboxWriters = []int{1, 64}

// mailboxResults are the mailbox comparisons' reports, each with the error
// that stopped it (its rows then say so).
type mailboxResults struct {
	pinned   mailboxbench.PinnedReport
	watch    mailboxbench.WatchReport
	pinErr   error
	watchErr error
}

func (m mailboxResults) err() error { return errors.Join(m.pinErr, m.watchErr) }

// runMailbox runs the mailbox comparisons one after the other: HEAD and
// GET against the net/http baseline and synced envelope PUTs against raw
// Pebble, each server a process of its own pinned apart from the load
// generator (mailboxbench.ComparePinned), then the memory of idle watch
// sockets.
func runMailbox(ctx context.Context, s settings, bins servers, progress io.Writer) mailboxResults {
	var m mailboxResults
	fmt.Fprintf(progress, "\n== mailbox HEAD, GET and synced PUT: ours vs net/http and raw Pebble, each server pinned in a process of its own, %d rounds of %v (PUT %v)\n",
		s.rounds, s.mailboxRound, s.mailboxPutRound)
	m.pinned, m.pinErr = mailboxbench.ComparePinned(ctx, mailboxbench.PinnedOptions{
		Rounds: s.rounds, RoundTime: s.mailboxRound, PutRoundTime: s.mailboxPutRound, Writers: mailboxWriters,
		Binary: bins.path("mailboxserve"), Progress: progress,
	})
	if m.pinErr != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", m.pinErr)
	}
	for _, w := range m.pinned.Warnings {
		fmt.Fprintf(progress, "warning: %s\n", w)
	}
	fmt.Fprintf(progress, "\n== mailbox idle watch sockets: ours vs baseline, %s sockets, a server process each\n", thousands(float64(s.watchSockets)))
	m.watch, m.watchErr = mailboxbench.CompareWatchMemory(ctx, mailboxbench.WatchOptions{
		Binary: bins.path("watchmem"), Sockets: s.watchSockets, Progress: progress})
	if m.watchErr != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", m.watchErr)
	}
	return m
}

func mailboxInfo(s settings, m mailboxResults) string {
	o := m.pinned.Options
	return fmt.Sprintf("%d rounds per side and figure (first dropped) of %v (PUT %v), alternated; HEAD of a direction, GET and HEAD of one envelope over %d connections, one request at a time and %d pipelined; "+
		"PUTs of %d B envelopes by %d and %d writers against raw Pebble and an HTTP floor; "+
		"ours and the Pebble writers with GOMAXPROCS=%d as serve runs (store.EnsureProcs), the net/http baseline and the HEAD floor "+
		"with Go's default, 1 on their core (their fastest); %s; %s idle watch sockets per server",
		s.rounds, s.mailboxRound, s.mailboxPutRound, o.Conns, o.Pipeline, o.EnvelopeSize, mailboxWriters[0], mailboxWriters[1],
		store.MinProcs, pinnedText(m.pinned.Pinned, o.ServerCPU, o.LoadCPU, "server", m.pinned.Warnings), thousands(float64(s.watchSockets)))
}

// mailboxRows are the mailbox figures: the pinned comparison's (HEAD and
// GET per server CPU-second against the net/http baseline, synced PUTs
// against raw Pebble), the handlers called directly (from the micro
// benchmarks), and the memory of an idle watch socket.
func mailboxRows(m mailboxResults, bench benchResults) []row {
	var rows []row
	if m.pinErr != nil {
		rows = append(rows, failedRow("mailbox pinned comparison (HEAD, GET, PUT)", m.pinErr))
	}
	rows = append(rows, m.pinned.Rows()...)
	// Each row: our sub-benchmark, the baseline's, and the figure's name.
	// A first read of an envelope (the cache off) is set beside the
	// baseline's GET, which has no cache either.
	for _, c := range []struct{ ours, base, name string }{
		{"head-direction", "head-direction", "HEAD of a direction"},
		{"get-envelope", "get-envelope", "GET of one envelope"},
		{"get-envelope-uncached", "get-envelope", "GET of one envelope, a first read (envelope cache off: Pebble's read path)"},
		{"head-envelope", "head-envelope", "HEAD of one envelope"},
	} {
		ours := bench.op(pkgMailbox, "BenchmarkServeHTTP/"+c.ours+"/ours")
		base := bench.op(pkgMailbox, "BenchmarkServeHTTP/"+c.base+"/baseline")
		if !ours.ok || !base.ok {
			rows = append(rows, row{Figure: "mailbox " + c.name + ", handler called directly", Ours: "missing",
				Baseline: "missing", Ratio: "—", Goal: "no result (see the raw output)"})
			continue
		}
		ratio := base.ns / ours.ns
		goal, met := fmt.Sprintf("≥ %.0f×", goalMailboxReads), ratio >= goalMailboxReads
		if strings.HasPrefix(c.ours, "head-") {
			goal, met = goal+", 0 allocs", met && ours.allocs == 0
		}
		rows = append(rows, row{
			Figure:   "mailbox " + c.name + ", handler called directly (no server, no socket; net/http's own per-request cost left out of the baseline)",
			Ours:     ours.String(),
			Baseline: base.String(),
			Ratio:    times(ratio),
			Goal:     verdict(goal, met),
		})
	}
	if m.watchErr != nil {
		rows = append(rows, failedRow("mailbox idle watch socket memory", m.watchErr))
	} else if len(m.watch.Ours) > 0 {
		rows = append(rows, row{
			Figure: fmt.Sprintf("mailbox idle watch socket, resident memory per socket with %s open (server in a process of its own; "+
				"baseline: net/http + gorilla/websocket)", thousands(float64(m.watch.Options.Sockets))),
			Ours:     idleCell(medianIdle(m.watch.Ours)),
			Baseline: idleCell(medianIdle(m.watch.Baseline)),
			Ratio:    times(m.watch.Ratio),
			Goal:     verdict(fmt.Sprintf("≤ %d KiB per socket", goalWatchBytes>>10), m.watch.OursMedian <= goalWatchBytes),
		})
	}
	return rows
}
