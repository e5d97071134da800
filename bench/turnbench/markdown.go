package turnbench

import (
	"fmt"
	"strings"
)

// Markdown renders the report as a section for bench/results.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## TURN relay: edgerelay vs coturn, %s\n\n", r.Options.loadTitle())
	fmt.Fprintf(&b, "%s; %s; %s. ", r.Machine, r.Go, firstLine(r.Coturn))
	if r.Pinned {
		fmt.Fprintf(&b, "Servers pinned to core %d, load generator to core %d (taskset). ", r.Options.ServerCPU, r.Options.LoadCPU)
	}
	fmt.Fprintf(&b, "%s ", r.Options.loadDescription())
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
	for _, p := range r.Results {
		if p.Ours.TLSSuite != "" || p.Coturn.TLSSuite != "" {
			fmt.Fprintf(&b, "\nTLS cipher suite negotiated: ours %s, coturn %s.\n", p.Ours.TLSSuite, p.Coturn.TLSSuite)
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
	case o.GSO > 1:
		return fmt.Sprintf("Each client sends its window as GSO runs: %d datagrams of the same size per sendmsg with a UDP_SEGMENT "+
			"control message, a run sent once %d of its window's slots are free. On loopback a run stays one buffer up to the "+
			"receiving socket: ours, with UDP_GRO on its listener, reads it coalesced; coturn, without, reads the datagrams "+
			"one by one. The echo peers send back one datagram at a time.", o.GSO, o.GSO)
	case o.Transport == TCP:
		return "Each allocation is a TCP connection of its own (RFC 8656 §12.5), UDP relay; ChannelData frames padded to 4 bytes, " +
			"one write per frame as window slots free up."
	case o.Transport == TLS:
		return "Each allocation is a TLS connection of its own (turns:, a self-signed P-256 certificate served by both), UDP relay; " +
			"ChannelData frames padded to 4 bytes, one write (one record) per frame as window slots free up."
	}
	return "Each client sends one datagram per send."
}
