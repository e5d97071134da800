package main

import (
	"strings"
	"testing"
	"time"

	"edgerelay/bench/channelbench"
)

const sampleOutput = `goos: linux
goarch: amd64
pkg: edgerelay/fastpath/bucket
cpu: AMD EPYC
BenchmarkSetTake/single-2         	53437712	        20.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkSetTake/single-2         	53437712	        22.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkSetTake/single-2         	53437712	        30.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkXRate/single-2           	14000000	        90.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkSetTake/many-parallel-2  	10000000	        50.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkXRate/many-parallel-2    	10000000	       100.0 ns/op	       0 B/op	       0 allocs/op
PASS
ok  	edgerelay/fastpath/bucket	10.1s
pkg: edgerelay/fastpath/channel/control
BenchmarkParse/base64-256B/control-2       	 5000000	       200.0 ns/op	1280.00 MB/s	       0 B/op	       0 allocs/op
BenchmarkParse/base64-256B/encoding_json-2 	  500000	      2000 ns/op	 128.00 MB/s	     544 B/op	       9 allocs/op
pkg: edgerelay/fastpath/channel
BenchmarkForwardRoundTrip-2   	   36216	     32683 ns/op	  62.66 MB/s	     61194 frames/s	       0 B/op	       0 allocs/op
PASS
`

func TestParseBench(t *testing.T) {
	r := parseBench(strings.NewReader(sampleOutput))
	if got := len(r.samples[pkgBucket]["BenchmarkSetTake/single"]); got != 3 {
		t.Fatalf("%d samples of SetTake/single, want 3", got)
	}
	if v, ok := r.median(pkgBucket, "BenchmarkSetTake/single", "ns/op"); !ok || v != 22 {
		t.Errorf("median ns/op %v %v, want 22", v, ok)
	}
	if v, _ := r.median(pkgChannel, "BenchmarkForwardRoundTrip", "frames/s"); v != 61194 {
		t.Errorf("frames/s %v", v)
	}
	if _, ok := r.median(pkgChannel, "BenchmarkForwardRoundTrip", "p99-µs"); ok {
		t.Error("a unit that was never reported has a median")
	}
}

func TestRows(t *testing.T) {
	bench := parseBench(strings.NewReader(sampleOutput))
	rep := &channelbench.Report{
		Options:  channelbench.CompareOptions{Rounds: 3, Frames: 10, Phones: 4, FrameSize: 1024},
		Ours:     channelbench.Side{Median: 100_000, P50: time.Millisecond, P99: 2 * time.Millisecond, AllocsPerFrame: 4},
		Baseline: channelbench.Side{Median: 40_000, P50: 2 * time.Millisecond, P99: 4 * time.Millisecond, AllocsPerFrame: 30},
		Ratio:    2.5, RoundRatio: 2.4,
	}
	var rows []row
	rows = append(rows, channelRows(rep, nil, bench)...)
	rows = append(rows, bucketRows(bench)...)
	rows = append(rows, controlRows(bench)...)
	out := render(runInfo{date: time.Unix(0, 0)}, rows, sampleOutput)
	for _, want := range []string{
		"| channel forwarding, frames/s (4 phones, 1024 B frames, median of 2 rounds) | 100,000 | 40,000 | 2.50× | ≥ 1.3× — met |",
		"| channel forwarding, median of the per-round ratios (each round ran both relays back to back) | — | — | 2.40× | ≥ 1.3× — met |",
		"| channel forwarding, relay allocs per round trip (raw clients that allocate nothing) | 0 | — | — | 0 allocs/frame — met |",
		"| token bucket take, single (vs golang.org/x/time/rate) | 22.0 ns, 0 allocs | 90.0 ns, 0 allocs | 4.09× | ≥ 3×, 0 allocs — met |",
		"| token bucket take, many-parallel (vs golang.org/x/time/rate) | 50.0 ns, 0 allocs | 100.0 ns, 0 allocs | 2.00× | ≥ 3×, 0 allocs — **not met** |",
		"| control codec Parse, base64-256B (vs encoding/json) | 200.0 ns, 0 allocs | 2.00 µs, 9 allocs | 10.00× | 0 allocs — met |",
		"<details><summary>Raw output</summary>",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q\n%s", want, out)
		}
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -1500: "-1,500"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestQuickDefaults(t *testing.T) {
	s, err := parseSettings(nil, true)
	if err != nil || s.rounds != 3 || s.count != 1 {
		t.Fatalf("%+v %v", s, err)
	}
	s, err = parseSettings([]string{"-rounds=5"}, true)
	if err != nil || s.rounds != 5 {
		t.Fatalf("an explicit flag should win over QUICK: %+v %v", s, err)
	}
}
