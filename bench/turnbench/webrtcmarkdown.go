package turnbench

import (
	"fmt"
	"strings"
)

// Goals of the real-traffic comparison (issue 17): at most 0.8× coturn's
// server CPU per MB, and no more kernel drops than coturn.
const (
	GoalWebRTCCPURatio = 0.8
)

// Markdown renders the WebRTC report as a section for bench/results.
func (r WebRTCReport) Markdown() string {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "## TURN relay, real WebRTC traffic: edgerelay vs coturn\n\n")
	fmt.Fprintf(&b, "%s; %s. Two headless Chromium pages, one relay-only data channel through the server under test (UDP), "+
		"%s MB one way in %d B messages per run; %d rounds in ABBA order, the first a warm-up; medians. ",
		firstLine(r.ChromiumVersion), firstLine(r.CoturnVersion), fmtMB(o.Bytes), o.Message, o.Rounds)
	switch {
	case r.Pinned && o.LoadCPU < 0:
		fmt.Fprintf(&b, "Servers pinned to core %d (taskset), the browser not pinned. ", o.ServerCPU)
	case r.Pinned:
		fmt.Fprintf(&b, "Servers pinned to core %d, the browser to core %d (taskset). ", o.ServerCPU, o.LoadCPU)
	}
	fmt.Fprintf(&b, "CPU per MB is the server process's CPU time over the transfer; drops are the kernel's on the server's UDP sockets (/proc/net/udp) over it, all counted rounds summed.\n\n")
	fmt.Fprintf(&b, "| server | MB/s | CPU ms per MB | drops | per round (MB/s, CPU ms/MB, drops) |\n|---|---:|---:|---:|---|\n")
	for _, s := range []WebRTCSide{r.Ours, r.Coturn} {
		var rounds []string
		for _, run := range s.Runs {
			rounds = append(rounds, fmt.Sprintf("%.1f, %.2f, %d", run.MBPerSec(), run.CPUPerMB(), run.Drops))
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.2f | %d | %s |\n", s.Name, s.MBPerSec, s.CPUPerMB, s.Drops, strings.Join(rounds, "; "))
	}
	fmt.Fprintf(&b, "\nCPU per MB, ours / coturn: **%.2f×** (median of the per-round ratios; ratio of the medians %.2f×); goal ≤ %.1f×: %s. "+
		"Drops ours %d, coturn %d; goal no more than coturn: %s.\n",
		r.CPURatio, r.CPURatioOfMedians, GoalWebRTCCPURatio, met(r.CPURatio <= GoalWebRTCCPURatio),
		r.Ours.Drops, r.Coturn.Drops, met(r.Ours.Drops <= r.Coturn.Drops))
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "\nWarning: %s\n", w)
	}
	fmt.Fprintf(&b, "\nComparison took %v.\n", r.Elapsed.Round(1e9))
	return b.String()
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func fmtMB(bytes int) string {
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", float64(bytes)/1e6), "0"), ".")
}
