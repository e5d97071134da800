package signalbench

import (
	"fmt"
	"testing"
	"time"

	"edgerelay/fastpath/alloctest"
)

// oursPair starts our relay in this process and opens one rendezvous on
// it with raw clients; both stop when tb ends.
func oursPair(tb testing.TB) *pair {
	tb.Helper()
	r, err := StartOurs(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	pairs, err := openPairs(r.Addr, 1)
	if err != nil {
		_ = r.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := closePairs(pairs); err != nil {
			tb.Error(err)
		}
		if err := r.Close(); err != nil {
			tb.Error(err)
		}
	})
	return pairs[0]
}

// TestSignalForwardingAllocatesNothing proves the design's hot-path
// promise for signal frames: once a rendezvous is open and its buffers
// have grown, forwarding a frame allocates nothing anywhere in the
// process. The relay is the real one (fasthttp and fastpath/server, the
// mailbox handler with its bucket take and step clock, our ws package,
// detached sockets); both clients are raw TCP sockets writing pre-built
// masked frames and reading into fixed buffers, so they allocate nothing
// themselves, and testing.AllocsPerRun counts every malloc in the
// process, the relay's reader and writer goroutines included.
func TestSignalForwardingAllocatesNothing(t *testing.T) {
	p := oursPair(t)
	for _, size := range []int{256, 4096, 64 << 10} {
		t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) {
			f := newFrames(size)
			buf := make([]byte, size)
			deadline := time.Now().Add(60 * time.Second)
			_ = p.primary.nc.SetDeadline(deadline)
			_ = p.companion.nc.SetDeadline(deadline)
			// Warm-up: the relay's read buffers and send queues grow to
			// this size in the first 100.
			count := alloctest.Measure(t, 100, 1000, func() error { return p.roundTrip(&f, buf) })
			avg := count.PerRun
			t.Logf("%v allocations per round trip (two forwarded frames); %d mallocs in %d more round trips",
				avg, count.Mallocs, count.Runs)
			if raceEnabled {
				t.Skip("allocation counts are not meaningful under -race; the zero is asserted by runs without it")
			}
			if avg != 0 {
				t.Errorf("signal forwarding allocates %v times per round trip of two frames, want 0", avg)
			}
		})
	}
}

// BenchmarkSignalRoundTrip is one primary → relay → companion → relay →
// primary round trip on our relay with the raw clients: allocs/op is the
// relay's allocations per two forwarded frames (the clients allocate
// nothing), ns/op close to the relay's cost per frame pair with one frame
// in flight.
func BenchmarkSignalRoundTrip(b *testing.B) {
	for _, size := range []int{256, 4096} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			p := oursPair(b)
			f := newFrames(size)
			buf := make([]byte, size)
			deadline := time.Now().Add(10 * time.Minute)
			_ = p.primary.nc.SetDeadline(deadline)
			_ = p.companion.nc.SetDeadline(deadline)
			for range 100 {
				if err := p.roundTrip(&f, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(2 * size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := p.roundTrip(&f, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}
