package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/channelbench"
	"edgerelay/bench/mailboxbench"
	"edgerelay/bench/serverproc"
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

const mailboxOutput = `pkg: edgerelay/bench/mailboxbench
BenchmarkServeHTTP/head-direction/ours-2         	  709639	       300.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkServeHTTP/head-direction/baseline-2     	  136752	      1800 ns/op	     386 B/op	      11 allocs/op
BenchmarkServeHTTP/get-envelope/ours-2           	  228418	      1000 ns/op	     160 B/op	       2 allocs/op
BenchmarkServeHTTP/get-envelope/baseline-2       	   73592	      4000 ns/op	    1544 B/op	      13 allocs/op
`

func TestMailboxRows(t *testing.T) {
	bench := parseBench(strings.NewReader(mailboxOutput))
	m := mailboxResults{
		put: mailboxbench.PutReport{
			Options: mailboxbench.PutOptions{EnvelopeSize: 1024},
			Figures: []mailboxbench.PutFigure{
				{Writers: 1, OursMedian: 4600, PebbleMedian: 5000, Ratio: 0.92, RoundRatio: 0.91},
				{Writers: 64, OursMedian: 20000, PebbleMedian: 40000, Ratio: 0.5, RoundRatio: 0.52},
			},
		},
		reads: mailboxbench.ReadReport{
			Options: mailboxbench.ReadOptions{Conns: 8},
			Figures: []mailboxbench.ReadFigure{{Name: "HEAD of a direction", OursMedian: 90000, BaselineMedian: 45000, Ratio: 2, RoundRatio: 2.1}},
		},
		watch: mailboxbench.WatchReport{
			Options: mailboxbench.WatchOptions{Sockets: 10000},
			IdleComparison: serverproc.IdleComparison{
				Ours:       []mailboxbench.WatchSide{{PerSocket: 20480, StackPerSocket: 6144, HeapPerSocket: 15360, GoroutinesPerSocket: 2}},
				Baseline:   []mailboxbench.WatchSide{{PerSocket: 30720, StackPerSocket: 15360, HeapPerSocket: 15360, GoroutinesPerSocket: 2}},
				OursMedian: 20480, BaselineMedian: 30720, Ratio: 1.5,
			},
		},
	}
	out := render(runInfo{date: time.Unix(0, 0)}, mailboxRows(m, bench), "")
	for _, want := range []string{
		"1 writer, 1024 B envelopes over loopback HTTP: writes/s",
		"| 4,600 | 5,000 | 0.91× = 91% (ratio of the medians 0.92×) | ≥ 90% of raw Pebble — met |",
		"64 writers, each on its own mailbox",
		"| 20,000 | 40,000 | 0.52× = 52% (ratio of the medians 0.50×) | ≥ 75% of raw Pebble — **not met** |",
		"| mailbox HEAD of a direction over loopback, requests/s (8 connections, one request in flight each; baseline: net/http over the same store) | 90,000 | 45,000 | 2.10× (ratio of the medians 2.00×) | ≥ 5× — **not met** |",
		"| 300.0 ns, 0 allocs | 1.80 µs, 11 allocs | 6.00× | ≥ 5×, 0 allocs — met |",
		"| 1.00 µs, 2 allocs | 4.00 µs, 13 allocs | 4.00× | ≥ 5× — **not met** |",
		"with 10,000 open",
		"| 20.0 KiB (stacks 6.0, heap 15.0 KiB; 2.00 goroutines) | 30.0 KiB (stacks 15.0, heap 15.0 KiB; 2.00 goroutines) | 1.50× | ≤ 12 KiB per socket — **not met** |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q\n%s", want, out)
		}
	}
}

// A comparison that failed says so in its row; the others still report.
func TestMailboxRowsFailures(t *testing.T) {
	m := mailboxResults{putErr: errors.New("disk"), readsErr: errors.New("boom"), watchErr: errors.New("fork")}
	out := render(runInfo{date: time.Unix(0, 0)}, mailboxRows(m, parseBench(strings.NewReader(mailboxOutput))), "")
	for _, want := range []string{
		"| mailbox envelope PUT comparison | failed | failed | — | error: disk |",
		"| mailbox HEAD and GET comparison | failed | failed | — | error: boom |",
		"| mailbox idle watch socket memory | failed | failed | — | error: fork |",
		"| 300.0 ns, 0 allocs | 1.80 µs, 11 allocs | 6.00× | ≥ 5×, 0 allocs — met |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q\n%s", want, out)
		}
	}
	if m.err() == nil {
		t.Error("the failures are not returned")
	}
}

func TestMedianWatch(t *testing.T) {
	sides := []mailboxbench.WatchSide{{PerSocket: 3}, {PerSocket: 1}, {PerSocket: 2}, {PerSocket: 9}}
	if got := medianWatch(sides).PerSocket; got != 2 {
		t.Errorf("median round has %v bytes per socket, want the lower middle 2", got)
	}
	if sides[0].PerSocket != 3 {
		t.Error("medianWatch reordered its argument")
	}
}
