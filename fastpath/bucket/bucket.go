// Package bucket implements per-key token buckets for the relay's hot path
// (per-mailbox rate limits), sharded by key hash.
//
// # Algorithm
//
// Each bucket is GCRA (the generic cell rate algorithm): its whole state is
// one int64, the theoretical arrival time (tat), the instant at which the
// bucket will be full again. A Take at now succeeds iff
//
//	max(tat, now) - now <= (Burst-1)*Interval
//
// and then advances tat by Interval. That is a single compare-and-swap, so
// admission is exact under any amount of concurrency: with no time passing,
// exactly Burst takes succeed, and a refusal knows precisely when the next
// token arrives.
//
// # Concurrency and memory
//
// Each shard is an open-addressing hash table of *bucket whose slots are
// atomic pointers. Lookups of existing keys take no lock: they load the
// table pointer and probe. Writers (insert of a new key, Reset, Sweep and
// table rebuilds) serialise on a per-shard mutex. Trade-off: a new key pays
// a mutex and one small allocation, and Sweep holds a shard's mutex while it
// scans that shard; in exchange a Take on a known key is lock-free and
// allocation-free, which is the common case for a mailbox that is being rate
// limited at all. A sync.Map would also give lock-free reads, but boxing a
// uint64 key into an interface allocates; a copy-on-write Go map would make
// every insert O(n) under churn.
//
// A bucket is removed by first swapping its tat to a "dead" sentinel (by CAS
// from an observed idle-and-full value, for Sweep) and then replacing its
// slot with a tombstone. A Take racing with the removal either wins the CAS
// first (and the bucket is then no longer idle, so it is not evicted) or sees
// the sentinel and falls back to the locked path, which creates a fresh,
// full bucket. Because only full buckets are evicted, the fresh one is
// indistinguishable from the old one, so no admission is lost or gained.
package bucket

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInvalidConfig is wrapped by every error NewSet returns.
var ErrInvalidConfig = errors.New("invalid bucket config")

const (
	defaultShards = 64
	maxShards     = 1 << 16
	minTableSize  = 8

	// dead is the tat of a bucket that has been evicted or reset. No live
	// bucket can hold it: a tat is always some caller's now (plus intervals).
	dead = math.MinInt64
)

// Config describes one family of rate limits: every key in a Set gets its own
// bucket with the same Burst and Interval.
type Config struct {
	Burst    int           // tokens available to a fresh key; >= 1
	Interval time.Duration // one token is added back every Interval; > 0
	Shards   int           // power of two; 0 = 64
	// IdleAfter is how long a bucket must have been full (so untouched)
	// before Sweep may evict it; 0 = Burst*Interval.
	//
	// Eviction stays exact as long as the now passed to Take lags the now
	// passed to Sweep by at most IdleAfter: such a Take would have seen the
	// evicted bucket as full anyway.
	IdleAfter time.Duration
}

// Set is a collection of token buckets keyed by uint64 (or by bytes, hashed).
// All methods are safe for concurrent use.
type Set struct {
	shards    []shard
	shardMask uint64
	shardBits uint

	interval  int64 // ns per token
	tolerance int64 // (Burst-1)*interval: how far tat may run ahead of now
	idleAfter int64

	hashSeed  uint64       // mixed into uint64 keys so hash flooding needs the seed
	bytesSeed maphash.Seed // for TakeBytes
	tomb      *bucket      // per-Set tombstone marking a deleted slot
}

// bucket is one key's state. key is immutable after publication, so readers
// can match it without synchronisation even while its slot is being reused.
type bucket struct {
	key uint64
	tat atomic.Int64 // unix nanos at which the bucket is full again, or dead
}

// table is an open-addressing (linear probing) hash table. Once published,
// a table only changes by storing into slots; it is replaced wholesale by
// rebuild. It always keeps at least one nil slot so probes terminate.
type table struct {
	slots []atomic.Pointer[bucket]
	mask  uint64
}

type shard struct {
	tab  atomic.Pointer[table] // read lock-free by Take
	mu   sync.Mutex            // serialises every writer of tab and its slots
	used int                   // non-nil slots (live + tombstones); guarded by mu
	live atomic.Int64          // live buckets; written under mu, read by Len
	_    [32]byte              // keep shards on separate cache lines
}

