package bucket

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// t0 is an arbitrary, realistic unix-nanos start time.
const t0 = int64(1_750_000_000_000_000_000)

// limits are the per-mailbox limits the relay uses.
var limits = []Config{
	{Burst: 120, Interval: time.Second / 2},
	{Burst: 240, Interval: time.Second / 4},
	{Burst: 20, Interval: 5 * time.Second},
	{Burst: 400, Interval: time.Second / 50},
	{Burst: 20, Interval: 2 * time.Second},
	{Burst: 10, Interval: time.Minute},
	{Burst: 6, Interval: 30 * time.Second},
	{Burst: 1, Interval: time.Second},
}

func mustSet(t testing.TB, cfg Config) *Set {
	t.Helper()
	s, err := NewSet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// drain takes until refused and returns how many succeeded and the refusal's
// retryAfter. It gives up after limit successes.
func drain(t *testing.T, s *Set, key uint64, now int64, limit int) (int, time.Duration) {
	t.Helper()
	for n := 0; n <= limit; n++ {
		if ok, retry := s.Take(key, now); !ok {
			if retry <= 0 {
				t.Fatalf("refused with retryAfter %v, want > 0", retry)
			}
			return n, retry
		} else if retry != 0 {
			t.Fatalf("admitted with retryAfter %v, want 0", retry)
		}
	}
	return limit + 1, 0
}

func TestExactAdmission(t *testing.T) {
	for _, cfg := range limits {
		t.Run(fmt.Sprintf("%d per %v", cfg.Burst, cfg.Interval), func(t *testing.T) {
			s := mustSet(t, cfg)
			const key = 42
			iv := cfg.Interval

			// A fresh key has exactly Burst tokens; the next must wait one Interval.
			if n, retry := drain(t, s, key, t0, cfg.Burst); n != cfg.Burst || retry != iv {
				t.Fatalf("fresh: %d takes, retry %v; want %d, %v", n, retry, cfg.Burst, iv)
			}
			// Part way through an Interval: still empty, retry is the remainder.
			if ok, retry := s.Take(key, t0+int64(iv)/3); ok || retry != iv-iv/3 {
				t.Fatalf("after Interval/3: ok=%v retry=%v, want false %v", ok, retry, iv-iv/3)
			}
			// Each Interval gives back exactly one token.
			now := t0
			for i := 0; i < 3; i++ {
				now += int64(iv)
				if n, retry := drain(t, s, key, now, cfg.Burst); n != 1 || retry != iv {
					t.Fatalf("refill %d: %d takes, retry %v; want 1, %v", i, n, retry, iv)
				}
			}
			// A long idle refills to Burst, never more.
			now += 100 * int64(cfg.Burst) * int64(iv)
			if n, retry := drain(t, s, key, now, cfg.Burst); n != cfg.Burst || retry != iv {
				t.Fatalf("after idle: %d takes, retry %v; want %d, %v", n, retry, cfg.Burst, iv)
			}
			// Other keys are independent.
			if n, _ := drain(t, s, key+1, now, cfg.Burst); n != cfg.Burst {
				t.Fatalf("second key: %d takes, want %d", n, cfg.Burst)
			}
		})
	}
}

func TestRetryAfterIsEnough(t *testing.T) {
	s := mustSet(t, Config{Burst: 3, Interval: 7 * time.Millisecond})
	now := t0
	for i := 0; i < 3; i++ {
		s.Take(1, now)
		now += int64(time.Millisecond)
	}
	ok, retry := s.Take(1, now)
	if ok {
		t.Fatal("expected refusal")
	}
	if ok, _ := s.Take(1, now+int64(retry)-1); ok {
		t.Fatal("admitted 1ns before retryAfter")
	}
	if ok, _ := s.Take(1, now+int64(retry)); !ok {
		t.Fatal("refused at retryAfter")
	}
}

func TestTakeBytes(t *testing.T) {
	s := mustSet(t, Config{Burst: 2, Interval: time.Second})
	a, b := []byte("mailbox-a"), []byte("mailbox-b")
	for i := 0; i < 2; i++ {
		if ok, _ := s.TakeBytes(a, t0); !ok {
			t.Fatal("refused within burst")
		}
	}
	if ok, _ := s.TakeBytes(a, t0); ok {
		t.Fatal("admitted past burst")
	}
	if ok, _ := s.TakeBytes(b, t0); !ok {
		t.Fatal("other key refused")
	}
	if ok, _ := s.Take(s.Key(a), t0); ok {
		t.Fatal("Take(Key(a)) should share a's bucket")
	}
	s.ResetBytes(a)
	if ok, _ := s.TakeBytes(a, t0); !ok {
		t.Fatal("refused after ResetBytes")
	}
}

func TestReset(t *testing.T) {
	s := mustSet(t, Config{Burst: 5, Interval: time.Second})
	drain(t, s, 9, t0, 5)
	s.Reset(9)
	s.Reset(10) // absent: no-op
	if s.Len() != 0 {
		t.Fatalf("Len after Reset = %d, want 0", s.Len())
	}
	if n, _ := drain(t, s, 9, t0, 5); n != 5 {
		t.Fatalf("after Reset: %d takes, want 5", n)
	}
}

func TestSweepEvictsOnlyIdleAndFull(t *testing.T) {
	iv := time.Second
	s := mustSet(t, Config{Burst: 4, Interval: iv, IdleAfter: 10 * iv})
	const (
		busy  = 1 // drained at t0: full only at t0+4s
		idle  = 2 // one take at t0: full at t0+1s
		fresh = 3 // created later
	)
	drain(t, s, busy, t0, 4)
	s.Take(idle, t0)
	s.Take(fresh, t0+int64(5*iv))

	// idle has been full since t0+1s; 1ns short of IdleAfter it stays.
	if n := s.Sweep(t0 + int64(11*iv) - 1); n != 0 {
		t.Fatalf("early sweep evicted %d", n)
	}
	if n := s.Sweep(t0 + int64(11*iv)); n != 1 || s.Len() != 2 {
		t.Fatalf("sweep evicted %d, Len %d; want 1, 2", n, s.Len())
	}
	// busy is full from t0+4s, fresh from t0+6s.
	if n := s.Sweep(t0 + int64(14*iv)); n != 1 || s.Len() != 1 {
		t.Fatalf("sweep evicted %d, Len %d; want 1, 2", n, s.Len())
	}
	if n := s.Sweep(t0 + int64(16*iv)); n != 1 || s.Len() != 0 {
		t.Fatalf("sweep evicted %d, Len %d; want 1, 0", n, s.Len())
	}
	if c := s.capacity(); c != 0 {
		t.Fatalf("capacity %d after evicting everything, want 0", c)
	}
	// An evicted key comes back as a full bucket, exactly as if it had stayed.
	if n, _ := drain(t, s, idle, t0+int64(16*iv), 4); n != 4 {
		t.Fatalf("evicted key: %d takes, want 4", n)
	}
}

func TestSweepKeepsPartialBuckets(t *testing.T) {
	// A bucket that is not full must survive any number of sweeps, however
	// long ago it was touched by the sweeper's clock, until it refills.
	s := mustSet(t, Config{Burst: 10, Interval: time.Minute, IdleAfter: time.Nanosecond})
	drain(t, s, 7, t0, 10)
	for i := 0; i < 10; i++ {
		if n := s.Sweep(t0 + int64(i)*int64(time.Minute)); n != 0 {
			t.Fatalf("sweep %d evicted a partial bucket", i)
		}
	}
	if ok, _ := s.Take(7, t0+int64(time.Minute)-1); ok {
		t.Fatal("partial bucket lost its state")
	}
}

func TestChurnBoundedMemory(t *testing.T) {
	keys := 1_000_000
	if testing.Short() || raceEnabled {
		keys = 200_000
	}
	// 1000 new keys per ms, each taking once; a bucket is full 1ms after its
	// take and evictable 20ms (Burst*Interval) later. Sweeping every 10ms
	// leaves at most ~31ms of keys.
	s := mustSet(t, Config{Burst: 20, Interval: time.Millisecond})
	const perMs, sweepEvery = 1000, 10_000
	maxLen, maxCap := 0, 0
	var now int64
	for i := 0; i < keys; i++ {
		now = t0 + int64(i)*int64(time.Millisecond)/perMs
		if ok, _ := s.Take(uint64(i), now); !ok {
			t.Fatalf("fresh key %d refused", i)
		}
		if i%sweepEvery == sweepEvery-1 {
			maxLen = max(maxLen, s.Len())
			maxCap = max(maxCap, s.capacity())
			s.Sweep(now)
		}
	}
	t.Logf("max Len %d, max capacity %d slots", maxLen, maxCap)
	if bound := 32 * perMs; maxLen > bound {
		t.Fatalf("Len reached %d, want <= %d", maxLen, bound)
	}
	if bound := 16 * 32 * perMs; maxCap > bound {
		t.Fatalf("capacity reached %d slots, want <= %d", maxCap, bound)
	}
	s.Sweep(now + int64(time.Hour))
	if s.Len() != 0 || s.capacity() != 0 {
		t.Fatalf("after final sweep Len %d capacity %d, want 0, 0", s.Len(), s.capacity())
	}
}

func TestConcurrentExact(t *testing.T) {
	const goroutines, tries, burst = 64, 100, 1000
	s := mustSet(t, Config{Burst: burst, Interval: time.Second})
	for round := 0; round < 5; round++ {
		key := uint64(round) // fresh key: creation races too
		var wins atomic.Int64
		var start, wg sync.WaitGroup
		start.Add(1)
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				for i := 0; i < tries; i++ {
					if ok, _ := s.Take(key, t0); ok {
						wins.Add(1)
					}
				}
			}()
		}
		start.Done()
		wg.Wait()
		if got := wins.Load(); got != burst {
			t.Fatalf("round %d: %d successes, want exactly %d", round, got, burst)
		}
	}
	if s.Len() != 5 {
		t.Fatalf("Len = %d, want 5 (one bucket per key)", s.Len())
	}
}

