package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/signalbench"
)

const signalOutput = `pkg: edgerelay/bench/signalbench
BenchmarkSignalRoundTrip/256B-2         	   97494	     36076 ns/op	  14.19 MB/s	     55438 frames/s	       0 B/op	       0 allocs/op
BenchmarkSignalRoundTrip/4096B-2        	   80000	     40000 ns/op	 204.80 MB/s	     50000 frames/s	      16 B/op	       1 allocs/op
pkg: edgerelay/bench/pushbench
BenchmarkPushFanout-2   	   43446	     91382 ns/op	      7614 pushes/cpu-s	     10943 pushes/s	         0 skipped/op	   21311 B/op	     195 allocs/op
pkg: edgerelay/bench/pushgwbench
BenchmarkSendAPNs/unmetered-2         	   30000	     45000 ns/op	     13572 pushes/cpu-s	     21923 pushes/s	   12000 B/op	     148 allocs/op
BenchmarkSendAPNs/unmetered-2         	   30000	     45000 ns/op	     13000 pushes/cpu-s	     21923 pushes/s	   12000 B/op	     148 allocs/op
BenchmarkSendAPNs/unmetered-2         	   30000	     45000 ns/op	     14000 pushes/cpu-s	     21923 pushes/s	   12000 B/op	     148 allocs/op
BenchmarkSendAPNs/metered-2           	   30000	     45000 ns/op	      3500 pushes/cpu-s	     22381 pushes/s	   12000 B/op	     149 allocs/op
`

func TestSignalRows(t *testing.T) {
	bench := parseBench(strings.NewReader(signalOutput))
	side := func(perCore, perSec, use, allocs float64) signalbench.Side {
		return signalbench.Side{PerCoreSec: perCore, PerSec: perSec, CoreUse: use, AllocsPerFrame: allocs}
	}
	r := signalResults{rep: signalbench.Report{
		Options: signalbench.Options{Pairs: 32},
		Pinned:  true,
		Results: []signalbench.LoadResult{
			{Load: signalbench.Load{Size: 256, Window: 4}, Ours: side(200_000, 150_000, 0.75, 0.0002), Baseline: side(140_000, 120_000, 0.857, 2),
				Ratio: 1.43, RoundRatio: 1.40},
			{Load: signalbench.Load{Size: 256, Window: 1}, Ours: side(130_000, 90_000, 0.7, 0.02), Baseline: side(120_000, 80_000, 0.66, 2),
				Ratio: 1.08, RoundRatio: 1.10},
		},
	}}
	out := render(runInfo{date: time.Unix(0, 0)}, signalRows(r, bench), "")
	contains(t, out,
		"| mailbox signal forwarding, 256 B frames, 4 in flight per rendezvous, 32 rendezvous: frames per relay CPU-second (frames/s, relay core use); "+
			"each relay a process of its own pinned to one core; baseline: net/http + gorilla/websocket "+
			"| 200,000 (150,000/s, 75% of a core) | 140,000 (120,000/s, 86% of a core) | 1.40× (ratio of the medians 1.43×) | ≥ 1.3× — met |",
		"| mailbox signal forwarding, 256 B frames, 4 in flight per rendezvous: relay process heap allocations per forwarded frame | 0.000 | 2.000 | — | 0 allocs/frame — met |",
		"256 B frames one at a time per rendezvous (ping-pong), 32 rendezvous",
		"| 1.10× (ratio of the medians 1.08×) | ≥ 1.3× — **not met** |",
		// One frame in fifty allocating is not zero.
		"(ping-pong): relay process heap allocations per forwarded frame | 0.020 | 2.000 | — | 0 allocs/frame — **not met** |",
		"256 B frames one in flight, one process with raw clients that allocate nothing: relay allocs per round trip of two frames "+
			"(frames/s, µs per round trip) | 0 (55,438 frames/s, 36.1 µs) | — | — | 0 allocs/frame — met |",
		"| 1 (50,000 frames/s, 40.0 µs) | — | — | 0 allocs/frame — **not met** |",
	)
}

func TestSignalRowsFailure(t *testing.T) {
	out := render(runInfo{date: time.Unix(0, 0)}, signalRows(signalResults{err: errors.New("no taskset")}, parseBench(strings.NewReader(""))), "")
	contains(t, out,
		"| mailbox signal forwarding comparison | failed | failed | — | error: no taskset |",
		"| mailbox signal forwarding, relay allocs per round trip (one process, raw clients) | missing | — | — | 0 allocs/frame — no result (see the raw output) |",
	)
}

