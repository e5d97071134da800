package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// mailboxClusterOutput is three rounds of the report's cases, a batch
// model and a read row (which the manual command runs) among them.
const mailboxClusterOutput = `pkg: edgerelay/bench/clusterbench
BenchmarkCluster/raw/writers=1-2         	     777	    820682 ns/op	      1000 ops/s	         0.7000 p50-ms	         2.000 p99-ms	   18357 B/op	     190 allocs/op
BenchmarkCluster/put/writers=1-2         	     444	    981148 ns/op	       900 ops/s	         0.8000 p50-ms	         3.000 p99-ms	   32640 B/op	     220 allocs/op
BenchmarkCluster/pebble/writers=1-2      	    2707	    209471 ns/op	      4000 ops/s	         0.2000 p50-ms	         1.000 p99-ms	     683 B/op	       5 allocs/op
BenchmarkCluster/batch-model/writers=1-2 	     444	    981148 ns/op	       100 ops/s	         9.0000 p50-ms	         9.000 p99-ms	   32640 B/op	     999 allocs/op
BenchmarkCluster/raw/writers=64-2        	    1518	    320381 ns/op	      3000 ops/s	        17.00 p50-ms	        47.00 p99-ms	   11938 B/op	     130 allocs/op
BenchmarkCluster/put/writers=64-2        	    1894	    264639 ns/op	      2400 ops/s	        14.00 p50-ms	        33.00 p99-ms	   28530 B/op	     160 allocs/op
BenchmarkCluster/pebble/writers=64-2     	   51111	     12474 ns/op	     80000 ops/s	         0.6000 p50-ms	         4.000 p99-ms	     572 B/op	       5 allocs/op
BenchmarkCluster/watch/ours-2            	     621	    808888 ns/op	         0.8000 p50-ms	         2.000 p99-ms	   41251 B/op	     240 allocs/op
BenchmarkCluster/watch/raw-2             	     727	    687132 ns/op	         0.6000 p50-ms	         1.000 p99-ms	   19623 B/op	     200 allocs/op
BenchmarkCluster/watch/pebble-2          	    3157	    167835 ns/op	         0.1500 p50-ms	         0.7000 p99-ms	     639 B/op	       4 allocs/op
BenchmarkCluster/raw/writers=1#01-2      	     757	    859359 ns/op	      1000 ops/s	         0.7000 p50-ms	         2.000 p99-ms	   14209 B/op	     190 allocs/op
BenchmarkCluster/put/writers=1#01-2      	     531	    809490 ns/op	       800 ops/s	         0.8000 p50-ms	         1.000 p99-ms	   24992 B/op	     224 allocs/op
BenchmarkCluster/pebble/writers=1#01-2   	    2707	    209471 ns/op	      5000 ops/s	         0.2000 p50-ms	         1.000 p99-ms	     683 B/op	       5 allocs/op
BenchmarkCluster/raw/writers=64#01-2     	    1644	    304678 ns/op	      3000 ops/s	        16.00 p50-ms	        42.00 p99-ms	   15817 B/op	     130 allocs/op
BenchmarkCluster/put/writers=64#01-2     	    1284	    385154 ns/op	      2370 ops/s	        19.00 p50-ms	        51.00 p99-ms	   37375 B/op	     160 allocs/op
BenchmarkCluster/pebble/writers=64#01-2  	   51111	     12474 ns/op	     60000 ops/s	         0.6000 p50-ms	         4.000 p99-ms	     572 B/op	       5 allocs/op
BenchmarkCluster/watch/ours#01-2         	     656	    800501 ns/op	         0.9000 p50-ms	         4.000 p99-ms	   20990 B/op	     240 allocs/op
BenchmarkCluster/watch/raw#01-2          	     616	    845245 ns/op	         0.6000 p50-ms	         2.000 p99-ms	   36289 B/op	     200 allocs/op
BenchmarkCluster/watch/pebble#01-2       	    3157	    167835 ns/op	         0.1800 p50-ms	         0.7000 p99-ms	     639 B/op	       4 allocs/op
BenchmarkCluster/raw/writers=1#02-2      	     680	    701674 ns/op	      2000 ops/s	         0.6000 p50-ms	         2.000 p99-ms	   32030 B/op	     190 allocs/op
BenchmarkCluster/put/writers=1#02-2      	     658	    820224 ns/op	      1800 ops/s	         0.7000 p50-ms	         1.000 p99-ms	   19209 B/op	     226 allocs/op
BenchmarkCluster/pebble/writers=1#02-2   	    2707	    209471 ns/op	      4500 ops/s	         0.2000 p50-ms	         1.000 p99-ms	     683 B/op	       5 allocs/op
BenchmarkCluster/raw/writers=64#02-2     	    1458	    309026 ns/op	      3000 ops/s	        16.00 p50-ms	        38.00 p99-ms	   29223 B/op	     130 allocs/op
BenchmarkCluster/put/writers=64#02-2     	    1342	    420833 ns/op	      2100 ops/s	        21.00 p50-ms	        56.00 p99-ms	   35693 B/op	     160 allocs/op
BenchmarkCluster/pebble/writers=64#02-2  	   51111	     12474 ns/op	     70000 ops/s	         0.6000 p50-ms	         4.000 p99-ms	     572 B/op	       5 allocs/op
BenchmarkCluster/watch/ours#02-2         	     490	   1030091 ns/op	         1.2000 p50-ms	         12.00 p99-ms	   47311 B/op	     250 allocs/op
BenchmarkCluster/watch/raw#02-2          	     562	    826572 ns/op	         0.6000 p50-ms	         2.000 p99-ms	   38083 B/op	     200 allocs/op
BenchmarkCluster/watch/pebble#02-2       	    3157	    167835 ns/op	         0.1200 p50-ms	         0.7000 p99-ms	     639 B/op	       4 allocs/op
BenchmarkCluster/get-by-seq-2            	     562	    826572 ns/op	         5.0000 p50-ms	         9.000 p99-ms	   38083 B/op	    1000 allocs/op
`

