package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
)

// pushgwClusterBench is the push gateway in cluster mode beside single
// node (bench/pushgwbench): it runs its rounds itself, single and cluster
// alternating, so it runs with -count=1.
const pushgwClusterBench = "^BenchmarkSendCluster$"

// repeatSuffix is what go test appends to the name of a sub-benchmark run
// again in the same parent ("#01", "#02", ...): one per round.
var repeatSuffix = regexp.MustCompile(`#\d+$`)

// pushgwClusterRows are the push gateway's cluster figures, from
// BenchmarkSendCluster: per number of senders, sends per CPU-second of the
// whole process in cluster mode (ours) beside single node (the baseline),
// the median of the per-round ratios with its spread, and the wall rate
// and allocations per send of each. No goal: the issue asks for the figure
// measured.
func pushgwClusterRows(bench benchResults) []row {
	const goal = "— (measured; no goal set for push in cluster mode. The three nodes and their NATS servers share this machine's cores " +
		"with the client and the fake APNs, which understates a cluster of separate machines: CLUSTER.md §8.1)"
	type side struct{ perCore, perSec, allocs []float64 }
	cases := map[string]*[2]side{} // "senders=N" → single, cluster
	var order []string
	for _, name := range bench.names(pkgPushgw) {
		rest, ok := strings.CutPrefix(repeatSuffix.ReplaceAllString(name, ""), "BenchmarkSendCluster/senders=")
		senders, which, _ := strings.Cut(rest, "/")
		i := slices.Index([]string{"single", "cluster"}, which)
		if !ok || i < 0 {
			continue
		}
		c := cases[senders]
		if c == nil {
			c = &[2]side{}
			cases[senders] = c
			order = append(order, senders)
		}
		c[i].perCore = append(c[i].perCore, bench.values(pkgPushgw, name, "sends/cpu-s")...)
		c[i].perSec = append(c[i].perSec, bench.values(pkgPushgw, name, "sends/s")...)
		c[i].allocs = append(c[i].allocs, bench.values(pkgPushgw, name, "allocs/op")...)
	}
	cell := func(s side) string {
		return fmt.Sprintf("%s (%s/s; %.0f allocs)", benchfmt.Rate(abtest.Median(s.perCore), s.perCore), thousands(abtest.Median(s.perSec)), abtest.Median(s.allocs))
	}
	var rows []row
	for _, senders := range order {
		c := cases[senders]
		single, cluster := c[0], c[1]
		ratios := abtest.RoundRatios(cluster.perCore, single.perCore)
		rows = append(rows, row{
			Figure: fmt.Sprintf("push gateway POST /send → fake APNs over HTTP/2 in cluster mode vs single node, daily budget on, %s concurrent sender%s, each with its own API key: "+
				"sends per CPU-second of the whole process (client, gateways, provider clients, fake APNs; in cluster mode also the three nats-servers); "+
				"cluster: three nodes' mounts, each on its own pushkv store of a 3-node embedded NATS cluster (R3) on this machine, requests round robin over them; "+
				"single node: one mount on Pebble; median of %d rounds alternated (sends/s; allocs per send, whole process)", senders, plural(senders), len(ratios)),
			Ours:     cell(cluster),
			Baseline: cell(single),
			Ratio:    smallRatio(abtest.Median(ratios), ratios, abtest.Median(cluster.perCore)/abtest.Median(single.perCore)),
			Goal:     goal,
		})
	}
	if len(rows) == 0 {
		rows = append(rows, row{Figure: "push gateway POST /send in cluster mode vs single node: sends per CPU-second", Ours: "missing",
			Baseline: "missing", Ratio: "—", Goal: "— (measured) — no result (see the raw output)"})
	}
	return rows
}

func plural(n string) string {
	if n == "1" {
		return ""
	}
	return "s"
}

// smallRatio is benchfmt.RoundRatio with three significant digits: the
// cluster's ratio is a few hundredths, where two decimals would round a
// third of it away.
func smallRatio(median float64, rounds []float64, ofMedians float64) string {
	spread := ""
	if len(rounds) >= 2 {
		spread = fmt.Sprintf(" [%.3g–%.3g×]", slices.Min(rounds), slices.Max(rounds))
	}
	if math.IsNaN(median) || math.IsInf(median, 0) || len(rounds) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.3g×%s (ratio of the medians %.3g×)", median, spread, ofMedians)
}