func TestConcurrentManyKeysWithSweep(t *testing.T) {
	// Goroutines race over many keys (forcing inserts and table rebuilds)
	// while a sweeper evicts at the same clock. In each round every key is
	// either absent or full-and-idle, so each must admit exactly Burst, and
	// whether the sweeper or a taker gets to a bucket first must not matter.
	const goroutines, keys, burst, rounds = 16, 4096, 4, 6
	iv := time.Second
	s := mustSet(t, Config{Burst: burst, Interval: iv, Shards: 4, IdleAfter: time.Nanosecond})
	totalEvicted := 0
	for round := 0; round < rounds; round++ {
		now := t0 + int64(round)*int64(time.Hour)
		wins := make([]atomic.Int64, keys)
		var start, wg sync.WaitGroup
		start.Add(1)
		stop := make(chan struct{})
		swept := make(chan int)
		go func() {
			start.Wait()
			n := 0
			for {
				n += s.Sweep(now)
				select {
				case <-stop:
					swept <- n
					return
				default:
				}
			}
		}()
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				start.Wait()
				for i := 0; i < keys*(burst+1)/goroutines*2; i++ {
					k := (i*7 + g*131) % keys
					if ok, _ := s.Take(uint64(k), now); ok {
						wins[k].Add(1)
					}
				}
			}(g)
		}
		start.Done()
		wg.Wait()
		close(stop)
		totalEvicted += <-swept
		for k := range wins {
			if got := wins[k].Load(); got > burst {
				t.Fatalf("round %d key %d: %d successes, want %d", round, k, got, burst)
			}
		}
		// Top up keys the takers did not reach often enough, so every key
		// is known to be exactly drained.
		for k := range wins {
			n, _ := drain(t, s, uint64(k), now, burst)
			if got := wins[k].Load() + int64(n); got != burst {
				t.Fatalf("round %d key %d: %d successes in total, want %d", round, k, got, burst)
			}
		}
	}
	t.Logf("sweeper evicted %d buckets while racing", totalEvicted)
}

