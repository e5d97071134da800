package turnbench

import (
	"fmt"
	"strings"

	"edgerelay/bench/benchfmt"
)

// Markdown renders the report as a section for bench/results.
func (r Report) Markdown() string {
	var b strings.Builder
	base, against := "coturn", "coturn"
	switch {
	case r.Options.BaselineNoGRO:
		base, against = "GRO off", "edgerelay with UDP_GRO off"
	case r.Options.BaselineTurnserve != "":
		base, against = "other", "edgerelay built as "+r.Options.BaselineTurnserve
	}
	fmt.Fprintf(&b, "## TURN relay: edgerelay vs %s, %s\n\n", against, r.Options.loadTitle())
	fmt.Fprintf(&b, "%s; %s", r.Machine, r.Go)
	if r.Options.againstCoturn() {
		fmt.Fprintf(&b, "; %s", firstLine(r.Coturn))
	}
	fmt.Fprintf(&b, ". ")
	if r.Pinned {
		fmt.Fprintf(&b, "Servers pinned to core %d, load generator to core %d (taskset). ", r.Options.ServerCPU, r.Options.LoadCPU)
	}
	fmt.Fprintf(&b, "%s ", r.Options.loadDescription())
	fmt.Fprintf(&b, "%d allocations × %d datagrams in flight, raw ChannelData to UDP echo peers on loopback; "+
		"%d rounds per payload in ABBA order, the first a warm-up, %v counted per run; medians. "+
		"Packets are datagrams relayed in either direction; per core-second is per second of the server process's CPU time.\n\n",
		r.Options.Allocations, r.Options.Window, r.Options.Rounds, r.Options.Duration)
	fmt.Fprintf(&b, "| payload | ours pkt/core-s | %[1]s pkt/core-s | ratio | per-round ratio [spread] | ours pkt/s | %[1]s pkt/s | ours core use | %[1]s core use | ours allocs/pkt | loss ours / %[1]s | kernel drops ours / %[1]s |\n", base)
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Results {
		fmt.Fprintf(&b, "| %d B | %.0f | %.0f | **%.2f×** | %s | %.0f | %.0f | %.0f%% | %.0f%% | %.4f | %.4f%% / %.4f%% | %d / %d |\n",
			p.Payload, p.Ours.PerCoreSec, p.Baseline.PerCoreSec, p.Ratio, benchfmt.Times(p.RoundRatio)+benchfmt.RatioSpread(p.RoundRatios),
			p.Ours.PerSec, p.Baseline.PerSec, 100*p.Ours.CoreUse, 100*p.Baseline.CoreUse,
			p.Ours.AllocsPerPacket, 100*p.Ours.LossRate, 100*p.Baseline.LossRate, p.Ours.Drops, p.Baseline.Drops)
	}
	for _, p := range r.Results {
		if p.Ours.TLSSuite != "" || p.Baseline.TLSSuite != "" {
			fmt.Fprintf(&b, "\nTLS cipher suite negotiated: ours %s, %s %s.\n", p.Ours.TLSSuite, base, p.Baseline.TLSSuite)
			break
		}
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

// loadTitle names the load in a heading.
func (o Options) loadTitle() string {
	switch {
	case o.GSO > 1 && o.PeerGSO:
		return fmt.Sprintf("UDP, GRO-coalesced input on both legs (GSO runs of %d from clients and peers)", o.GSO)
	case o.GSO > 1:
		return fmt.Sprintf("UDP, GRO-coalesced input (GSO runs of %d)", o.GSO)
	case o.Transport == TCP:
		return "TURN over TCP"
	case o.Transport == TLS:
		return "TURN over TLS (turns:)"
	}
	return "UDP, one datagram per send"
}

// loadDescription says how the load is made.
func (o Options) loadDescription() string {
	switch {
	case o.GSO > 1 && o.PeerGSO:
		return fmt.Sprintf("Each client sends its window as GSO runs of %d datagrams of the same size (one sendmsg with a UDP_SEGMENT "+
			"control message), and each echo peer sends what it got back in runs of %d too (held at most %v while a run fills), "+
			"whatever the shape the server sent it in. On loopback a run stays one buffer up to the receiving socket: ours, with "+
			"UDP_GRO on its listener and relay sockets, reads it coalesced on both legs; %s, without, reads the datagrams one by one.",
			o.GSO, o.GSO, runFlushAfter, o.baselineName())
	case o.GSO > 1:
		return fmt.Sprintf("Each client sends its window as GSO runs: %d datagrams of the same size per sendmsg with a UDP_SEGMENT "+
			"control message, a run sent once %d of its window's slots are free. On loopback a run stays one buffer up to the "+
			"receiving socket: ours, with UDP_GRO on its listener, reads it coalesced; %s, without, reads the datagrams "+
			"one by one. The echo peers send back one datagram at a time.", o.GSO, o.GSO, o.baselineName())
	case o.Transport == TCP:
		return "Each allocation is a TCP connection of its own (RFC 8656 §12.5), UDP relay; ChannelData frames padded to 4 bytes, " +
			"one write per frame as window slots free up."
	case o.Transport == TLS:
		return "Each allocation is a TLS connection of its own (turns:, a self-signed P-256 certificate served by both), UDP relay; " +
			"ChannelData frames padded to 4 bytes, one write (one record) per frame as window slots free up."
	}
	return "Each client sends one datagram per send."
}

// baselineName is the baseline in a sentence.
func (o Options) baselineName() string {
	switch {
	case o.BaselineNoGRO:
		return "ours with UDP_GRO off"
	case o.BaselineTurnserve != "":
		return "the other turnserve"
	}
	return "coturn"
}
