package bucket

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// The benchmarks use the 400/s-burst, 50/s-refill limit and advance a
// synthetic clock by one Interval per take, so every take is admitted: the
// CAS path here, the full update path in x/time/rate. The clock is
// synthetic so both sides pay the same (nothing) for reading time.
//
// Shapes:
//   - single: one goroutine, one key.
//   - single-parallel: all Ps take from one key, each take admitted. Every
//     admission must write the key's one cache line (that is what makes it
//     exact), and the shared clock is a second contended line; this is the
//     worst case for a CAS loop, and Go's mutex can beat it by parking the
//     loser so the winner runs a batch with both lines local.
//   - single-parallel-saturated: all Ps hammer one empty key at a fixed
//     time (a flooding mailbox): every take is refused.
//   - many-parallel: each P cycles over its own keysPerP keys, all of them
//     created before the timer starts (steady state for a busy relay).

const (
	benchBurst    = 400
	benchInterval = time.Second / 50
	keysPerP      = 4096
)

func benchSet(b *testing.B) *Set {
	s, err := NewSet(Config{Burst: benchBurst, Interval: benchInterval})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchKey(p, i int) uint64 { return uint64(p)<<32 | uint64(i%keysPerP) }

func BenchmarkSetTake(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		s := benchSet(b)
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now += int64(benchInterval)
			if ok, _ := s.Take(1, now); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("single-parallel", func(b *testing.B) {
		s := benchSet(b)
		var clock atomic.Int64
		clock.Store(t0)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				// Admission depends on contention here; the cost is the point.
				s.Take(1, clock.Add(int64(benchInterval)))
			}
		})
	})
	b.Run("single-parallel-saturated", func(b *testing.B) {
		s := benchSet(b)
		for i := 0; i < benchBurst; i++ {
			s.Take(1, t0)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if ok, _ := s.Take(1, t0); ok {
					b.Error("admitted")
					return
				}
			}
		})
	})
	b.Run("many-parallel", func(b *testing.B) {
		s := benchSet(b)
		procs := runtime.GOMAXPROCS(0)
		for p := 0; p < procs; p++ {
			for i := 0; i < keysPerP; i++ {
				s.Take(benchKey(p, i), t0)
			}
		}
		var nextP atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			p := int(nextP.Add(1) - 1)
			now := t0
			for i := 0; pb.Next(); i++ {
				now += int64(benchInterval)
				if ok, _ := s.Take(benchKey(p, i), now); !ok {
					b.Error("refused")
					return
				}
			}
		})
	})
}

// BenchmarkXRate is the baseline: the same shapes with one *rate.Limiter
// per key, found in a mutex-guarded map for the many-keys shape.
func BenchmarkXRate(b *testing.B) {
	newLimiter := func() *rate.Limiter { return rate.NewLimiter(rate.Every(benchInterval), benchBurst) }
	b.Run("single", func(b *testing.B) {
		l := newLimiter()
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now += int64(benchInterval)
			if !l.AllowN(time.Unix(0, now), 1) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("single-parallel", func(b *testing.B) {
		l := newLimiter()
		var clock atomic.Int64
		clock.Store(t0)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.AllowN(time.Unix(0, clock.Add(int64(benchInterval))), 1)
			}
		})
	})
	b.Run("single-parallel-saturated", func(b *testing.B) {
		l := newLimiter()
		at := time.Unix(0, t0)
		l.AllowN(at, benchBurst)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if l.AllowN(at, 1) {
					b.Error("admitted")
					return
				}
			}
		})
	})
	b.Run("many-parallel", func(b *testing.B) {
		var mu sync.Mutex
		m := make(map[uint64]*rate.Limiter)
		procs := runtime.GOMAXPROCS(0)
		for p := 0; p < procs; p++ {
			for i := 0; i < keysPerP; i++ {
				m[benchKey(p, i)] = newLimiter()
			}
		}
		var nextP atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			p := int(nextP.Add(1) - 1)
			now := t0
			for i := 0; pb.Next(); i++ {
				now += int64(benchInterval)
				mu.Lock()
				l := m[benchKey(p, i)]
				mu.Unlock()
				if !l.AllowN(time.Unix(0, now), 1) {
					b.Error("refused")
					return
				}
			}
		})
	})
}
