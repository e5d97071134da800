package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// routeClusterOutput: three rounds of the signal router's cases and of
// its back-pressure (the frozen side not closed in the last), one round
// of the agent's, no channel router (its package failed).
const routeClusterOutput = `pkg: edgerelay/store/cluster/signalroute
BenchmarkSignalFrames/local/stream-2  	   20000	        24 ns/op	        20.00 cpu-ns/frame	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/local/one-by-one-2         	   20000	       464.8 ns/op	         0.08000 p50-µs	         0.2600 p99-µs	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-same-node/stream-2 	   20000	        22 ns/op	        30.00 cpu-ns/frame	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-same-node/one-by-one-2         	   20000	       364.8 ns/op	         0.08000 p50-µs	         0.09100 p99-µs	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-cross-node/stream-2            	   20000	     11058 ns/op	      6000 cpu-ns/frame	     827 B/op	       5 allocs/op
BenchmarkSignalFrames/cluster-cross-node/one-by-one-2        	   20000	     38264 ns/op	        30.00 p50-µs	        100.0 p99-µs	     968 B/op	      13 allocs/op
BenchmarkSignalFrames/raw-nats-cross-node/stream-2           	   20000	      3531 ns/op	      4000 cpu-ns/frame	     853 B/op	       5 allocs/op
BenchmarkSignalFrames/raw-nats-cross-node/one-by-one-2       	   20000	     39228 ns/op	        20.00 p50-µs	        80.00 p99-µs	     959 B/op	      13 allocs/op
BenchmarkSignalFrames/local#01/stream-2                      	   20000	        23.40 ns/op	        20.00 cpu-ns/frame	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/local#01/one-by-one-2                  	   20000	       143.9 ns/op	         0.07000 p50-µs	         0.09000 p99-µs	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-same-node#01/stream-2          	   20000	        13.69 ns/op	        20.00 cpu-ns/frame	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-same-node#01/one-by-one-2      	   20000	       140.4 ns/op	         0.07000 p50-µs	         0.09000 p99-µs	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-cross-node#01/stream-2         	   20000	      9016 ns/op	      8000 cpu-ns/frame	     832 B/op	       6 allocs/op
BenchmarkSignalFrames/cluster-cross-node#01/one-by-one-2     	   20000	     69270 ns/op	        40.00 p50-µs	       200.0 p99-µs	     978 B/op	      13 allocs/op
BenchmarkSignalFrames/raw-nats-cross-node#01/stream-2        	   20000	      7290 ns/op	      4000 cpu-ns/frame	     849 B/op	       5 allocs/op
BenchmarkSignalFrames/raw-nats-cross-node#01/one-by-one-2    	   20000	     53069 ns/op	        40.00 p50-µs	       100.0 p99-µs	     959 B/op	      13 allocs/op
BenchmarkSignalFrames/local#02/stream-2                      	   20000	        23.43 ns/op	        10.00 cpu-ns/frame	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/local#02/one-by-one-2                  	   20000	       133.7 ns/op	         0.06100 p50-µs	         0.07100 p99-µs	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-same-node#02/stream-2          	   20000	        23.04 ns/op	        10.00 cpu-ns/frame	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-same-node#02/one-by-one-2      	   20000	       134.5 ns/op	         0.06100 p50-µs	         0.07100 p99-µs	       0 B/op	       0 allocs/op
BenchmarkSignalFrames/cluster-cross-node#02/stream-2         	   20000	      6019 ns/op	      5000 cpu-ns/frame	     854 B/op	       5 allocs/op
BenchmarkSignalFrames/cluster-cross-node#02/one-by-one-2     	   20000	     57774 ns/op	        50.00 p50-µs	       150.0 p99-µs	     970 B/op	      13 allocs/op
BenchmarkSignalFrames/raw-nats-cross-node#02/stream-2        	   20000	      7039 ns/op	      5000 cpu-ns/frame	     808 B/op	       5 allocs/op
BenchmarkSignalFrames/raw-nats-cross-node#02/one-by-one-2    	   20000	     63594 ns/op	        25.00 p50-µs	       222.6 p99-µs	     963 B/op	      13 allocs/op
BenchmarkSignalFrozenSide/beside-reading-2         	   20000	    100099 ns/op	         1.000 achieved/offered	     40024 beside-msgs	         0 closed	      10000 msgs/s	    3600 B/op	      17 allocs/op
BenchmarkSignalFrozenSide/beside-frozen-2          	   20000	    100037 ns/op	         0.9000 achieved/offered	      1311 beside-msgs	        60.00 close-ms	         1.000 closed	      9000 msgs/s	    1123 B/op	       6 allocs/op
BenchmarkSignalFrozenSide/beside-reading#01-2      	   20000	    100716 ns/op	         0.9000 achieved/offered	     40051 beside-msgs	         0 closed	      9000 msgs/s	    3533 B/op	      17 allocs/op
BenchmarkSignalFrozenSide/beside-frozen#01-2       	   20000	    100044 ns/op	         0.8000 achieved/offered	      1312 beside-msgs	        70.00 close-ms	         1.000 closed	      8000 msgs/s	    1050 B/op	       6 allocs/op
BenchmarkSignalFrozenSide/beside-reading#02-2      	   20000	    100051 ns/op	         1.000 achieved/offered	     40001 beside-msgs	         0 closed	      10000 msgs/s	    3464 B/op	      17 allocs/op
BenchmarkSignalFrozenSide/beside-frozen#02-2       	   20000	    100113 ns/op	         0.1000 achieved/offered	      1311 beside-msgs	         0 closed	      1000 msgs/s	    1066 B/op	       6 allocs/op
PASS
ok  	edgerelay/store/cluster/signalroute	18.615s
pkg: edgerelay/store/cluster/agentroute
BenchmarkAgentHop/route/stream-2         	   20000	      6032 ns/op	      9000 cpu-ns/line	    1774 B/op	       5 allocs/op
BenchmarkAgentHop/route/one-by-one-2     	   20000	     67590 ns/op	        58.47 p50-µs	       152.3 p99-µs	    1915 B/op	      15 allocs/op
BenchmarkAgentHop/raw-nats/stream-2      	   20000	      4649 ns/op	      6000 cpu-ns/line	    1647 B/op	       5 allocs/op
BenchmarkAgentHop/raw-nats/one-by-one-2  	   20000	     54080 ns/op	        46.05 p50-µs	       123.5 p99-µs	    1869 B/op	      15 allocs/op
BenchmarkAgentFrozenClient/beside-reading-2        	   20000	    100054 ns/op	         0.9994 achieved/offered	     20008 beside-msgs	         0 closed	      9994 msgs/s	         3.500 max-lag-ms	    6284 B/op	      12 allocs/op
BenchmarkAgentFrozenClient/beside-frozen-2         	   20000	    100087 ns/op	         0.9996 achieved/offered	       258.0 beside-msgs	        26.87 close-ms	         1.000 closed	      9996 msgs/s	        12.25 max-lag-ms	    2778 B/op	       7 allocs/op
`

