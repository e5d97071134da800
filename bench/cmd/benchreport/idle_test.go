package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/idlebench"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/netlimit"
)

// TestIdleRows: a memory row per figure judged on the parked median
// against 3 KiB plain and 6 KiB TLS, a capped run says so in the figure,
// the wake row on the added p99, the storm row on Check; a failure is a
// failed row.
func TestIdleRows(t *testing.T) {
	round := func(perSocket float64, parked int) idlebench.IdleRound {
		return idlebench.IdleRound{IdleCost: serverproc.IdleCost{Sockets: 100_000, PerSocket: perSocket}, Held: 100_000, Parked: parked}
	}
	fig := func(kind idlebench.Kind, tls bool, parked float64) idlebench.MemoryFigure {
		goal, text := 3072.0, "≤ 3 KiB per socket"
		if tls {
			goal, text = 6144, "≤ 6 KiB per socket"
		}
		return idlebench.MemoryFigure{Kind: kind, TLS: tls, Parked: []idlebench.IdleRound{round(parked, 100_000)},
			Unparked: []idlebench.IdleRound{round(9000, 0)}, ParkedMedian: parked, UnparkedMedian: 9000, Ratio: parked / 9000,
			GoalBytes: goal, GoalText: text}
	}
	r := idleResults{
		memory: idlebench.MemoryReport{Options: idlebench.MemoryOptions{Sockets: 18_000}, Requested: 100_000, FileLimit: 20_000, Capped: true,
			Figures: []idlebench.MemoryFigure{fig(idlebench.Watch, false, 3072), fig(idlebench.Watch, false, 3073),
				fig(idlebench.Phone, true, 6144), fig(idlebench.Phone, true, 6145)}},
		wake: idlebench.WakeReport{Options: idlebench.WakeOptions{Sockets: 1000, Deliveries: 3000},
			Parked: []idlebench.WakeRound{{}}, AddedP99: 99 * time.Microsecond},
	}
	o := idlebench.StormOptions{Sockets: 1000, Limits: netlimit.Limits{MaxConns: 2000, MaxConnsPerIP: 1000, AcceptRate: 100, AcceptBurst: 500}}
	r.storm = idlebench.StormReport{Options: o,
		Parked:   []idlebench.StormRound{{Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1300, Refused: idlebench.Refusals{Rate: 300}}},
		Unparked: []idlebench.StormRound{{Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1301, Refused: idlebench.Refusals{Rate: 300, Total: 1}}}}
	rows := idleRows(r)
	if len(rows) != 7 {
		t.Fatalf("%d rows: %+v", len(rows), rows)
	}
	for i, met := range []bool{true, false, true, false} {
		if got := strings.HasSuffix(rows[i].Goal, "— met"); got != met {
			t.Errorf("memory row %d: goal %q", i, rows[i].Goal)
		}
		if !strings.Contains(rows[i].Figure, "CAPPED from 100,000") || !strings.Contains(rows[i].Figure, "18,000 open") {
			t.Errorf("memory row %d does not say it was capped: %q", i, rows[i].Figure)
		}
	}
	if !strings.Contains(rows[2].Goal, "≤ 6 KiB") || !strings.Contains(rows[0].Goal, "≤ 3 KiB") {
		t.Errorf("goals %q, %q", rows[0].Goal, rows[2].Goal)
	}
	if !strings.HasSuffix(rows[4].Goal, "— met") {
		t.Errorf("wake: 99 µs added: %q", rows[4].Goal)
	}
	if !strings.Contains(rows[5].Figure, "ping") || strings.Contains(rows[5].Goal, "met") {
		t.Errorf("ping row %+v", rows[5])
	}
	if strings.Contains(rows[6].Goal, "— met") || !strings.Contains(rows[6].Goal, "beyond the accept rate") {
		t.Errorf("storm with a refusal for the total: %q", rows[6].Goal)
	}

	// The second pass (at 100,000, capped) adds its own memory rows.
	r.largeRun, r.large = true, r.memory
	if rows := idleRows(r); len(rows) != 11 {
		t.Errorf("with the large pass: %d rows, want 11", len(rows))
	}
	r.largeRun = false
	r.wake.AddedP99 = 100 * time.Microsecond
	if rows := idleRows(r); strings.HasSuffix(rows[4].Goal, "— met") {
		t.Errorf("wake: 100 µs added: %q", rows[4].Goal)
	}
	failed := idleRows(idleResults{memErr: errors.New("boom"), wakeErr: errors.New("boom"), stormErr: errors.New("boom")})
	if len(failed) != 3 {
		t.Fatalf("failures: %+v", failed)
	}
	for _, f := range failed {
		if f.Ours != "failed" {
			t.Errorf("failed row %+v", f)
		}
	}
}
