package channelbench

import (
	"context"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/channelload"
)

func TestCompareSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress strings.Builder
	rep, err := Compare(ctx, CompareOptions{
		Rounds: 3, Frames: 400, Phones: 2, FrameSize: 300,
		DataDir: t.TempDir(), Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ours %.0f frames/CPU-s, baseline %.0f frames/CPU-s, ratio %.2f, pinned %v\n%s",
		rep.Ours.MedianPerCPU, rep.Baseline.MedianPerCPU, rep.Ratio, rep.Pinned, progress.String())
	for _, s := range []Side{rep.Ours, rep.Baseline} {
		// Three rounds, the first dropped. CPU time is the relay process's
		// alone, read to the microsecond; allocations are its own (the
		// claim and dials of each run at least).
		if len(s.FramesPerSec) != 2 || len(s.PerCPUSec) != 2 || s.Median <= 0 || s.MedianPerCPU <= 0 ||
			s.P50 <= 0 || s.P99 < s.P50 || s.AllocsPerFrame <= 0 || s.CoreUse <= 0 {
			t.Errorf("implausible %s side: %+v", s.Name, s)
		}
	}
	if rep.Ratio != rep.Ours.MedianPerCPU/rep.Baseline.MedianPerCPU || rep.RoundRatio <= 0 || len(rep.RoundRatios) != 2 ||
		rep.WallRatio <= 0 || rep.Elapsed <= 0 {
		t.Errorf("report %+v", rep)
	}
	if got := strings.Count(progress.String(), "\n"); got != 6 {
		t.Errorf("%d progress lines, want 6", got)
	}
}

func TestCompareRejectsOneRound(t *testing.T) {
	if _, err := Compare(context.Background(), CompareOptions{Rounds: 1}); err == nil {
		t.Fatal("no error for a single round")
	}
}

// BenchmarkForwarding runs b.N round trips of 1 KiB frames over 4 phones
// through each relay. ns/op and allocs/op cover the whole process (relay
// and load generator, claim and dials amortised over b.N); frames/s comes
// from the load generator and covers the forwarding alone. Compare is the
// better instrument for the ratio: it alternates the two relays.
func BenchmarkForwarding(b *testing.B) {
	for _, name := range []string{"ours", "baseline"} {
		b.Run(name, func(b *testing.B) {
			var r *relay
			var err error
			if name == "ours" {
				r, err = startOurs(b.TempDir())
			} else {
				r, err = startBaseline()
			}
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := r.close(); err != nil {
					b.Error(err)
				}
			}()
			key, err := r.newKey()
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			b.SetBytes(2 * 1024)
			b.ReportAllocs()
			b.ResetTimer()
			res, err := channelload.Run(ctx, channelload.Options{
				Origin: r.origin, ClaimKey: key, Phones: 4, FrameSize: 1024, Frames: b.N,
			})
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(res.FramesPerSec, "frames/s")
			b.ReportMetric(float64(res.P50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(res.P99.Microseconds()), "p99-µs")
		})
	}
}