func TestRouteClusterRows(t *testing.T) {
	rows := routeClusterRows(parseBench(strings.NewReader(routeClusterOutput)))
	// Signal: CPU across, same node, latency, allocs, back-pressure;
	// channel: those four twice and back-pressure; agent: no same node.
	if len(rows) != 5+9+4 {
		t.Fatalf("%d rows, want 18: %+v", len(rows), rows)
	}
	out := render(runInfo{date: time.Unix(0, 0)}, rows, "")
	contains(t, out,
		"signal router across nodes: signal frames (200 B) from one side to the other, from one node to another (3-node embedded NATS cluster",
		"on a machine shared with other work",
		// 6000/4000, 8000/4000, 5000/5000: 1.5, 2, 1; the medians 6000 and 4000.
		"| 6.00 µs [5.00 µs–8.00 µs] CPU/frame | 4.00 µs [4.00 µs–5.00 µs] CPU/frame | 1.50× [1.00–2.00×] (ratio of the medians 1.50×) | ≤ 1.5× the floor's CPU per frame — met |",
		// Same node vs local: 30/20, 20/20, 10/10.
		"signal router, both ends on one node of the cluster vs the single node's router",
		"| 20.0 ns [10.0 ns–30.0 ns] CPU/frame | 20.0 ns [10.0 ns–20.0 ns] CPU/frame | 1.00× [1.00–1.50×] (ratio of the medians 1.00×) | — (measured) |",
		// p50s 30/20, 40/40, 50/25: 1.5, 1, 2; medians 40 and 25, p99 150 and 100.
		"| p50 40 µs [30–50], p99 150 µs [100–200] | p50 25 µs [20–40], p99 100 µs [80–223] | 1.50× [1.00–2.00×] (ratio of the medians 1.60×) | — (measured; added p50 +15.0 µs, p99 +50.0 µs) |",
		// Allocs 5-5, 6-5, 5-5.
		"| 5 [5–6] allocs/frame | 5 [5–5] allocs/frame | +0 [+0–+1] per frame | 0 of ours per frame — met |",
		// Back-pressure: the last round's frozen side was not closed, so
		// rounds 1 and 2 count: 0.9 and 0.8, median 0.85 (8,500/s of
		// 10,000 offered), under the goal; their reading rounds 1.0 and
		// 0.9: 0.9 and 0.89.
		"signal router back-pressure: a flow from one node to another paced at a fixed rate, while a second pair's receiving side on that node stops reading",
		"; offered 10,000/s; median of 2 rounds in which the frozen consumer was closed, of 3 |",
		"| 0.850 [0.800–0.900] of offered (8,500/s) frozen; closed at its bound 65.0 ms [60.0–70.0] after the freeze | 0.950 [0.900–1.000] of offered (9,500/s) reading | 0.89× [0.89–0.90×] (ratio of the medians 0.89×) frozen ÷ reading | the flow keeps its rate within 10% (≥ 0.90 of offered) with the consumer frozen — **not met** |",
		// The channel router's package gave nothing.
		"channel router across nodes: channel frames (1 KiB) from a phone to its computer, from one node to another",
		"| missing | missing | — | ≤ 1.5× the floor's CPU per frame — no result (see the raw output) |",
		"channel router back-pressure:",
		// Agent: one round, per line; 9000/6000 = 1.5, at the goal exactly.
		"agent router across nodes: agent lines (1 KiB) from a link to its client, from one node to another",
		"CPU per line vs raw core NATS publish/subscribe of the same bytes between the same nodes (the floor); median of 1 round alternated",
		"| 9.00 µs CPU/line | 6.00 µs CPU/line | 1.50× (ratio of the medians 1.50×) | ≤ 1.5× the floor's CPU per line — met |",
		"| 5 allocs/line | 5 allocs/line | +0 per line | 0 of ours per line — met |",
		// With the lags reported (the signal router's had none).
		"| 1.000 of offered (9,996/s) frozen, max lag 12.2 ms; closed at its bound 26.9 ms after the freeze | 0.999 of offered (9,994/s) reading, max lag 3.50 ms |",
	)
	if n := strings.Count(out, "| missing | missing |"); n != 9 {
		t.Errorf("%d missing rows, want the channel router's 9:\n%s", n, out)
	}
	if strings.Contains(out, "agent router, both ends on one node") {
		t.Errorf("an agent same-node row without a same-node case:\n%s", out)
	}

	// Past the goals by one step: 1.51× the floor, one alloc of ours, a
	// frozen flow at 0.89; and a frozen side never closed.
	over := "pkg: edgerelay/store/cluster/agentroute\n" +
		"BenchmarkAgentHop/route/stream-2  10  1 ns/op  151 cpu-ns/line  6 allocs/op\n" +
		"BenchmarkAgentHop/raw-nats/stream-2  10  1 ns/op  100 cpu-ns/line  5 allocs/op\n" +
		"BenchmarkAgentFrozenClient/beside-reading-2  10  1 ns/op  1 achieved/offered  0 closed  10000 msgs/s\n" +
		"BenchmarkAgentFrozenClient/beside-frozen-2  10  1 ns/op  0.89 achieved/offered  1 closed  5 close-ms  8900 msgs/s\n" +
		"pkg: edgerelay/store/cluster/signalroute\n" +
		"BenchmarkSignalFrozenSide/beside-reading-2  10  1 ns/op  1 achieved/offered  0 closed  10000 msgs/s\n" +
		"BenchmarkSignalFrozenSide/beside-frozen-2  10  1 ns/op  1 achieved/offered  0 closed  10000 msgs/s\n"
	out = render(runInfo{date: time.Unix(0, 0)}, routeClusterRows(parseBench(strings.NewReader(over))), "")
	contains(t, out,
		"| 1.51× (ratio of the medians 1.51×) | ≤ 1.5× the floor's CPU per line — **not met** |",
		"| +1 per line | 0 of ours per line — **not met** |",
		"| 0.890 of offered (8,900/s) frozen; closed at its bound 5.00 ms after the freeze |",
		"(≥ 0.90 of offered) with the consumer frozen — **not met** |",
		"| never closed in 1 round | 1.000 of offered (10,000/s) | — | the flow keeps its rate within 10% (≥ 0.90 of offered) with the consumer frozen (no round in which the frozen consumer was closed) — **not met** |",
	)
}