func TestMailboxClusterRows(t *testing.T) {
	rows := mailboxClusterRows(parseBench(strings.NewReader(mailboxClusterOutput)))
	if len(rows) != 6 {
		t.Fatalf("%d rows, want PUT with 1 and 64 writers against raw and against Pebble, and the watch against Pebble and raw: %+v", len(rows), rows)
	}
	out := render(runInfo{date: time.Unix(0, 0)}, rows, "")
	contains(t, out,
		"mailbox PUT in cluster mode, 1 concurrent writer, each on its own direction",
		"mailbox PUT in cluster mode, 64 concurrent writers, each on its own direction",
		"through store.Mailboxes, what the mailbox handler calls",
		"mailbox PUT, cluster vs single node, 1 concurrent writer",
		"mailbox PUT, cluster vs single node, 64 concurrent writers",
		"mailbox watch delivery latency, cluster (node 0 to node 2, as below) vs single node",
		// Cluster vs Pebble, 1 writer: 900/4000, 800/5000, 1800/4500 are
		// 0.225, 0.16, 0.40; the medians 900 and 4,500.
		"| 0.23× [0.16–0.40×] (ratio of the medians 0.20×) | — (measured: a quorum's fsync",
		// 64: 2400/80000, 2370/60000, 2100/70000: 0.030, 0.040, 0.030.
		"| 0.03× [0.03–0.04×] (ratio of the medians 0.03×) |",
		"median of 3 rounds alternated",
		// Rounds pair up in the order they ran: 900/1000, 800/1000,
		// 1800/2000 (0.90, 0.80, 0.90); the medians 900 and 1,000.
		"| 900 [800–1,800]/s (p50 0.80 ms, p99 1.00 ms; 224 allocs) | 1,000 [1,000–2,000]/s (p50 0.70 ms, p99 2.00 ms; 190 allocs) "+
			"| 90% = 0.90× [0.80–0.90×] (ratio of the medians 0.90×) | ≥ 80% of raw JetStream — met |",
		// 2400/3000, 2370/3000, 2100/3000: 0.80, 0.79, 0.70. The median
		// 0.79 is one step under the goal.
		"| 2,370 [2,100–2,400]/s (p50 19.0 ms, p99 51.0 ms; 160 allocs) | 3,000 [3,000–3,000]/s (p50 16.0 ms, p99 42.0 ms; 130 allocs) "+
			"| 79% = 0.79× [0.70–0.80×] (ratio of the medians 0.79×) | ≥ 80% of raw JetStream — **not met** |",
		// Watch: raw ÷ ours of the p50s, 0.6/0.8, 0.6/0.9, 0.6/1.2.
		"mailbox watch delivery latency in cluster mode, a Put through node 0 to Deliver on node 2's Watch",
		"| p50 0.90 ms [0.80–1.20], p99 4.00 ms [2.00–12.0] (240 allocs) | p50 0.60 ms [0.60–0.60], p99 2.00 ms [1.00–2.00] (200 allocs) "+
			"| 0.67× [0.50–0.75×] (ratio of the medians 0.67×) | — (measured; no goal set",
	)
	if strings.Contains(out, "999 allocs") || strings.Contains(out, "1000 allocs") {
		t.Errorf("the batch model or a read leaked into the rows:\n%s", out)
	}

	// At the goal exactly is met.
	atGoal := "pkg: edgerelay/bench/clusterbench\n" +
		"BenchmarkCluster/raw/writers=1-2  10  1 ns/op  1000 ops/s\n" +
		"BenchmarkCluster/put/writers=1-2  10  1 ns/op  800 ops/s\n"
	out = render(runInfo{date: time.Unix(0, 0)}, mailboxClusterRows(parseBench(strings.NewReader(atGoal))), "")
	contains(t, out, "median of 1 round alternated", "| 80% = 0.80× (ratio of the medians 0.80×) | ≥ 80% of raw JetStream — met |",
		// 64 writers and the watch did not run.
		"64 concurrent writers, each on its own direction, spread over the three nodes",
		"waiting for its ack | missing | missing | — | ≥ 80% of raw JetStream — no result (see the raw output) |",
		"| missing | missing | — | — (measured) — no result (see the raw output) |",
	)
	if n := strings.Count(out, "| missing | missing |"); n != 2 {
		t.Errorf("%d missing rows, want 64 writers' and the watch's:\n%s", n, out)
	}
}

