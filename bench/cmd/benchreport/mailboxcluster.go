package main

import (
	"fmt"
	"strings"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
)

// The mailbox's cluster backend (store/cluster/mailboxjs) on a 3-node
// embedded cluster, beside raw JetStream (bench/clusterbench). The bench
// alternates its cases round by round itself, so it runs with -count=1;
// the report picks its cases and rounds with the -bench pattern.
const (
	mailboxClusterPackage = "./bench/clusterbench/"
	pkgMailboxCluster     = "edgerelay/bench/clusterbench"
	// mailboxClusterRounds are the rounds of a full run (QUICK: one).
	mailboxClusterRounds = 3
	// mailboxClusterGoal is issue 15's floor: PUT keeps at least this
	// share of raw JetStream's publish rate.
	mailboxClusterGoal = 0.80
)

// mailboxClusterPattern selects PUT and raw publishes with 1 and 64
// writers and the watch latency with its raw RePublish floor, for the
// first rounds rounds: go test names a case's repeats "#01", "#02", …
// The batch model and the reads stay for the manual command
// (bench/clusterbench's doc), as they would double the run's time.
func mailboxClusterPattern(quick bool) string {
	rounds := mailboxClusterRounds
	if quick {
		rounds = 1
	}
	repeats := ""
	if rounds > 1 {
		repeats = fmt.Sprintf("(#0[1-%d])?", rounds-1)
	}
	return `^BenchmarkCluster$/^(raw|put|pebble|watch)$/^(writers=(1|64)|ours|raw|pebble)` + repeats + `$`
}

// clusterCase is one case's figures, one value per round in the order
// the rounds ran.
type clusterCase struct{ rate, p50, p99, allocs []float64 }

// mailboxClusterCases reads BenchmarkCluster's results by case name
// without the round suffix ("put/writers=1", "watch/raw").
func mailboxClusterCases(bench benchResults) map[string]*clusterCase {
	cases := map[string]*clusterCase{}
	for _, name := range bench.names(pkgMailboxCluster) {
		c, ok := strings.CutPrefix(repeatSuffix.ReplaceAllString(name, ""), "BenchmarkCluster/")
		if !ok {
			continue
		}
		cc := cases[c]
		if cc == nil {
			cc = &clusterCase{}
			cases[c] = cc
		}
		cc.rate = append(cc.rate, bench.values(pkgMailboxCluster, name, "ops/s")...)
		cc.p50 = append(cc.p50, bench.values(pkgMailboxCluster, name, "p50-ms")...)
		cc.p99 = append(cc.p99, bench.values(pkgMailboxCluster, name, "p99-ms")...)
		cc.allocs = append(cc.allocs, bench.values(pkgMailboxCluster, name, "allocs/op")...)
	}
	return cases
}

