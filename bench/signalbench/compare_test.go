package signalbench

import (
	"context"
	"os"
	"testing"
	"time"
)

// Both relays carry the load's exchange, the stop frame included, at
// both sizes and with a window: neither is measured doing less than the
// other.
func TestLoadOnBothRelays(t *testing.T) {
	relays := []func() (*Relay, error){func() (*Relay, error) { return StartOurs(t.TempDir()) }, StartBaseline}
	for _, start := range relays {
		r, err := start()
		if err != nil {
			t.Fatal(err)
		}
		pairs, err := openPairs(r.Addr, 4)
		if err != nil {
			_ = r.Close()
			t.Fatal(err)
		}
		for _, size := range []int{256, 4096} {
			f := newFrames(size)
			res, err := runLoad(context.Background(), pairs, &f, 4, 100*time.Millisecond)
			if err != nil {
				t.Fatalf("%s, %d B: %v", r.Name, size, err)
			}
			// Every pair's window and its stop frame came back at least.
			if min := uint64(2 * 4 * 5); res.Frames < min {
				t.Errorf("%s, %d B: %d frames forwarded, want at least %d", r.Name, size, res.Frames, min)
			}
			t.Logf("%s, %d B: %d frames in %v", r.Name, size, res.Frames, res.Elapsed)
		}
		if err := closePairs(pairs); err != nil {
			t.Error(err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("%s: close: %v", r.Name, err)
		}
	}
}

// A relay that stops forwarding fails the round instead of hanging it
// (here: the relay's process is gone).
func TestLoadFailsWhenTheRelayStops(t *testing.T) {
	r, err := StartBaseline()
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := openPairs(r.Addr, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closePairs(pairs)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	f := newFrames(256)
	if _, err := runLoad(context.Background(), pairs, &f, 2, 50*time.Millisecond); err == nil {
		t.Fatal("a round on a closed relay succeeded")
	}
}

// TestCompareSmoke runs one short counted round of each relay at one
// size: the comparison's plumbing (building and pinning signalserve, its
// stats, the load, the summaries) works end to end. The figures of so
// short a run mean nothing; `make bench` takes them.
func TestCompareSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts two relay processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Compare(ctx, Options{Rounds: 2, RoundTime: 200 * time.Millisecond, Loads: []Load{{512, 2}}, Pairs: 4, Progress: os.Stderr})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Load != (Load{512, 2}) {
		t.Fatalf("results %+v", rep.Results)
	}
	r := rep.Results[0]
	for _, s := range []Side{r.Ours, r.Baseline} {
		if len(s.Runs) != 1 || s.PerSec <= 0 || s.PerCoreSec <= 0 || s.Runs[0].Mallocs == 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	// The baseline allocates per frame (gorilla's ReadMessage returns a
	// fresh slice for each): a count that misses that is broken.
	if r.Baseline.AllocsPerFrame < 1 {
		t.Errorf("baseline: %.3f allocs/frame, want at least 1", r.Baseline.AllocsPerFrame)
	}
	if r.Ratio <= 0 || r.RoundRatio <= 0 {
		t.Errorf("ratios %v %v", r.Ratio, r.RoundRatio)
	}
	t.Logf("smoke: ours %.0f frames/core-s, baseline %.0f, ratio %.2f; %.3f vs %.3f allocs/frame",
		r.Ours.PerCoreSec, r.Baseline.PerCoreSec, r.Ratio, r.Ours.AllocsPerFrame, r.Baseline.AllocsPerFrame)
}
