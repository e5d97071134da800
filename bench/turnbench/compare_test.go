package turnbench

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestCompareSmoke runs one short round of each server at one payload:
// the comparison's plumbing (building and pinning turnserve, starting
// coturn, the load generator, CPU and malloc accounting) works end to end.
// The figures of so short a run mean nothing; `make bench` takes them.
func TestCompareSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Compare(ctx, Options{
		Rounds:   2,
		Payloads: []int{120},
		Duration: 300 * time.Millisecond,
		Progress: os.Stderr,
	})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	if len(rep.Results) != 1 {
		t.Fatalf("%d results, want 1", len(rep.Results))
	}
	r := rep.Results[0]
	for _, s := range []Side{r.Ours, r.Coturn} {
		if len(s.Runs) != 1 || s.PerSec <= 0 || s.PerCoreSec <= 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	if r.Ours.AllocsPerPacket < 0 {
		t.Errorf("ours: no allocations per packet")
	}
	if r.Ratio <= 0 {
		t.Errorf("ratio %v", r.Ratio)
	}
	t.Logf("smoke: ours %.0f pkt/core-s, coturn %.0f, ratio %.2f; %.3f allocs/packet",
		r.Ours.PerCoreSec, r.Coturn.PerCoreSec, r.Ratio, r.Ours.AllocsPerPacket)
}