// TestStaleReaders replays, deterministically, what a lock-free Take can
// observe mid-flight: a table that has since been rebuilt, and a bucket that
// has since been evicted.
func TestStaleReaders(t *testing.T) {
	s := mustSet(t, Config{Burst: 3, Interval: time.Second, Shards: 1, IdleAfter: time.Second})
	const key = 5
	h := s.hash(key) >> s.shardBits
	sh := &s.shards[0]
	s.Take(key, t0)
	oldTab, b := sh.tab.Load(), s.find(sh.tab.Load(), key, h)

	// Grow the table: a reader still holding oldTab shares the live bucket.
	for k := uint64(100); k < 200; k++ {
		s.Take(k, t0)
	}
	if sh.tab.Load() == oldTab || s.find(oldTab, key, h) != b {
		t.Fatal("expected a rebuilt table sharing the old bucket")
	}
	if ok, _, alive := s.take(b, t0); !ok || !alive {
		t.Fatal("take via stale table failed")
	}
	if n, _ := drain(t, s, key, t0, 3); n != 1 {
		t.Fatalf("%d takes left after two, want 1: stale-table take was lost", n)
	}

	// Evict it: the stale pointer reports dead, so Take would retry under
	// the lock and find a fresh bucket, which is full like the evicted one.
	if s.Sweep(t0+int64(4*time.Second)) == 0 {
		t.Fatal("nothing evicted")
	}
	if _, _, alive := s.take(b, t0); alive {
		t.Fatal("evicted bucket still alive")
	}
	if n, _ := drain(t, s, key, t0+int64(4*time.Second), 3); n != 3 {
		t.Fatalf("after eviction %d takes, want 3", n)
	}
}

