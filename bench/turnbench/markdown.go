package turnbench

import (
	"fmt"
	"strings"
)

// Markdown renders the report as a section for bench/results.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## TURN relay: edgerelay vs coturn\n\n")
	fmt.Fprintf(&b, "%s; %s; %s. ", r.Machine, r.Go, firstLine(r.Coturn))
	if r.Pinned {
		fmt.Fprintf(&b, "Servers pinned to core %d, load generator to core %d (taskset). ", r.Options.ServerCPU, r.Options.LoadCPU)
	}
	fmt.Fprintf(&b, "%d allocations × %d datagrams in flight, raw ChannelData to UDP echo peers on loopback; "+
		"%d rounds per payload in ABBA order, the first a warm-up, %v counted per run; medians. "+
		"Packets are datagrams relayed in either direction; per core-second is per second of the server process's CPU time.\n\n",
		r.Options.Allocations, r.Options.Window, r.Options.Rounds, r.Options.Duration)
	fmt.Fprintf(&b, "| payload | ours pkt/core-s | coturn pkt/core-s | ratio | per-round ratio | ours pkt/s | coturn pkt/s | ours core use | coturn core use | ours allocs/pkt | loss ours / coturn | kernel drops ours / coturn |\n")
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Results {
		fmt.Fprintf(&b, "| %d B | %.0f | %.0f | **%.2f×** | %.2f× | %.0f | %.0f | %.0f%% | %.0f%% | %.4f | %.4f%% / %.4f%% | %d / %d |\n",
			p.Payload, p.Ours.PerCoreSec, p.Coturn.PerCoreSec, p.Ratio, p.RoundRatio,
			p.Ours.PerSec, p.Coturn.PerSec, 100*p.Ours.CoreUse, 100*p.Coturn.CoreUse,
			p.Ours.AllocsPerPacket, 100*p.Ours.LossRate, 100*p.Coturn.LossRate, p.Ours.Drops, p.Coturn.Drops)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "\nWarning: %s\n", w)
	}
	if r.Profile != "" {
		fmt.Fprintf(&b, "\nTop of our server's CPU profile (%d B payload):\n\n```\n%s```\n", r.Options.Payloads[0], r.Profile)
	}
	fmt.Fprintf(&b, "\nComparison took %v.\n", r.Elapsed.Round(1e9))
	return b.String()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if s == "" {
		return "coturn (version unknown)"
	}
	return s
}