// The report's -bench pattern runs each router package's benchmarks, the
// first rounds of their cases and every mode beneath, matched level by
// level as go test matches it: a name deeper than the pattern runs when
// its first levels match.
func TestRouteClusterPattern(t *testing.T) {
	selected := func(pattern, name string) bool {
		levels, elems := strings.Split(pattern, "/"), strings.Split(name, "/")
		if len(elems) < len(levels) {
			return false
		}
		for i, l := range levels {
			if !regexp.MustCompile(l).MatchString(elems[i]) {
				return false
			}
		}
		return true
	}
	cases := map[string][]string{
		"signal":  {"BenchmarkSignalFrames/local/stream", "BenchmarkSignalFrames/cluster-cross-node/one-by-one", "BenchmarkSignalFrozenSide/beside-frozen"},
		"channel": {"BenchmarkPhoneToComputer/raw-nats/stream", "BenchmarkComputerToPhone/same-node/one-by-one", "BenchmarkChannelFrozenPhone/beside-reading"},
		"agent":   {"BenchmarkAgentHop/route/stream", "BenchmarkAgentFrozenClient/beside-frozen"},
	}
	roundOf := func(name, suffix string) string {
		levels := strings.Split(name, "/")
		levels[1] += suffix
		return strings.Join(levels, "/")
	}
	for _, quick := range []bool{false, true} {
		rounds := routeClusterRounds
		if quick {
			rounds = 1
		}
		for _, p := range routePackages {
			pattern := p.pattern(quick)
			for _, c := range cases[p.router] {
				for r, suffix := range []string{"", "#01", "#02", "#03", "#04"} {
					if got, want := selected(pattern, roundOf(c, suffix)), r < rounds; got != want {
						t.Errorf("quick=%v: %s selected %v, want %v (pattern %s)", quick, roundOf(c, suffix), got, want, pattern)
					}
				}
			}
			for _, other := range []string{"BenchmarkCluster/put/writers=1", "BenchmarkSendPath/x", "BenchmarkMailboxes/x"} {
				if selected(pattern, other) {
					t.Errorf("quick=%v: %s selected (pattern %s)", quick, other, pattern)
				}
			}
		}
	}
	for quick, frames := range map[bool]string{false: "20000x", true: "2000x"} {
		s, err := parseSettings(nil, quick)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, b := range benchRuns(s) {
			got = append(got, b.String())
		}
		for _, p := range routePackages {
			want := "-bench='" + p.pattern(quick) + "' -count=1 -benchtime=" + frames + " on " + p.dir
			if !strings.Contains(strings.Join(got, "\n"), want) {
				t.Errorf("quick=%v: bench runs lack %q:\n%s", quick, want, strings.Join(got, "\n"))
			}
		}
	}
}