// NewSet validates cfg and returns an empty Set.
func NewSet(cfg Config) (*Set, error) {
	switch {
	case cfg.Burst < 1:
		return nil, fmt.Errorf("bucket: %w: Burst must be >= 1, got %d", ErrInvalidConfig, cfg.Burst)
	case cfg.Interval <= 0:
		return nil, fmt.Errorf("bucket: %w: Interval must be > 0, got %v", ErrInvalidConfig, cfg.Interval)
	case int64(cfg.Interval) > math.MaxInt64/int64(cfg.Burst):
		return nil, fmt.Errorf("bucket: %w: Burst*Interval overflows (%d * %v)", ErrInvalidConfig, cfg.Burst, cfg.Interval)
	case cfg.Shards < 0 || cfg.Shards > maxShards || cfg.Shards&(cfg.Shards-1) != 0:
		return nil, fmt.Errorf("bucket: %w: Shards must be 0 or a power of two <= %d, got %d", ErrInvalidConfig, maxShards, cfg.Shards)
	case cfg.IdleAfter < 0:
		return nil, fmt.Errorf("bucket: %w: IdleAfter must be >= 0, got %v", ErrInvalidConfig, cfg.IdleAfter)
	}
	n := cfg.Shards
	if n == 0 {
		n = defaultShards
	}
	idle := cfg.IdleAfter
	if idle == 0 {
		idle = time.Duration(cfg.Burst) * cfg.Interval
	}
	s := &Set{
		shards:    make([]shard, n),
		shardMask: uint64(n - 1),
		shardBits: uint(bits.TrailingZeros(uint(n))),
		interval:  int64(cfg.Interval),
		tolerance: int64(cfg.Burst-1) * int64(cfg.Interval),
		idleAfter: int64(idle),
		hashSeed:  rand.Uint64(),
		bytesSeed: maphash.MakeSeed(),
		tomb:      &bucket{},
	}
	s.tomb.tat.Store(dead)
	return s, nil
}

// Take spends one token of key at time now (unix nanos). ok=false means the
// bucket is empty; retryAfter is then how long until a token is available
// (always > 0). When ok, retryAfter is 0.
//
// For an existing key Take takes no lock and does not allocate.
func (s *Set) Take(key uint64, now int64) (ok bool, retryAfter time.Duration) {
	h := s.hash(key)
	sh := &s.shards[h&s.shardMask]
	h >>= s.shardBits
	if b := s.find(sh.tab.Load(), key, h); b != nil {
		if ok, retryAfter, alive := s.take(b, now); alive {
			return ok, retryAfter
		}
	}
	return s.takeSlow(sh, key, h, now)
}

// TakeBytes is Take for a byte-string key, hashed with a per-Set seed. It
// does not allocate or retain key. Byte keys share the uint64 key space via
// Key, so TakeBytes(k, now) is Take(s.Key(k), now).
func (s *Set) TakeBytes(key []byte, now int64) (bool, time.Duration) {
	return s.Take(s.Key(key), now)
}

// Key returns the uint64 key TakeBytes and ResetBytes use for b, so callers
// can hash a key once and reuse it.
func (s *Set) Key(b []byte) uint64 {
	return maphash.Bytes(s.bytesSeed, b)
}

// Reset forgets key, so its next Take sees a fresh, full bucket (for example
// when a mailbox is erased).
func (s *Set) Reset(key uint64) {
	h := s.hash(key)
	sh := &s.shards[h&s.shardMask]
	h >>= s.shardBits
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	if t == nil {
		return
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		b := t.slots[i].Load()
		if b == nil {
			return
		}
		if b.key == key && b != s.tomb {
			b.tat.Store(dead) // racing lock-free Takes now retry under mu
			t.slots[i].Store(s.tomb)
			sh.live.Add(-1)
			return
		}
	}
}

// ResetBytes is Reset for a byte-string key.
func (s *Set) ResetBytes(key []byte) { s.Reset(s.Key(key)) }

// Sweep evicts buckets that have been full for at least IdleAfter as of now
// and returns how many it evicted. Callers run it periodically; its cost is
// proportional to the table capacity, and it shrinks tables that churn has
// left sparse, so memory follows the number of recently active keys.
func (s *Set) Sweep(now int64) (evicted int) {
	for i := range s.shards {
		evicted += s.sweepShard(&s.shards[i], now)
	}
	return evicted
}

// Len returns the number of buckets currently held.
func (s *Set) Len() int {
	n := int64(0)
	for i := range s.shards {
		n += s.shards[i].live.Load()
	}
	return int(n)
}

