package main

import (
	"strings"
	"testing"
	"time"
)

const pushgwClusterOutput = `pkg: edgerelay/bench/pushgwbench
BenchmarkSendCluster/senders=1/single-2         	    1077	    106290 ns/op	      9000 sends/cpu-s	      9400 sends/s	   14457 B/op	     148 allocs/op
BenchmarkSendCluster/senders=1/cluster-2        	      26	   4980743 ns/op	       270 sends/cpu-s	       200 sends/s	  134272 B/op	    1493 allocs/op
BenchmarkSendCluster/senders=16/single-2        	    1465	     69591 ns/op	     10000 sends/cpu-s	     14000 sends/s	   14855 B/op	     148 allocs/op
BenchmarkSendCluster/senders=16/cluster-2       	      61	   1692188 ns/op	       600 sends/cpu-s	       590 sends/s	  120060 B/op	    1267 allocs/op
BenchmarkSendCluster/senders=1/cluster#01-2     	      31	   3806449 ns/op	       300 sends/cpu-s	       262 sends/s	  233591 B/op	    1504 allocs/op
BenchmarkSendCluster/senders=1/single#01-2      	    1077	    114034 ns/op	     10000 sends/cpu-s	      8764 sends/s	   13682 B/op	     148 allocs/op
BenchmarkSendCluster/senders=16/cluster#01-2    	      80	   2006491 ns/op	       500 sends/cpu-s	       497 sends/s	  119833 B/op	    1268 allocs/op
BenchmarkSendCluster/senders=16/single#01-2     	    1590	     68878 ns/op	     10000 sends/cpu-s	     14495 sends/s	   14687 B/op	     148 allocs/op
BenchmarkSendCluster/senders=1/single#02-2      	    1093	    113809 ns/op	      8000 sends/cpu-s	      8779 sends/s	   15763 B/op	     148 allocs/op
BenchmarkSendCluster/senders=1/cluster#02-2     	      24	   4333273 ns/op	       320 sends/cpu-s	       230 sends/s	  145368 B/op	    1521 allocs/op
BenchmarkSendCluster/senders=16/single#02-2     	    1815	     90042 ns/op	      8000 sends/cpu-s	     11095 sends/s	   15343 B/op	     148 allocs/op
BenchmarkSendCluster/senders=16/cluster#02-2    	      66	   3458081 ns/op	       480 sends/cpu-s	       288 sends/s	  122213 B/op	    1300 allocs/op
BenchmarkSendAPNs/metered-2                     	   71626	     55000 ns/op	     13000 pushes/cpu-s	     21000 pushes/s	   14000 B/op	     148 allocs/op
`

func TestPushgwClusterRows(t *testing.T) {
	bench := parseBench(strings.NewReader(pushgwClusterOutput))
	rows := pushgwClusterRows(bench)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want one per senders count: %+v", len(rows), rows)
	}
	out := render(runInfo{date: time.Unix(0, 0)}, rows, "")
	contains(t, out,
		"in cluster mode vs single node, daily budget on, 1 concurrent sender, each with its own API key",
		"16 concurrent senders, each with its own API key",
		"median of 3 rounds alternated",
		// Rounds pair up in the order they ran: 270/9000, 300/10000,
		// 320/8000 (0.03, 0.03, 0.04); the medians 300 and 9,000.
		"| 300 [270–320] (230/s; 1504 allocs) | 9,000 [8,000–10,000] (8,779/s; 148 allocs) | 0.03× [0.03–0.04×] (ratio of the medians 0.0333×) | — (measured; no goal set",
		// 600/10000, 500/10000, 480/8000: 0.06, 0.05, 0.06.
		"| 500 [480–600] (497/s; 1268 allocs) | 10,000 [8,000–10,000] (14,000/s; 148 allocs) | 0.06× [0.05–0.06×] (ratio of the medians 0.05×)",
	)
	if strings.Contains(out, "pushes/cpu-s") || strings.Contains(out, "13,000") {
		t.Errorf("BenchmarkSendAPNs leaked into the cluster rows:\n%s", out)
	}
	if got := smallRatio(0, nil, 0); got != "—" {
		t.Errorf("no rounds: ratio %q, want —", got)
	}
	out = render(runInfo{date: time.Unix(0, 0)}, pushgwClusterRows(benchResults{}), "")
	contains(t, out, "| push gateway POST /send in cluster mode vs single node: sends per CPU-second | missing | missing | — | — (measured) — no result (see the raw output) |")
	// And BenchmarkSendAPNs's rows ignore the cluster benchmark.
	if got := pushgwRows(bench); len(got) != 1 {
		t.Errorf("pushgwRows: %d rows, want the metered one only: %+v", len(got), got)
	}
}
