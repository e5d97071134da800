package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"edgerelay/bench/idlebench"
)

// idleResults are the idle-socket figures of issue 18 (parking idle
// WebSockets, bench/idlebench), each with the error that stopped it.
type idleResults struct {
	memory idlebench.MemoryReport
	// large is the memory pass at idleSocketsLarge (the 100,000,
	// capped to what the open-file limit allows), when largeRun.
	large                               idlebench.MemoryReport
	largeRun                            bool
	wake                                idlebench.WakeReport
	storm                               idlebench.StormReport
	memErr, largeErr, wakeErr, stormErr error
}

func (r idleResults) err() error { return errors.Join(r.memErr, r.largeErr, r.wakeErr, r.stormErr) }

// runIdle runs the idle-socket figures one after the other: the memory of
// each kind of idle socket, parked and unparked, plain and TLS (at
// idleSockets, then once more at idleSocketsLarge); the cost of a
// delivery to a parked watch socket; a reconnect storm against the
// binary's accept limits. Every server is an idleserve process of its own.
func runIdle(ctx context.Context, s settings, bins servers, root, tmp string, progress io.Writer) idleResults {
	var r idleResults
	bin := bins.path("idleserve")
	if bin == "" {
		var err error
		if bin, err = idlebench.Build(ctx, root, tmp); err != nil {
			r.memErr, r.wakeErr, r.stormErr = err, err, err
			fmt.Fprintf(progress, "building idleserve: %v\n", err)
			return r
		}
	}
	memory := func(n, rounds int, kinds []idlebench.Kind) (idlebench.MemoryReport, error) {
		fmt.Fprintf(progress, "\n== idle sockets parked vs unparked (issue 18): %s of each kind per server (capped to the open-file limit), plain and TLS, %d rounds each side, a server process each\n",
			thousands(float64(n)), rounds)
		rep, err := idlebench.MeasureMemory(ctx, idlebench.MemoryOptions{Binary: bin, Sockets: n, Rounds: rounds, Kinds: kinds, Progress: progress})
		if err != nil {
			fmt.Fprintf(progress, "idle memory failed: %v\n", err)
		} else {
			rep.WriteText(progress)
		}
		return rep, err
	}
	// Every kind at idleSockets, the WebSockets alone at the larger count
	// (the goals are theirs).
	r.memory, r.memErr = memory(s.idleSockets, s.idleRounds, nil)
	if s.idleSocketsLarge > 0 {
		r.largeRun = true
		r.large, r.largeErr = memory(s.idleSocketsLarge, 1, idlebench.Kinds)
	}

	fmt.Fprintf(progress, "\n== wake of a parked watch socket: %s deliveries per server to %s sockets, %d rounds each side\n",
		thousands(float64(s.wakeDeliveries)), thousands(float64(s.wakeSockets)), s.idleRounds)
	r.wake, r.wakeErr = idlebench.MeasureWake(ctx, idlebench.WakeOptions{Binary: bin, Sockets: s.wakeSockets, Deliveries: s.wakeDeliveries,
		Rounds: s.idleRounds, Progress: progress})
	if r.wakeErr != nil {
		fmt.Fprintf(progress, "wake failed: %v\n", r.wakeErr)
	} else {
		r.wake.WriteText(progress)
	}

	fmt.Fprintf(progress, "\n== reconnect storm: %s watch sockets reset at once, the binary's accept limits\n", thousands(float64(s.stormSockets)))
	r.storm, r.stormErr = idlebench.MeasureStorm(ctx, idlebench.StormOptions{Binary: bin, Sockets: s.stormSockets, Progress: progress})
	if r.stormErr != nil {
		fmt.Fprintf(progress, "storm failed: %v\n", r.stormErr)
	} else {
		r.storm.WriteText(progress)
	}
	return r
}

func idleInfo(s settings, r idleResults) string {
	info := fmt.Sprintf("%s idle sockets of each kind per server, plain and TLS, %d rounds per side alternated",
		thousands(float64(r.memory.Options.Sockets)), s.idleRounds)
	if r.largeRun {
		info += fmt.Sprintf(", and %s, 1 round per side", thousands(float64(r.large.Options.Sockets)))
	}
	info += fmt.Sprintf("; wake: %s deliveries to %s watch sockets per server; storm: %s watch sockets",
		thousands(float64(s.wakeDeliveries)), thousands(float64(s.wakeSockets)), thousands(float64(s.stormSockets)))
	for _, m := range []idlebench.MemoryReport{r.memory, r.large} {
		if m.Capped {
			info += "; " + m.CapNote()
		}
	}
	return info
}

// idleRows are the figures of issue 18: per kind of idle socket, plain
// and TLS, the resident memory parked beside today's path (a reader
// goroutine per socket), with the goals (≤ 3 KiB plain, ≤ 6 KiB
// TLS per socket, set at 100,000 sockets: each row says at how many it
// was measured, and when the open-file limit capped them); the added
// latency and CPU of a delivery to a parked watch socket (p99 added <
// 100 µs); the reconnect storm (no refusal beyond the accept rate).
func idleRows(r idleResults) []row {
	rows := memoryRows(r.memory, r.memErr)
	if r.largeRun {
		rows = append(rows, memoryRows(r.large, r.largeErr)...)
	}
	rows = append(rows, wakeRows(r)...)
	return append(rows, stormRows(r)...)
}

