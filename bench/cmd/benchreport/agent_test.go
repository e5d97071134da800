package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/agentbench"
)

func TestAgentRows(t *testing.T) {
	dir := func(perCPU, perSec []float64, allocs float64, p50, p99, d50, d99 time.Duration) agentbench.Direction {
		return agentbench.Direction{FramesPerCPUSec: perCPU, FramesPerSec: perSec, MedianPerCPU: perCPU[0], Median: perSec[0],
			AllocsPerFrame: allocs, LatencyRate: 30_000, P50: p50, P99: p99, DirectP50: d50, DirectP99: d99, AddedP50: p50 - d50, AddedP99: p99 - d99}
	}
	ms, us := time.Millisecond, time.Microsecond
	r := agentResults{rep: agentbench.Report{
		Options: agentbench.Options{Rounds: 3, Frames: 100_000, Clients: 4, PayloadSize: 1024, LatencyTime: time.Second, LatencyRounds: 3, ServerCPU: 0, LoadCPU: 1},
		Pinned:  true,
		Ours: agentbench.Side{
			ToClient:   dir([]float64{700_000, 720_000}, []float64{600_000, 640_000}, 0.0004, 300*us, 2*ms, 200*us, 1*ms),
			ToInstance: dir([]float64{600_000, 640_000}, []float64{600_000, 600_000}, 0.03, 300*us, 2*ms, 200*us, 1*ms),
		},
		Baseline: agentbench.Side{
			ToClient:   dir([]float64{70_000, 60_000}, []float64{60_000, 60_000}, 13, 1200*us, 11*ms, 200*us, 1*ms),
			ToInstance: dir([]float64{80_000, 80_000}, []float64{80_000, 80_000}, 17, 500*us, 6*ms, 200*us, 1*ms),
		},
		RatioToClient: 10.9, RoundRatioToClient: 11, RatioToInstance: 7.75, RoundRatioToInstance: 7.75,
		WallRatioToClient: 10.33, WallRatioToInstance: 7.5,
	}}
	out := render(runInfo{date: time.Unix(0, 0)}, agentRows(r), "")
	contains(t, out,
		"| agent routing instance → client, 1024 B payloads, 4 clients on one instance over TLS 1.3: frames per relay CPU-second "+
			"(each relay a process of its own pinned to core 0, the load generator to core 1; median of 2 rounds of 100,000 frames; "+
			"baseline: net/http + gorilla/websocket + encoding/json) | 700,000 [700,000–720,000] | 70,000 [60,000–70,000] "+
			"| 11.00× [10.00–12.00×] (ratio of the medians 10.90×) | ≥ 3× — met |",
		"instance → client, 1024 B payloads, 4 clients on one instance over TLS 1.3: frames per wall second (the same runs; one load-generator core) "+
			"| 600,000 [600,000–640,000] | 60,000 [60,000–60,000] | 10.33× [10.00–10.67×] (ratio of the medians 10.33×) | — |",
		"instance → client, 1024 B payloads, 4 clients on one instance over TLS 1.3: relay process heap allocations per frame (crypto/tls allocates one small object per socket read, many frames per read under load; the relay's own code allocates none: `go test -run Alloc ./fastpath/agent/` over plain TCP) | 0.000 | 13.000 | 32500.00× | 0 allocs/frame — met |",
		"client → instance, 1024 B payloads, 4 clients on one instance over TLS 1.3: relay process heap allocations per frame (crypto/tls allocates one small object per socket read, many frames per read under load; the relay's own code allocates none: `go test -run Alloc ./fastpath/agent/` over plain TCP) | 0.030 | 17.000 | 566.67× | 0 allocs/frame — **not met** |",
		"instance → client, 1024 B payloads, 4 clients on one instance over TLS 1.3: latency the relay adds, p50 / p99, at 30,000 frames/s for both relays "+
			"(through the relay, less the same load over one TLS connection without a relay; medians of 3 rounds of 1s) "+
			"| 100µs / 1ms (through the relay 300µs / 2ms; floor 200µs / 1ms) | 1ms / 10ms (through the relay 1.2ms / 11ms; floor 200µs / 1ms) | 10.00× / 10.00× | p99 added < 250 µs at half capacity (run here at 5% of ours) — **not met** |",
	)
	out = render(runInfo{date: time.Unix(0, 0)}, agentRows(agentResults{err: errors.New("no TLS")}), "")
	if !strings.Contains(out, "| agent routing comparison | failed | failed | — | error: no TLS |") {
		t.Errorf("a failed comparison is not reported:\n%s", out)
	}
	if got := agentInfo(r); !strings.Contains(got, "3 rounds per relay (first dropped) of 100,000 frames each way, 4 clients on one instance") ||
		!strings.Contains(got, "pinned to core 0, the load generator to core 1") {
		t.Errorf("info %q", got)
	}
}
