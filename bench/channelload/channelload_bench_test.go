package channelload

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkBaselineForwarding runs b.N round trips through the baseline relay on
// loopback. ns/op and allocs/op cover the whole process, relay and load generator
// together, claim and dialling included (amortised over b.N); frames/s and the
// latencies come from Run and cover the forwarding alone.
func BenchmarkBaselineForwarding(b *testing.B) {
	for _, bc := range []struct{ phones, size int }{
		{1, 256},
		{4, 256},
		{32, 256},
		{4, 16 << 10},
	} {
		b.Run(fmt.Sprintf("phones=%d/size=%d", bc.phones, bc.size), func(b *testing.B) {
			key := NewToken()
			srv := baseline(b, key)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			res, err := Run(ctx, Options{
				Origin:    srv.URL,
				ClaimKey:  key,
				Phones:    bc.phones,
				FrameSize: bc.size,
				Frames:    b.N,
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