func TestZeroAllocs(t *testing.T) {
	s := mustSet(t, Config{Burst: 400, Interval: time.Second / 50})
	name := []byte("mailbox")
	s.Take(1, t0)
	s.TakeBytes(name, t0)
	now := t0
	cases := map[string]func(){
		"Take admitted":  func() { now += int64(time.Second); s.Take(1, now) },
		"Take refused":   func() { s.Take(2, t0) },
		"TakeBytes":      func() { now += int64(time.Second); s.TakeBytes(name, now) },
		"TakeBytes miss": func() { s.TakeBytes(name, t0) },
	}
	drain(t, s, 2, t0, 400)
	for name, f := range cases {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, a)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	ok := Config{Burst: 1, Interval: time.Second}
	bad := map[string]Config{
		"zero burst":        {Interval: time.Second},
		"negative burst":    {Burst: -1, Interval: time.Second},
		"zero interval":     {Burst: 1},
		"negative interval": {Burst: 1, Interval: -time.Second},
		"overflow":          {Burst: 1 << 40, Interval: time.Hour},
		"shards not pow2":   {Burst: 1, Interval: time.Second, Shards: 3},
		"negative shards":   {Burst: 1, Interval: time.Second, Shards: -4},
		"too many shards":   {Burst: 1, Interval: time.Second, Shards: 1 << 20},
		"negative idle":     {Burst: 1, Interval: time.Second, IdleAfter: -1},
	}
	for name, cfg := range bad {
		if _, err := NewSet(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, shards := range []int{0, 1, 2, 64, 1 << 16} {
		cfg := ok
		cfg.Shards = shards
		if _, err := NewSet(cfg); err != nil {
			t.Errorf("Shards %d: %v", shards, err)
		}
	}
}