// memoryRows are one memory pass's rows: a row per kind, plain and TLS.
func memoryRows(m idlebench.MemoryReport, err error) []row {
	if err != nil {
		return []row{failedRow("idle socket memory, parked vs unparked", err)}
	}
	capped := ""
	if m.Capped {
		capped = fmt.Sprintf(", CAPPED from %s by the open-file limit of %s", thousands(float64(m.Requested)), thousands(float64(m.FileLimit)))
	}
	var rows []row
	for _, f := range m.Figures {
		what := map[idlebench.Kind]string{
			idlebench.Watch:     "mailbox watch socket",
			idlebench.Signal:    "mailbox signal socket (both sides of each rendezvous open)",
			idlebench.Phone:     "private channel phone channel (its computer's control socket opened before the first reading)",
			idlebench.Control:   "private channel control socket",
			idlebench.Silent:    "connection that has sent nothing (over TLS: its handshake done), before any request",
			idlebench.KeepAlive: "plain-HTTP keep-alive connection after one request (GET /health on the channel listener)",
		}[f.Kind]
		if f.TLS {
			what += ", TLS"
		}
		rows = append(rows, row{
			Figure: fmt.Sprintf("idle %s, resident memory per socket with %s open%s (a server process each, median of %d; ours: parked, ws.Parker in the handlers and server.Service.Parker on the listeners; baseline: a goroutine per socket)",
				what, thousands(float64(m.Options.Sockets)), capped, m.Options.Rounds),
			Ours:     f.MedianRound(0).Cell(),
			Baseline: f.MedianRound(1).Cell(),
			Ratio:    times(f.Ratio) + " parked/unparked",
			Goal:     verdict(f.GoalText, f.Met()),
		})
	}
	return rows
}

func wakeRows(r idleResults) []row {
	if r.wakeErr != nil {
		return []row{failedRow("delivery to a parked watch socket", r.wakeErr)}
	}
	w := r.wake
	if len(w.Parked) == 0 {
		return nil
	}
	cell := func(p50, p99, cpu time.Duration) string {
		return fmt.Sprintf("%v / %v; %v CPU", p50.Round(time.Microsecond), p99.Round(time.Microsecond), cpu.Round(100*time.Nanosecond))
	}
	return []row{{
		Figure: fmt.Sprintf("delivery to a parked watch socket: envelope PUT to its arrival on the socket, %s deliveries to %s sockets per server "+
			"(p50 / p99; server CPU per delivery, the PUT included; baseline: unparked)",
			thousands(float64(w.Options.Deliveries)), thousands(float64(w.Options.Sockets))),
		Ours:     cell(w.ParkedP50, w.ParkedP99, w.ParkedCPU),
		Baseline: cell(w.UnparkedP50, w.UnparkedP99, w.UnparkedCPU),
		Ratio:    "added " + cell(w.AddedP50, w.AddedP99, w.AddedCPU),
		Goal:     verdict(fmt.Sprintf("p99 added < %v", idlebench.GoalAddedP99), w.AddedP99 < idlebench.GoalAddedP99),
	}, {
		Figure: fmt.Sprintf("the client's own wake of a parked watch socket: a text ping to its pong, %s per server, each socket parked again before its next "+
			"(p50 / p99; server CPU per ping; baseline: unparked)", thousands(float64(w.Options.Deliveries))),
		Ours:     cell(w.ParkedPingP50, w.ParkedPingP99, w.ParkedPingCPU),
		Baseline: cell(w.UnparkedPingP50, w.UnparkedPingP99, w.UnparkedPingCPU),
		Ratio:    fmt.Sprintf("added p99 %v; %v CPU", w.AddedPingP99.Round(time.Microsecond), w.AddedPingCPU.Round(100*time.Nanosecond)),
		Goal:     "— (no goal set: the issue's is the delivery's)",
	}}
}

func stormRows(r idleResults) []row {
	if r.stormErr != nil {
		return []row{failedRow("reconnect storm", r.stormErr)}
	}
	st := r.storm
	if len(st.Parked) == 0 {
		return nil
	}
	cell := func(rs []idlebench.StormRound) (string, error) {
		var errs []error
		s := ""
		for i, x := range rs {
			if i > 0 {
				s += "; "
			}
			s += fmt.Sprintf("%v to all back (floor %v), %s refused by the rate", x.Reconnect.Round(time.Millisecond),
				x.Floor.Round(time.Millisecond), thousands(float64(x.Refused.Rate)))
			errs = append(errs, st.Options.Check(x))
		}
		return s, errors.Join(errs...)
	}
	ours, oursErr := cell(st.Parked)
	base, baseErr := cell(st.Unparked)
	goal := verdict("every socket back, no refusal beyond the accept rate", oursErr == nil && baseErr == nil)
	if err := errors.Join(oursErr, baseErr); err != nil {
		goal += ": " + err.Error()
	}
	l := st.Options.Limits
	return []row{{
		Figure: fmt.Sprintf("reconnect storm: %s idle watch sockets reset at once, every client reconnecting (back-off 100 ms doubling to 2 s) "+
			"against the binary's accept limits (%s accepted/s, burst %s, %s per IP; %s connections)",
			thousands(float64(st.Options.Sockets)), thousands(l.AcceptRate), thousands(float64(l.AcceptBurst)),
			thousands(float64(l.MaxConnsPerIP)), thousands(float64(l.MaxConns))),
		Ours:     ours,
		Baseline: base,
		Ratio:    times(float64(st.UnparkedReconnect) / float64(st.ParkedReconnect)),
		Goal:     goal,
	}}
}
