// Package envcache keeps copies of envelopes in a fixed amount of memory,
// so that reading one again skips Pebble's read path: a
// Pebble Get of a present key costs 0.8 to 1.8 µs in its iterator
// machinery (memtable or sstables), several times the rest of a GET.
//
// Each shard is a ring of bytes. An envelope is copied in at the ring's
// head and lives until the head comes round again (first in, first out)
// or until a newer key takes its index slot, with no per-entry
// allocation and no bookkeeping on a hit. Entries are
// never changed in place, because a stored envelope never changes; the
// caller makes removed envelopes unreachable instead, by keying entries
// with an epoch it changes when a mailbox is erased and by checking its
// pruned mark before it looks here.
package envcache

import (
	"sync"
)

// Key names one envelope: Epoch is the incarnation of its mailbox (a
// number the caller never reuses), Dir its direction, Seq its sequence.
type Key struct {
	Epoch uint64
	Seq   uint64
	Dir   byte
}

// Stats counts lookups since the cache was made.
type Stats struct {
	Hits, Misses uint64
	// Entries and Bytes are what the cache holds now.
	Entries, Bytes int
}

// shardCount spreads concurrent readers and writers over locks.
const shardCount = 16

// minAverage sizes the index: each shard has a slot per minAverage bytes
// of ring (32 B per slot, an eighth of the ring), enough for every
// envelope the ring holds when they average at least that size.
const minAverage = 256

// Cache is a bounded, concurrent first-in first-out store of envelope
// copies. A nil *Cache holds nothing.
type Cache struct {
	shards [shardCount]shard
}

// A shard is a ring of bytes and an index of slots in pairs (two-way set
// associative, like a CPU cache): a key may sit in either slot of the
// pair its hash picks. There is no map and nothing is ever deleted: a
// slot whose bytes the ring has overwritten is simply no longer intact,
// and a new key takes the pair's free or older slot. (A Go map here spent
// most of a Put probing past the tombstones of its deletions.)
type shard struct {
	mu   sync.Mutex
	ring []byte
	// head counts every byte ever placed in the ring (including the
	// skipped tails where an envelope did not fit before the ring's end):
	// the next envelope goes at head % len(ring), and an envelope placed
	// at position p is intact while head <= p+len(ring).
	head         uint64
	slots        []slot
	hits, misses uint64
}

type slot struct {
	key Key
	pos uint64
	n   int // 0: empty
}

// New returns a cache holding at most totalBytes of envelopes (nil when
// totalBytes is too small to hold anything useful, which callers treat as
// "no cache"). An envelope larger than a quarter of a shard's share is
// not kept.
func New(totalBytes int) *Cache {
	per := totalBytes / shardCount
	if per < 4*minAverage {
		return nil
	}
	slots := 2
	for slots*2*minAverage <= per {
		slots *= 2
	}
	c := &Cache{}
	for i := range c.shards {
		c.shards[i].ring = make([]byte, per)
		c.shards[i].slots = make([]slot, slots)
	}
	return c
}

// MaxEntry is the largest envelope the cache keeps.
func (c *Cache) MaxEntry() int {
	if c == nil {
		return 0
	}
	return len(c.shards[0].ring) / 4
}

// locate returns k's shard and the first slot of its pair. Epochs and
// sequences are small consecutive numbers; a multiplicative mix spreads
// them, the top bits choosing the shard and the next ones the pair.
func (c *Cache) locate(k Key) (*shard, int) {
	h := (k.Epoch*0x9E3779B97F4A7C15 ^ k.Seq ^ uint64(k.Dir)<<56) * 0xBF58476D1CE4E5B9
	h ^= h >> 29
	s := &c.shards[h>>60]
	return s, int(h) & (len(s.slots) - 1) &^ 1
}

func (s *shard) intact(sl *slot) bool {
	return sl.n > 0 && s.head <= sl.pos+uint64(len(s.ring))
}

// find returns k's slot, or nil (mu held).
func (s *shard) find(k Key, pair int) *slot {
	for i := pair; i < pair+2; i++ {
		if sl := &s.slots[i]; sl.key == k && s.intact(sl) {
			return sl
		}
	}
	return nil
}

// Put keeps a copy of env under k. A key already held keeps its bytes
// (an envelope never changes); an envelope over MaxEntry is not kept.
func (c *Cache) Put(k Key, env []byte) {
	if c == nil || len(env) > c.MaxEntry() {
		return
	}
	s, pair := c.locate(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.find(k, pair) != nil {
		return
	}
	size := uint64(len(s.ring))
	n := uint64(len(env))
	if off := s.head % size; off+n > size {
		s.head += size - off // the tail is too short: start at the ring's beginning
	}
	pos := s.head
	s.head += n
	copy(s.ring[pos%size:], env)
	victim := &s.slots[pair]
	if other := &s.slots[pair+1]; !s.intact(other) || (s.intact(victim) && other.pos < victim.pos) {
		victim = other
	}
	*victim = slot{key: k, pos: pos, n: len(env)}
}

// Append appends the envelope held under k to dst and reports whether it
// was there.
func (c *Cache) Append(dst []byte, k Key) ([]byte, bool) {
	if c == nil {
		return dst, false
	}
	s, pair := c.locate(k)
	s.mu.Lock()
	sl := s.find(k, pair)
	if sl != nil {
		off := sl.pos % uint64(len(s.ring))
		dst = append(dst, s.ring[off:off+uint64(sl.n)]...)
		s.hits++
	} else {
		s.misses++
	}
	s.mu.Unlock()
	return dst, sl != nil
}

// Has reports whether k is held.
func (c *Cache) Has(k Key) bool {
	_, known := c.Equal(k, nil)
	return known
}

// Equal reports whether k is held (known) and, if so, whether its bytes
// equal env.
func (c *Cache) Equal(k Key, env []byte) (equal, known bool) {
	if c == nil {
		return false, false
	}
	s, pair := c.locate(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.find(k, pair)
	if sl == nil {
		s.misses++
		return false, false
	}
	s.hits++
	off := sl.pos % uint64(len(s.ring))
	return string(s.ring[off:off+uint64(sl.n)]) == string(env), true
}

// Lookups sums the shards' hit and miss counters (cheap: no slot walk).
func (c *Cache) Lookups() (hits, misses uint64) {
	st := c.walk(false)
	return st.Hits, st.Misses
}

// Stats sums the shards' counters and counts what they hold (a walk of
// every slot, each shard's under its lock: for metrics scrapes, not the
// request path).
func (c *Cache) Stats() Stats { return c.walk(true) }

func (c *Cache) walk(held bool) Stats {
	var st Stats
	if c == nil {
		return st
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Hits += s.hits
		st.Misses += s.misses
		if held {
			for j := range s.slots {
				if sl := &s.slots[j]; s.intact(sl) {
					st.Entries++
					st.Bytes += sl.n
				}
			}
		}
		s.mu.Unlock()
	}
	return st
}