// mailboxClusterRows are the mailbox's cluster figures: per number of
// writers, mailboxjs Put's rate beside raw JetStream publishes of the same
// bytes to the same streams (the floor, judged against issue 15's 80%),
// and the watch delivery latency beside raw JetStream's RePublish.
func mailboxClusterRows(bench benchResults) []row {
	const setting = "3-node embedded NATS cluster on loopback in this process (R3, sync always, 12 shard streams), 256 B envelopes; " +
		"through store.Mailboxes, what the mailbox handler calls (store/cluster/mailboxjs), without the HTTP layer"
	cases := mailboxClusterCases(bench)
	var rows []row
	for _, writers := range []string{"1", "64"} {
		put, raw := cases["put/writers="+writers], cases["raw/writers="+writers]
		figure := fmt.Sprintf("mailbox PUT in cluster mode, %s concurrent writer%s, each on its own direction, spread over the three nodes (%s): "+
			"writes per wall second, mailboxjs Put vs a raw JetStream publish of the same bytes to the same shard stream, waiting for its ack", writers, plural(writers), setting)
		if put == nil || raw == nil || len(put.rate) == 0 || len(raw.rate) == 0 {
			rows = append(rows, row{Figure: figure, Ours: "missing", Baseline: "missing", Ratio: "—",
				Goal: fmt.Sprintf("≥ %.0f%% of raw JetStream — no result (see the raw output)", 100*mailboxClusterGoal)})
			continue
		}
		ratios := abtest.RoundRatios(put.rate, raw.rate)
		median := abtest.Median(ratios)
		rows = append(rows, row{
			Figure:   fmt.Sprintf("%s; median of %d round%s alternated (p50 / p99 per write; allocs per write, whole process)", figure, len(ratios), plural(fmt.Sprint(len(ratios)))),
			Ours:     clusterRateCell(put),
			Baseline: clusterRateCell(raw),
			Ratio: fmt.Sprintf("%.0f%% = %s", 100*median,
				benchfmt.RoundRatio(median, ratios, abtest.Median(put.rate)/abtest.Median(raw.rate))),
			Goal: verdict(fmt.Sprintf("≥ %.0f%% of raw JetStream", 100*mailboxClusterGoal), median >= mailboxClusterGoal),
		})
		if pebble := cases["pebble/writers="+writers]; pebble != nil && len(pebble.rate) > 0 {
			ratios := abtest.RoundRatios(put.rate, pebble.rate)
			rows = append(rows, row{
				Figure: fmt.Sprintf("mailbox PUT, cluster vs single node, %s concurrent writer%s: the cluster's Put (as above) vs the single node's (store/mailboxlocal over synced Pebble, in the same process, same bytes, through store.Mailboxes); median of %d round%s alternated",
					writers, plural(writers), len(ratios), plural(fmt.Sprint(len(ratios)))),
				Ours:     clusterRateCell(put),
				Baseline: clusterRateCell(pebble),
				Ratio:    benchfmt.RoundRatio(abtest.Median(ratios), ratios, abtest.Median(put.rate)/abtest.Median(pebble.rate)),
				Goal:     "— (measured: a quorum's fsync over the network against one local group commit; a cluster adds nodes for availability and connections, not PUT rate)",
			})
		}
	}
	ours, raw := cases["watch/ours"], cases["watch/raw"]
	figure := "mailbox watch delivery latency in cluster mode, a Put through node 0 to Deliver on node 2's Watch, one write at a time (" + setting +
		"): p50 / p99 from the start of the write; baseline: a raw publish through node 0 to a plain subscription on node 2 to the stream's RePublish"
	if ours == nil || raw == nil || len(ours.p50) == 0 || len(raw.p50) == 0 {
		return append(rows, row{Figure: figure, Ours: "missing", Baseline: "missing", Ratio: "—",
			Goal: "— (measured) — no result (see the raw output)"})
	}
	// Times: the ratio is baseline ÷ ours (below 1: ours is slower).
	ratios := abtest.RoundRatios(raw.p50, ours.p50)
	if pebble := cases["watch/pebble"]; pebble != nil && len(pebble.p50) > 0 {
		pr := abtest.RoundRatios(pebble.p50, ours.p50)
		rows = append(rows, row{
			Figure: fmt.Sprintf("mailbox watch delivery latency, cluster (node 0 to node 2, as below) vs single node (store/mailboxlocal, a Put to its own Watch in the same process); median of %d round%s alternated; ratio of the p50s",
				len(pr), plural(fmt.Sprint(len(pr)))),
			Ours:     clusterLatencyCell(ours),
			Baseline: clusterLatencyCell(pebble),
			Ratio:    benchfmt.RoundRatio(abtest.Median(pr), pr, abtest.Median(pebble.p50)/abtest.Median(ours.p50)),
			Goal:     "— (measured)",
		})
	}
	return append(rows, row{
		Figure:   fmt.Sprintf("%s; median of %d round%s alternated (allocs per delivery, whole process); ratio of the p50s", figure, len(ratios), plural(fmt.Sprint(len(ratios)))),
		Ours:     clusterLatencyCell(ours),
		Baseline: clusterLatencyCell(raw),
		Ratio:    benchfmt.RoundRatio(abtest.Median(ratios), ratios, abtest.Median(raw.p50)/abtest.Median(ours.p50)),
		Goal:     "— (measured; no goal set for watch latency in cluster mode. The three nodes share this machine's cores with the writers: CLUSTER.md §8.1)",
	})
}

// clusterRateCell: "1,055 [731–1,184]/s (p50 0.78 ms, p99 4.0 ms; 223 allocs)".
func clusterRateCell(c *clusterCase) string {
	return fmt.Sprintf("%s/s (p50 %s, p99 %s; %.0f allocs)", benchfmt.Rate(abtest.Median(c.rate), c.rate),
		ms(abtest.Median(c.p50)), ms(abtest.Median(c.p99)), abtest.Median(c.allocs))
}

// clusterLatencyCell: "p50 0.78 ms [0.72–0.80], p99 5.7 ms [2.3–6.0] (244 allocs)".
func clusterLatencyCell(c *clusterCase) string {
	return fmt.Sprintf("p50 %s%s, p99 %s%s (%.0f allocs)", ms(abtest.Median(c.p50)), benchfmt.Spread(c.p50, msBare),
		ms(abtest.Median(c.p99)), benchfmt.Spread(c.p99, msBare), abtest.Median(c.allocs))
}

// ms is a latency in milliseconds to two significant digits at least.
func ms(v float64) string { return msBare(v) + " ms" }

func msBare(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
