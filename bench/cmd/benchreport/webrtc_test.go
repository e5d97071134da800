package main

import (
	"strings"
	"testing"
	"time"

	"edgerelay/bench/turnbench"
)

// TestWebRTCRows: without chromium the row says the comparison was
// skipped and why; with figures, the CPU goal is judged on the per-round
// ratio (≤ 0.8× met, one past not) and drops against coturn's.
func TestWebRTCRows(t *testing.T) {
	rows := webrtcRows(webrtcResults{skipped: "chromium is not installed (apt-get install chromium)"})
	if len(rows) != 1 || rows[0].Ours != "skipped" || !strings.Contains(rows[0].Goal, "skipped: chromium is not installed") {
		t.Fatalf("skipped: %+v", rows)
	}
	side := func(name string, cpu time.Duration, drops uint64) turnbench.WebRTCSide {
		r := turnbench.WebRTCRun{Bytes: 100_000_000, Elapsed: 4 * time.Second, CPU: cpu, Drops: drops}
		return turnbench.WebRTCSide{Name: name, Runs: []turnbench.WebRTCRun{r}, MBPerSec: r.MBPerSec(), CPUPerMB: r.CPUPerMB(), Drops: drops}
	}
	for _, c := range []struct {
		ratio        float64
		ours, coturn uint64
		cpuMet       bool
		dropsMet     bool
	}{
		{0.8, 5, 5, true, true},
		{0.81, 6, 5, false, false},
	} {
		rep := turnbench.WebRTCReport{Ours: side("ours", 800*time.Millisecond, c.ours), Coturn: side("coturn", time.Second, c.coturn),
			CPURatio: c.ratio, CPURatioOfMedians: c.ratio}
		rep.Options.Bytes, rep.Options.Message = 100_000_000, 16384
		rows := webrtcRows(webrtcResults{rep: rep})
		if len(rows) != 2 {
			t.Fatalf("%d rows", len(rows))
		}
		if got := strings.HasSuffix(rows[0].Goal, "— met"); got != c.cpuMet {
			t.Errorf("ratio %v: goal %q", c.ratio, rows[0].Goal)
		}
		if got := strings.HasSuffix(rows[1].Goal, "— met"); got != c.dropsMet {
			t.Errorf("drops %d vs %d: goal %q", c.ours, c.coturn, rows[1].Goal)
		}
		if !strings.HasPrefix(rows[0].Ours, "8.00 ms (25.0 MB/s") {
			t.Errorf("ours cell %q", rows[0].Ours)
		}
	}
}
