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

// contains fails t for each of wants that the report out lacks.
func contains(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q\n%s", want, out)
		}
	}
}

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
		Options: channelbench.CompareOptions{Rounds: 3, Frames: 10, Phones: 4, FrameSize: 1024, ServerCPU: 0, LoadCPU: 1},
		Ours: channelbench.Side{Median: 100_000, FramesPerSec: []float64{90_000, 110_000}, MedianPerCPU: 150_000, PerCPUSec: []float64{140_000, 160_000},
			CoreUse: 0.66, P50: time.Millisecond, P99: 2 * time.Millisecond, AllocsPerFrame: 0.002},
		Baseline: channelbench.Side{Median: 40_000, FramesPerSec: []float64{40_000, 40_000}, MedianPerCPU: 50_000, PerCPUSec: []float64{50_000, 50_000},
			CoreUse: 0.8, P50: 2 * time.Millisecond, P99: 4 * time.Millisecond, AllocsPerFrame: 30},
		Ratio: 3, RoundRatio: 3, RoundRatios: []float64{2.8, 3.2}, WallRatio: 2.5, WallRoundRatio: 2.5, Pinned: true,
	}
	var rows []row
	rows = append(rows, channelRows(rep, nil, bench)...)
	rows = append(rows, bucketRows(bench)...)
	rows = append(rows, controlRows(bench)...)
	out := render(runInfo{date: time.Unix(0, 0)}, rows, sampleOutput)
	contains(t, out,
		"| channel forwarding phone→computer→phone, round trips per relay CPU-second (4 phones, 1024 B frames, each relay a process of its own "+
			"pinned to core 0, the load generator to core 1; median of 2 rounds of 10 round trips; baseline: net/http + gorilla/websocket + encoding/json) "+
			"(relay core use) | 150,000 [140,000–160,000] (66% of a core) | 50,000 [50,000–50,000] (80% of a core) | 3.00× [2.80–3.20×] (ratio of the medians 3.00×) | ≥ 1.3× — met |",
		"| channel forwarding, round trips per wall second (the same runs) | 100,000 [90,000–110,000] | 40,000 [40,000–40,000] | 2.50× [2.25–2.75×] (ratio of the medians 2.50×) |",
		"| channel forwarding, round-trip latency p50 / p99 (medians over the rounds) | 1ms / 2ms | 2ms / 4ms | 2.00× / 2.00× | — |",
		"| channel forwarding, relay process heap allocations per round trip (each run's claim and dials included) | 0.002 | 30.000 |",
		"| channel forwarding, relay allocs per round trip (raw clients that allocate nothing) | 0 | — | — | 0 allocs/frame — met |",
		"| token bucket take, single (vs golang.org/x/time/rate) | 22.0 ns [20.0 ns–30.0 ns], 0 allocs | 90.0 ns, 0 allocs | 4.09× | ≥ 3×, 0 allocs — met |",
		"| token bucket take, many-parallel (vs golang.org/x/time/rate) | 50.0 ns, 0 allocs | 100.0 ns, 0 allocs | 2.00× | ≥ 3×, 0 allocs — **not met** |",
		"| control codec Parse, base64-256B (vs encoding/json) | 200.0 ns, 0 allocs | 2.00 µs, 9 allocs | 10.00× | 0 allocs — met |",
		"<details><summary>Raw output</summary>",
	)
	// A comparison that could not pin says so in its figure.
	rep.Pinned, rep.Warnings = false, []string{"no taskset"}
	out = render(runInfo{date: time.Unix(0, 0)}, channelRows(rep, nil, bench), "")
	if !strings.Contains(out, "each relay a process of its own, NOT pinned: no taskset;") {
		t.Errorf("an unpinned comparison reads as pinned:\n%s", out)
	}
	out = render(runInfo{date: time.Unix(0, 0)}, channelRows(nil, errors.New("boom"), benchResults{}), "")
	contains(t, out,
		"| channel forwarding comparison | failed | failed | — | error: boom |",
		"| channel forwarding, relay allocs per round trip | missing |",
	)
}