// take runs one GCRA step on b. alive=false means b was evicted or reset
// concurrently and the caller must look the key up again.
func (s *Set) take(b *bucket, now int64) (ok bool, retryAfter time.Duration, alive bool) {
	for {
		tat := b.tat.Load()
		if tat == dead {
			return false, 0, false
		}
		t := max(tat, now)
		if wait := t - now - s.tolerance; wait > 0 {
			return false, time.Duration(wait), true
		}
		if b.tat.CompareAndSwap(tat, t+s.interval) {
			return true, 0, true
		}
	}
}

// takeSlow handles a key with no live bucket: under the shard lock it finds
// or creates the bucket and takes from it. The bucket cannot die while mu is
// held, because only mu holders kill buckets.
func (s *Set) takeSlow(sh *shard, key, h uint64, now int64) (bool, time.Duration) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := s.find(sh.tab.Load(), key, h)
	if b == nil {
		b = &bucket{key: key}
		b.tat.Store(now) // full as of now
		s.insert(sh, b, h)
	}
	ok, retryAfter, _ := s.take(b, now)
	return ok, retryAfter
}

// find returns key's bucket in t, or nil. It is safe without the shard lock.
func (s *Set) find(t *table, key, h uint64) *bucket {
	if t == nil {
		return nil
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		b := t.slots[i].Load()
		if b == nil {
			return nil
		}
		if b.key == key && b != s.tomb {
			return b
		}
	}
}

// insert adds b, known to be absent, to sh. Caller holds sh.mu.
func (s *Set) insert(sh *shard, b *bucket, h uint64) {
	t := sh.tab.Load()
	if t == nil || (sh.used+1)*2 > len(t.slots) {
		t = s.rebuild(sh, int(sh.live.Load())+1)
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		p := t.slots[i].Load()
		if p == nil {
			sh.used++
		} else if p != s.tomb {
			continue
		}
		// Reusing a tombstone is safe for concurrent readers: they match on
		// the bucket's immutable key, never on the slot.
		t.slots[i].Store(b)
		sh.live.Add(1)
		return
	}
}

// rebuild replaces sh's table with one sized for want live buckets (a
// quarter full, so inserts amortise), dropping tombstones. Readers still on
// the old table see the same *bucket values, so no state is copied or lost.
// Caller holds sh.mu.
func (s *Set) rebuild(sh *shard, want int) *table {
	old := sh.tab.Load()
	if want == 0 {
		sh.tab.Store(nil)
		sh.used = 0
		return nil
	}
	size := max(minTableSize, 1<<bits.Len(uint(want*4-1)))
	t := &table{slots: make([]atomic.Pointer[bucket], size), mask: uint64(size - 1)}
	used := 0
	if old != nil {
		for i := range old.slots {
			b := old.slots[i].Load()
			if b == nil || b == s.tomb {
				continue
			}
			for j := (s.hash(b.key) >> s.shardBits) & t.mask; ; j = (j + 1) & t.mask {
				if t.slots[j].Load() == nil {
					t.slots[j].Store(b)
					used++
					break
				}
			}
		}
	}
	sh.used = used
	sh.tab.Store(t)
	return t
}

func (s *Set) sweepShard(sh *shard, now int64) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	if t == nil {
		return 0
	}
	n := 0
	for i := range t.slots {
		b := t.slots[i].Load()
		if b == nil || b == s.tomb {
			continue
		}
		// CAS from the observed value: if a Take lands in between, the
		// bucket is no longer idle and is kept.
		tat := b.tat.Load()
		if now-tat < s.idleAfter || !b.tat.CompareAndSwap(tat, dead) {
			continue
		}
		t.slots[i].Store(s.tomb)
		n++
	}
	if n == 0 {
		return 0
	}
	live := int(sh.live.Add(int64(-n)))
	// Drop tombstones once they crowd the table, and give memory back once
	// the table is mostly empty.
	if tombs := sh.used - live; tombs > len(t.slots)/4 || live*8 < len(t.slots) {
		s.rebuild(sh, live)
	}
	return n
}

// hash mixes key with the Set's seed (murmur3's 64-bit finaliser). The low
// bits pick the shard, the rest the slot.
func (s *Set) hash(key uint64) uint64 {
	h := key ^ s.hashSeed
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// capacity reports the total slot count of all tables, for tests.
func (s *Set) capacity() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if t := sh.tab.Load(); t != nil {
			n += len(t.slots)
		}
		sh.mu.Unlock()
	}
	return n
}
