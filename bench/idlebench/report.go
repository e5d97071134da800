package idlebench

import (
	"fmt"
	"io"
	"time"
)

// The goals of issue 18, per idle socket at 100,000 sockets (measured
// where the open-file limit allows; see MemoryReport.CapNote), and for a
// wake.
const (
	GoalPlainBytes = 3 << 10
	GoalTLSBytes   = 6 << 10
	GoalAddedP99   = 100 * time.Microsecond
)

// Met reports whether the parked median meets the goal.
func (f MemoryFigure) Met() bool { return f.ParkedMedian <= f.GoalBytes }

// MedianRound is the round of side (0 parked, 1 unparked) whose bytes per
// socket are the median's (the lower middle one for an even count), so
// that its breakdown can be shown.
func (f MemoryFigure) MedianRound(side int) IdleRound {
	rs := f.Parked
	if side == 1 {
		rs = f.Unparked
	}
	best := rs[0]
	med := medianPerSocket(rs)
	for _, r := range rs {
		if abs(r.PerSocket-med) < abs(best.PerSocket-med) {
			best = r
		}
	}
	return best
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// Cell is one side's figure: bytes per socket, what the runtime says
// they are, the goroutines per socket and, parked, how many were.
func (r IdleRound) Cell() string {
	s := fmt.Sprintf("%.1f KiB (stacks %.1f, heap %.1f KiB; %.2f goroutines)",
		r.PerSocket/1024, r.StackPerSocket/1024, r.HeapPerSocket/1024, r.GoroutinesPerSocket)
	if r.Parked > 0 {
		s += fmt.Sprintf("; %d of %d parked", r.Parked, r.Held)
	}
	return s
}

// WriteText writes the memory figures, one line each, and the cap note.
func (r MemoryReport) WriteText(w io.Writer) {
	if r.Capped {
		fmt.Fprintln(w, r.CapNote())
	}
	fmt.Fprintf(w, "idle sockets, %d per server, resident memory per socket (median of %d rounds, parked / unparked):\n", r.Options.Sockets, r.Options.Rounds)
	for _, f := range r.Figures {
		verdict := "met"
		if !f.Met() {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "  %-13s parked %s | unparked %s | ratio %.2f | goal %s: %s\n",
			f.Name(), f.MedianRound(0).Cell(), f.MedianRound(1).Cell(), f.Ratio, f.GoalText, verdict)
	}
}

// WriteText writes the wake figures.
func (r WakeReport) WriteText(w io.Writer) {
	verdict := "met"
	if r.AddedP99 >= GoalAddedP99 {
		verdict = "NOT met"
	}
	fmt.Fprintf(w, "wake: an envelope PUT to a watched mailbox, %d sockets, %d deliveries per server, median of %d rounds:\n",
		r.Options.Sockets, r.Options.Deliveries, r.Options.Rounds)
	fmt.Fprintf(w, "  parked   p50 %v p99 %v, server CPU %v per delivery\n", r.ParkedP50, r.ParkedP99, r.ParkedCPU)
	fmt.Fprintf(w, "  unparked p50 %v p99 %v, server CPU %v per delivery\n", r.UnparkedP50, r.UnparkedP99, r.UnparkedCPU)
	fmt.Fprintf(w, "  added by parking: p50 %v, p99 %v, CPU %v | goal p99 added < %v: %s\n", r.AddedP50, r.AddedP99, r.AddedCPU, GoalAddedP99, verdict)
	fmt.Fprintf(w, "the client's own wake: a text ping on the watch socket to its pong, %d per server:\n", r.Options.Deliveries)
	fmt.Fprintf(w, "  parked   p50 %v p99 %v, server CPU %v per ping\n", r.ParkedPingP50, r.ParkedPingP99, r.ParkedPingCPU)
	fmt.Fprintf(w, "  unparked p50 %v p99 %v, server CPU %v per ping\n", r.UnparkedPingP50, r.UnparkedPingP99, r.UnparkedPingCPU)
	fmt.Fprintf(w, "  added by parking: p99 %v, CPU %v (no goal set)\n", r.AddedPingP99, r.AddedPingCPU)
	fmt.Fprintf(w, "the WebSocket's keepalive: an empty ping frame to its pong frame, %d per server:\n", r.Options.Deliveries)
	fmt.Fprintf(w, "  parked   p50 %v p99 %v, server CPU %v per keepalive\n", r.ParkedKeepaliveP50, r.ParkedKeepaliveP99, r.ParkedKeepaliveCPU)
	fmt.Fprintf(w, "  unparked p50 %v p99 %v, server CPU %v per keepalive\n", r.UnparkedKeepaliveP50, r.UnparkedKeepaliveP99, r.UnparkedKeepaliveCPU)
	fmt.Fprintf(w, "  added by parking: p99 %v, CPU %v (no goal set)\n", r.AddedKeepaliveP99, r.AddedKeepaliveCPU)
}

// WriteText writes the storm figures and whether each round kept the
// contract.
func (r StormReport) WriteText(w io.Writer) {
	l := r.Options.Limits
	fmt.Fprintf(w, "reconnect storm: %d watch sockets reset at once and reconnecting (limits: %d connections, %d per IP, %.0f accepted/s, burst %d):\n",
		r.Options.Sockets, l.MaxConns, l.MaxConnsPerIP, l.AcceptRate, l.AcceptBurst)
	for side, rs := range [2][]StormRound{r.Parked, r.Unparked} {
		for _, s := range rs {
			verdict := "no refusal beyond the accept rate"
			if err := r.Options.Check(s); err != nil {
				verdict = "NOT met: " + err.Error()
			}
			fmt.Fprintf(w, "  %-8s all %d back in %v (the rate's floor %v), %d attempts, %d refused by the rate | %s\n",
				Sides[side], s.Sockets, s.Reconnect.Round(time.Millisecond), s.Floor.Round(time.Millisecond), s.Attempts, s.Refused.Rate, verdict)
		}
	}
}