// The report's -bench pattern runs the first rounds of PUT, raw and watch
// and nothing else, matched level by level as go test matches it (the
// pattern's slashes are all outside parentheses, so splitting on them is
// go test's split).
func TestMailboxClusterPattern(t *testing.T) {
	selected := func(pattern, name string) bool {
		levels, elems := strings.Split(pattern, "/"), strings.Split(name, "/")
		if len(elems) != len(levels) {
			return false // a partial match would run the case with b.N = 1 only
		}
		for i, l := range levels {
			if !regexp.MustCompile(l).MatchString(elems[i]) {
				return false
			}
		}
		return true
	}
	run := []string{"raw/writers=1", "put/writers=1", "raw/writers=64", "put/writers=64", "watch/ours", "watch/raw"}
	skipped := []string{"batch-model/writers=1", "batch-model/writers=64", "get-by-seq", "fetch-100", "put/writers=16"}
	for _, quick := range []bool{false, true} {
		pattern := mailboxClusterPattern(quick)
		rounds := mailboxClusterRounds
		if quick {
			rounds = 1
		}
		for _, c := range run {
			for r, suffix := range []string{"", "#01", "#02", "#03", "#04"} {
				name := "BenchmarkCluster/" + c + suffix
				if got, want := selected(pattern, name), r < rounds; got != want {
					t.Errorf("quick=%v: %s selected %v, want %v (pattern %s)", quick, name, got, want, pattern)
				}
			}
		}
		for _, c := range skipped {
			if name := "BenchmarkCluster/" + c; selected(pattern, name) {
				t.Errorf("quick=%v: %s selected (pattern %s)", quick, name, pattern)
			}
		}
	}
	s, err := parseSettings(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	want := "-bench='" + mailboxClusterPattern(false) + "' -count=1 -benchtime=400ms on ./bench/clusterbench/"
	var got []string
	for _, b := range benchRuns(s) {
		got = append(got, b.String())
	}
	if !strings.Contains(strings.Join(got, "\n"), want) {
		t.Errorf("bench runs lack %q:\n%s", want, strings.Join(got, "\n"))
	}
	if s, err = parseSettings([]string{"-mailbox-cluster-benchtime=1s"}, true); err != nil || s.mailboxClusterBenchtime != "1s" {
		t.Errorf("-mailbox-cluster-benchtime=1s: %q, %v", s.mailboxClusterBenchtime, err)
	}
}