func TestChannelIdleRows(t *testing.T) {
	r := &channelbench.IdleReport{
		Options:   channelbench.IdleOptions{Phones: 10_000, PerComputer: 32},
		Computers: 313,
		IdleComparison: serverproc.IdleComparison{
			Ours:       []serverproc.IdleCost{{PerSocket: 13 << 10, StackPerSocket: 8 << 10, HeapPerSocket: 3 << 10, GoroutinesPerSocket: 2}},
			Baseline:   []serverproc.IdleCost{{PerSocket: 26 << 10, StackPerSocket: 8 << 10, HeapPerSocket: 16 << 10, GoroutinesPerSocket: 2}},
			OursMedian: 13 << 10, BaselineMedian: 26 << 10, Ratio: 2,
		},
	}
	out := render(runInfo{date: time.Unix(0, 0)}, channelIdleRows(r, nil), "")
	want := "| private channel idle phone channel, resident memory per phone with 10,000 open on 313 computers' control sockets " +
		"(32 phones each; the control sockets opened before the first reading; each relay a process of its own; baseline: net/http + gorilla/websocket) " +
		"| 13.0 KiB (stacks 8.0, heap 3.0 KiB; 2.00 goroutines) | 26.0 KiB (stacks 8.0, heap 16.0 KiB; 2.00 goroutines) | 2.00× " +
		"| — (no goal set; ours: goroutine stacks dominate, 62% of it, with 2.00 goroutines per socket) |"
	if !strings.Contains(out, want) {
		t.Errorf("report lacks %q\n%s", want, out)
	}
	out = render(runInfo{date: time.Unix(0, 0)}, channelIdleRows(nil, errors.New("too many open files")), "")
	if !strings.Contains(out, "| private channel idle phone channels memory | failed | failed | — | error: too many open files |") {
		t.Errorf("a failed comparison is not reported:\n%s", out)
	}
}

func TestDominant(t *testing.T) {
	for _, c := range []struct {
		cost serverproc.IdleCost
		want string
	}{
		{serverproc.IdleCost{PerSocket: 10, StackPerSocket: 2, HeapPerSocket: 6, GoroutinesPerSocket: 1}, "heap dominate, 60% of it"},
		{serverproc.IdleCost{PerSocket: 10, StackPerSocket: 2, HeapPerSocket: 1, GoroutinesPerSocket: 1}, "resident memory outside the stacks and heap dominate, 70% of it"},
	} {
		if got := dominant(c.cost); !strings.HasPrefix(got, c.want) {
			t.Errorf("dominant(%+v) = %q, want %q…", c.cost, got, c.want)
		}
	}
}

const sdkOutput = `pkg: edgerelay/sdk/link
BenchmarkSeal/256B/ours-2         	 1217217	        100.0 ns/op	2596.89 MB/s	       0 B/op	       0 allocs/op
BenchmarkSeal/256B/raw-2          	 1224966	        98.00 ns/op	2615.71 MB/s	       0 B/op	       0 allocs/op
BenchmarkOpen/4KiB/ours-2         	  184578	       800.0 ns/op	6420.17 MB/s	       0 B/op	       0 allocs/op
BenchmarkOpen/4KiB/raw-2          	  187758	       600.0 ns/op	6303.83 MB/s	       0 B/op	       0 allocs/op
`

