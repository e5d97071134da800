package mailboxlocal

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// cache holds the mailboxes in memory, in shards so that unrelated
// mailboxes do not contend on one lock. An entry is made only for a
// request that has been authorized (or a claim, which creates the
// mailbox) and for the sweeper's own work: a request refused with 403 or
// 404 reads the store's record without keeping anything (see Store.Open),
// so random ids cost nothing lasting.
//
// The cache is bounded by count (Config.MaxLoaded): a shard past its share
// evicts the least recently used of a few sampled entries that nothing
// holds (no request in progress, watcher, socket or write in flight);
// evicting one costs its next request a reload from the store. Entries
// that something holds are never evicted, so the bound can be exceeded
// only by mailboxes with open sockets or requests in progress, which the
// listeners' connection limits bound.
type cache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
	epochs atomic.Uint64
	// perShard is how many entries a shard keeps before an insert evicts.
	perShard int
}

const (
	cacheShards = 64
	// evictSample is how many entries an insert into a full shard looks
	// at for one to evict (sampled LRU: Go's map iteration starts at a
	// random place).
	evictSample = 8
)

type cacheShard struct {
	mu sync.Mutex
	m  map[string]*mailbox
}

// newCache returns a cache holding about maxLoaded entries at most.
func newCache(maxLoaded int) *cache {
	c := &cache{seed: maphash.MakeSeed(), perShard: max(1, maxLoaded/cacheShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*mailbox)
	}
	return c
}

func (c *cache) shard(name []byte) (*cacheShard, uint64) {
	h := maphash.Bytes(c.seed, name)
	return &c.shards[h%cacheShards], h
}

// lookup returns the mailbox named name if it is in memory, held (release
// it when done), or nil; it never makes an entry. name may alias a scratch
// buffer.
func (c *cache) lookup(name []byte) *mailbox {
	s, _ := c.shard(name)
	s.mu.Lock()
	m := s.m[string(name)]
	if m != nil {
		m.refs.Add(1) // under the shard lock, so that no eviction races it
	}
	s.mu.Unlock()
	return m
}

// acquire returns the mailbox named name, held, making an unloaded entry
// when it is not in memory. Only an authorized request, a claim or the
// sweeper may call it. name may alias a scratch buffer: it is copied only
// when a new entry is made.
func (c *cache) acquire(st *Store, name []byte) *mailbox {
	s, h := c.shard(name)
	s.mu.Lock()
	m := s.m[string(name)]
	if m == nil {
		if len(s.m) >= c.perShard {
			s.evictOne()
		}
		m = &mailbox{s: st, name: string(name), key: h, epoch: c.nextEpoch()}
		s.m[m.name] = m
	}
	m.refs.Add(1)
	s.mu.Unlock()
	return m
}

// evictOne drops the least recently used evictable entry among a few
// sampled ones (shard mu held). It may drop none when every sampled entry
// is held: the shard then runs past its share until they are let go.
func (s *cacheShard) evictOne() {
	var victim *mailbox
	seen := 0
	for _, m := range s.m {
		if seen++; seen > evictSample {
			break
		}
		if m.refs.Load() != 0 || !m.mu.TryLock() {
			continue
		}
		if m.quiet() && (victim == nil || m.lastUse < victim.lastUse) {
			victim = m
		}
		m.mu.Unlock()
	}
	if victim != nil {
		delete(s.m, victim.name)
	}
}

// nextEpoch draws a mailbox epoch never drawn before.
func (c *cache) nextEpoch() uint64 { return c.epochs.Add(1) }

// evictIdle drops mailboxes nobody has used since before cutoff and that
// nothing holds, so memory stays bounded under churn.
func (c *cache) evictIdle(cutoff int64) (evicted int) {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for name, m := range s.m {
			if m.refs.Load() == 0 && m.mu.TryLock() {
				if m.lastUse < cutoff && m.quiet() {
					delete(s.m, name)
					evicted++
				}
				m.mu.Unlock()
			}
		}
		s.mu.Unlock()
	}
	return evicted
}

// len is the number of mailboxes in memory.
func (c *cache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