func TestPushRows(t *testing.T) {
	bench := parseBench(strings.NewReader(signalOutput))
	out := render(runInfo{date: time.Unix(0, 0)}, append(pushFanoutRows(bench), pushgwRows(bench)...), "")
	contains(t, out,
		"256 mailboxes each with its own registered device, 32 writers: pushes per CPU-second",
		"| 7,614 (10,943/s; 195 allocs; 0.0% skipped) | — (no baseline) | — | ≥ 4,000/s per core, none skipped — met |",
		"daily budget off, 8 concurrent senders per core over loopback",
		"| 13,572 [13,000–14,000] (21,923/s; 148 allocs) | — (no baseline) | — | ≥ 4,000/s per core — met |",
		"| 3,500 (22,381/s; 149 allocs) | — (no baseline) | — | ≥ 4,000/s per core — **not met** |",
	)
	// A push skipped is a push not counted: the goal is not met however
	// fast the rest went.
	skipping := strings.Replace(signalOutput, "0 skipped/op", "0.25 skipped/op", 1)
	out = render(runInfo{date: time.Unix(0, 0)}, pushFanoutRows(parseBench(strings.NewReader(skipping))), "")
	if !strings.Contains(out, "25.0% skipped) | — (no baseline) | — | ≥ 4,000/s per core, none skipped — **not met** |") {
		t.Errorf("skipped pushes pass:\n%s", out)
	}
	out = render(runInfo{date: time.Unix(0, 0)}, append(pushFanoutRows(benchResults{}), pushgwRows(benchResults{})...), "")
	contains(t, out,
		"| missing | — (no baseline) | — | ≥ 4,000/s per core — no result (see the raw output) |",
		"| push gateway POST /send → fake APNs: pushes per CPU-second | missing |",
	)
}

func TestBenchRuns(t *testing.T) {
	s, err := parseSettings([]string{"-push-benchtime=2s"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if s.turnRounds != 2 || s.signalRound != 250*time.Millisecond || s.pushCount != 1 {
		t.Errorf("QUICK defaults %+v", s)
	}
	var got []string
	for _, b := range benchRuns(s) {
		got = append(got, b.String())
	}
	joined := strings.Join(got, "\n")
	for _, want := range []string{
		"-bench='^BenchmarkSignalRoundTrip$' -count=1 -benchtime=100ms on ./bench/signalbench/",
		"-bench='^Benchmark(Seal|Open)$' -count=1 -benchtime=100ms on ./sdk/link/",
		"-bench='^BenchmarkPushFanout$' -count=1 -benchtime=2s on ./bench/pushbench/",
		"-bench='^BenchmarkSendAPNs$' -count=1 -benchtime=2s on ./bench/pushgwbench/",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("bench runs lack %q:\n%s", want, joined)
		}
	}
}

// The signal comparison's cells give the spread of its rounds (TURN's: turn_test.go).
func TestSignalSpread(t *testing.T) {
	runs := []signalbench.Run{{Frames: 100, Elapsed: time.Second, CPU: time.Second / 2}, {Frames: 120, Elapsed: time.Second, CPU: time.Second / 2}}
	base := []signalbench.Run{{Frames: 100, Elapsed: time.Second, CPU: time.Second}, {Frames: 100, Elapsed: time.Second, CPU: time.Second}}
	r := signalResults{rep: signalbench.Report{Options: signalbench.Options{Pairs: 32}, Results: []signalbench.LoadResult{{
		Load: signalbench.Load{Size: 256, Window: 4},
		Ours: signalbench.Side{Runs: runs, PerCoreSec: 220}, Baseline: signalbench.Side{Runs: base, PerCoreSec: 100},
		Ratio: 2.2, RoundRatio: 2.2,
	}}}}
	out := render(runInfo{date: time.Unix(0, 0)}, signalRows(r, benchResults{}), "")
	if !strings.Contains(out, "| 220 [200–240] (0/s, 0% of a core) | 100 [100–100] (0/s, 0% of a core) | 2.20× [2.00–2.40×] (ratio of the medians 2.20×) |") {
		t.Errorf("no spread:\n%s", out)
	}
}