func TestSDKRows(t *testing.T) {
	out := render(runInfo{date: time.Unix(0, 0)}, sdkRows(parseBench(strings.NewReader(sdkOutput))), "")
	contains(t, out,
		"| SDK envelope seal, 256B (sdk/link vs raw AES-256-GCM: cipher.NewGCM built once, same nonce and AAD shape) | 100.0 ns, 0 allocs | 98.0 ns, 0 allocs "+
			"| 0.98× (ours takes 1.02× raw's time) | ≤ 1.2× raw's time, 0 allocs — met |",
		"| SDK envelope open, 4KiB (sdk/link vs raw AES-256-GCM: cipher.NewGCM built once, same nonce and AAD shape) | 800.0 ns, 0 allocs | 600.0 ns, 0 allocs "+
			"| 0.75× (ours takes 1.33× raw's time) | ≤ 1.2× raw's time, 0 allocs — **not met** |",
	)
	out = render(runInfo{date: time.Unix(0, 0)}, sdkRows(benchResults{}), "")
	if !strings.Contains(out, "| SDK envelope seal and open vs raw AES-256-GCM | missing | missing | — | ≤ 1.2× raw's time, 0 allocs — no result (see the raw output) |") {
		t.Errorf("missing benchmarks are not reported:\n%s", out)
	}
}

func TestRenderHeader(t *testing.T) {
	out := render(runInfo{date: time.Unix(0, 0), cpu: "AMD EPYC", cores: 2, procs: 2, goVersion: "go1.26", osArch: "linux/amd64", quick: true,
		parts: [][2]string{{"channel comparison", "3 rounds; 4s"}}, elapsed: 70 * time.Second}, nil, "")
	contains(t, out,
		"- Machine: AMD EPYC, 2 cores (GOMAXPROCS 2), linux/amd64\n",
		"- Go: go1.26\n",
		"- Run: QUICK=1 (short: figures are indicative only), 1m10s in all\n  - channel comparison: 3 rounds; 4s\n",
		"Brackets give the spread",
		"| figure | ours | baseline | ratio | goal |\n|---|---|---|---|---|\n",
	)
}

