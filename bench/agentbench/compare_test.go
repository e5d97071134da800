package agentbench

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestCompareSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress strings.Builder
	rep, err := Compare(ctx, Options{
		Rounds: 3, Frames: 40_000, Clients: 2, PayloadSize: 300, LatencyTime: 200 * time.Millisecond, LatencyRounds: 1,
		DataDir: t.TempDir(), Progress: &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Logf("\n%s", progress.String())
	for _, s := range []Side{rep.Ours, rep.Baseline} {
		for _, d := range []Direction{s.ToClient, s.ToInstance} {
			if len(d.FramesPerSec) != 2 || d.Median <= 0 || d.MedianPerCPU <= 0 || d.P50 <= 0 || d.P99 < d.P50 || d.LatencyFrames == 0 {
				t.Errorf("implausible %s side: %+v", s.Name, d)
			}
		}
	}
	if rep.RatioToClient <= 0 || rep.RatioToInstance <= 0 || rep.Elapsed <= 0 {
		t.Errorf("report %+v", rep)
	}
}

func TestCompareRejectsOneRound(t *testing.T) {
	if _, err := Compare(context.Background(), Options{Rounds: 1}); err == nil {
		t.Fatal("no error for a single round")
	}
}

// BenchmarkRouting runs b.N frames in each direction through each relay
// with the load generator. ns/op covers the whole process; allocs/op is
// process-wide (the generator allocates next to nothing); frames/s and
// frames/CPU-s come from the run itself. Compare is the better instrument
// for the ratio: it alternates the two relays.
func BenchmarkRouting(b *testing.B) {
	ts, err := newTLS(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"ours", "baseline"} {
		for _, dir := range []string{toClient, toInstance} {
			b.Run(name+"/"+strings.ReplaceAll(dir, " ", "-"), func(b *testing.B) {
				var t *target
				if name == "ours" {
					t, err = startOurs(b.TempDir(), ts)
				} else {
					t, err = startBaseline(ts)
				}
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				r, err := setUp(ctx, t, 4)
				if err != nil {
					b.Fatal(err)
				}
				defer func() {
					r.close()
					if err := t.close(); err != nil {
						b.Error(err)
					}
				}()
				run := runToClient
				if dir == toInstance {
					run = runToInstance
				}
				frames := max(b.N, batch*4)
				b.ReportAllocs()
				b.ResetTimer()
				s, err := run(ctx, r, frames, 1024)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(s.perSec(), "frames/s")
				b.ReportMetric(s.perCPUSec(), "frames/CPU-s")
			})
		}
	}
}