func TestQuickDefaults(t *testing.T) {
	if s, err := parseSettings(nil, false); err != nil || s.idlePhones != 10_000 || s.watchSockets != 10_000 || s.rounds < 6 || s.agentRounds < 6 {
		t.Fatalf("the full run's defaults fall short of the issue's: %+v %v", s, err)
	}
	s, err := parseSettings(nil, true)
	if err != nil || s.rounds != 3 || s.count != 1 || s.idlePhones != 2_000 || s.watchSockets != 2_000 {
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
	run := func(ops uint64, cpu time.Duration) mailboxbench.PinnedRun {
		return mailboxbench.PinnedRun{Ops: ops, Elapsed: time.Second, CPU: cpu}
	}
	m := mailboxResults{
		pinned: mailboxbench.PinnedReport{
			Options: mailboxbench.PinnedOptions{Rounds: 3, RoundTime: time.Second, Conns: 8, EnvelopeSize: 1024, ServerCPU: 0, LoadCPU: 1, ServerGOMAXPROCS: 2},
			Pinned:  true,
			Figures: []mailboxbench.PinnedFigure{
				{Name: "HEAD of a direction",
					Ours:     mailboxbench.PinnedSide{Runs: []mailboxbench.PinnedRun{run(90_000, 500*time.Millisecond), run(100_000, 500*time.Millisecond)}, PerCPUSec: 190_000, PerSec: 95_000, CoreUse: 0.5},
					Other:    mailboxbench.PinnedSide{Runs: []mailboxbench.PinnedRun{run(45_000, time.Second), run(50_000, time.Second)}, PerCPUSec: 47_500, PerSec: 47_500, CoreUse: 1, AllocsPerOp: 30},
					CPURatio: 4, CPURoundRatio: 4, WallRatio: 2, WallRoundRatio: 2},
				{Name: "PUT synced, 64 writers", Writers: 64,
					Ours:     mailboxbench.PinnedSide{Runs: []mailboxbench.PinnedRun{run(20_000, 700*time.Millisecond)}, PerCPUSec: 28_571, PerSec: 20_000, CoreUse: 0.7},
					Other:    mailboxbench.PinnedSide{Runs: []mailboxbench.PinnedRun{run(40_000, 500*time.Millisecond)}, PerCPUSec: 80_000, PerSec: 40_000, CoreUse: 0.5},
					CPURatio: 0.36, CPURoundRatio: 0.36, WallRatio: 0.5, WallRoundRatio: 0.5},
			},
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
	contains(t, out,
		"| mailbox HEAD of a direction over loopback (server a process of its own pinned to core 0, load generator pinned to core 1, servers run with GOMAXPROCS=2; "+
			"8 connections, one request in flight each; baseline: net/http over its own store seeded alike; median of 2 rounds of 1s): requests per server CPU-second "+
			"| 190,000 [180,000–200,000] (5.3 µs CPU/req, server core 50% busy, 0.0 allocs/req) | 47,500 [45,000–50,000] (21.1 µs CPU/req, server core 100% busy, 30.0 allocs/req) "+
			"| **4.00× [4.00–4.00×] (ratio of the medians 4.00×)** | ≥ 5× — **not met** |",
		"requests per wall second | 95,000 [90,000–100,000] | 47,500 [45,000–50,000] | 2.00× [2.00–2.00×] (ratio of the medians 2.00×) | — (throughput of one load core; the goal is per server core) |",
		"PUT synced before the 201, 64 writers, each on its own mailbox, 1024 B envelopes over loopback HTTP",
		": writes per wall second | 20,000 | 40,000 | 50% = 0.50× (ratio of the medians 0.50×) | ≥ 75% of raw Pebble — **not met** |",
		"| 300.0 ns, 0 allocs | 1.80 µs, 11 allocs | 6.00× | ≥ 5×, 0 allocs — met |",
		"| 1.00 µs, 2 allocs | 4.00 µs, 13 allocs | 4.00× | ≥ 5× — **not met** |",
		"with 10,000 open",
		"| 20.0 KiB (stacks 6.0, heap 15.0 KiB; 2.00 goroutines) | 30.0 KiB (stacks 15.0, heap 15.0 KiB; 2.00 goroutines) | 1.50× | ≤ 12 KiB per socket — **not met** |",
	)
}

// A comparison that failed says so in its row; the others still report.
func TestMailboxRowsFailures(t *testing.T) {
	m := mailboxResults{pinErr: errors.New("disk"), watchErr: errors.New("fork")}
	out := render(runInfo{date: time.Unix(0, 0)}, mailboxRows(m, parseBench(strings.NewReader(mailboxOutput))), "")
	contains(t, out,
		"| mailbox pinned comparison (HEAD, GET, PUT) | failed | failed | — | error: disk |",
		"| mailbox idle watch socket memory | failed | failed | — | error: fork |",
		"| 300.0 ns, 0 allocs | 1.80 µs, 11 allocs | 6.00× | ≥ 5×, 0 allocs — met |",
	)
	if m.err() == nil {
		t.Error("the failures are not returned")
	}
}

func TestMedianIdle(t *testing.T) {
	costs := []serverproc.IdleCost{{PerSocket: 3}, {PerSocket: 1}, {PerSocket: 2}, {PerSocket: 9}}
	if got := medianIdle(costs).PerSocket; got != 2 {
		t.Errorf("median round has %v bytes per socket, want the lower middle 2", got)
	}
	if costs[0].PerSocket != 3 {
		t.Error("medianIdle reordered its argument")
	}
}

func TestOpSpread(t *testing.T) {
	r := parseBench(strings.NewReader(sampleOutput))
	op := r.op(pkgBucket, "BenchmarkSetTake/single")
	if !op.ok || op.ns != 22 || op.String() != "22.0 ns [20.0 ns–30.0 ns], 0 allocs" {
		t.Errorf("op %+v: %q", op, op.String())
	}
	if op := r.op(pkgBucket, "BenchmarkNone"); op.ok {
		t.Errorf("a benchmark that did not run: %+v", op)
	}
}
