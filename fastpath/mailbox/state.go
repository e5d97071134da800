package mailbox

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"edgerelay/fastpath/ws"
	"edgerelay/store"
)

// mailbox is the in-memory view of one mailbox, loaded from the store on
// first use. mu serializes its state changes: claims, erases, the
// bookkeeping of writes (not their disk syncs, which run unlocked so that
// concurrent writers share a group commit) and the watcher lists.
type mailbox struct {
	name string
	key  uint64 // hash of name, for the rate-limit buckets
	// epoch names this incarnation of the mailbox in the envelope cache:
	// a claim that creates the mailbox draws a new one, so that no cached
	// envelope outlives an erase or an expiry (mu held to read or change
	// it).
	epoch uint64

	mu     sync.Mutex
	loaded bool
	exists bool
	rec    store.MailboxRecord
	// persisted is the LastActive the store holds (and its idle index is
	// keyed by). Writes move rec.LastActive at once but persist it only
	// when it has moved by touchEvery, so most writes are one key.
	persisted int64
	dirs      [2]direction
	signal    signalSides
	lastUse   int64 // unix ns of the last request, for cache eviction
	// refs counts the holds of requests in progress (and the sweeper's):
	// an entry held is never evicted, so two entries of one mailbox
	// never exist at once. Changed only with the shard lock held to
	// take a hold; released without it.
	refs atomic.Int32
}

// settled returns the channel closed when the write of seq in flight
// settles, making it if no one waited yet; ok is false when no write of seq
// is in flight. Called with the mailbox lock held.
func (d *direction) settled(seq uint64) (ch chan struct{}, ok bool) {
	ch, ok = d.inflight[seq]
	if ok && ch == nil {
		ch = make(chan struct{})
		d.inflight[seq] = ch
	}
	return ch, ok
}

// direction is one direction's state.
type direction struct {
	loaded bool
	store.DirectionState
	// inflight holds the sequences being written: a second writer of the
	// same sequence waits for the first to settle, then compares bytes.
	// Each has the channel closed when it settles, made by the first to
	// wait (see settled): most writes have no one waiting and go without.
	inflight map[uint64]chan struct{}
	// reserved counts envelopes and bytes being written, so that the
	// 507 check holds while their syncs run unlocked.
	reservedCount, reservedBytes int
	watchers                     []*watcher
	// pendingWatchers counts upgrades admitted but not yet registered, so
	// that a 9th socket is refused before its upgrade.
	pendingWatchers int
	// foregroundUntil is the unix ns until which the reader counts as in
	// the foreground (its watch socket sent ping within 45 s).
	foregroundUntil int64
}

func dirIndex(d byte) int {
	if d == store.DirP2C {
		return 0
	}
	return 1
}

// cache holds the mailboxes in memory, in shards so that unrelated
// mailboxes do not contend on one lock. An entry is made only for a
// request that has been authorized (or a claim, which creates the
// mailbox) and for the sweeper's own work: a request refused with 401,
// 403 or 404 reads the store's record without keeping anything (see
// Handler.mailboxFor), so random ids cost nothing lasting.
//
// The cache is bounded by count (Config.MaxLoaded): a shard past its share
// evicts the least recently used of a few sampled entries that nothing
// holds (no request in progress, watcher, signal socket or write in
// flight); evicting one costs its next request a reload from the store.
// Entries that something holds are never evicted, so the bound can be
// exceeded only by mailboxes with open sockets or requests in progress,
// which the listeners' connection limits bound.
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
func (c *cache) acquire(name []byte) *mailbox {
	s, h := c.shard(name)
	s.mu.Lock()
	m := s.m[string(name)]
	if m == nil {
		if len(s.m) >= c.perShard {
			s.evictOne()
		}
		m = &mailbox{name: string(name), key: h, epoch: c.nextEpoch()}
		s.m[m.name] = m
	}
	m.refs.Add(1)
	s.mu.Unlock()
	return m
}

// release ends a hold taken by lookup or acquire.
func (c *cache) release(m *mailbox) { m.refs.Add(-1) }

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

// quiet reports whether nothing holds this mailbox in memory (mu held).
func (m *mailbox) quiet() bool {
	for i := range m.dirs {
		d := &m.dirs[i]
		if len(d.watchers) > 0 || len(d.inflight) > 0 || d.pendingWatchers > 0 {
			return false
		}
	}
	return m.signal[0].Load() == nil && m.signal[1].Load() == nil
}

// load reads the mailbox record once (mu held).
func (m *mailbox) load(log *store.EnvelopeLog) error {
	if m.loaded {
		return nil
	}
	rec, err := log.Mailbox(m.name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		m.exists = false
	case err != nil:
		return fmt.Errorf("mailbox: load %s: %w", m.name, err)
	default:
		m.exists, m.rec, m.persisted = true, rec, rec.LastActive
	}
	m.loaded = true
	return nil
}

// direction returns a direction's state, loading it once (mu held).
func (m *mailbox) direction(log *store.EnvelopeLog, dir byte) (*direction, error) {
	d := &m.dirs[dirIndex(dir)]
	if !d.loaded {
		st, err := log.State(m.name, dir)
		if err != nil {
			return nil, fmt.Errorf("mailbox: load %s/%c: %w", m.name, dir, err)
		}
		d.DirectionState, d.loaded = st, true
	}
	return d, nil
}

// forget resets the in-memory state after an erase or expiry (mu held) and
// returns the sockets to close. (The claim that creates the mailbox anew
// draws its new epoch.)
func (m *mailbox) forget() []*ws.Conn {
	var conns []*ws.Conn
	for i := range m.dirs {
		for _, w := range m.dirs[i].watchers {
			conns = append(conns, w.conn)
		}
		inflight, pending := m.dirs[i].inflight, m.dirs[i].pendingWatchers
		m.dirs[i] = direction{loaded: true, inflight: inflight, pendingWatchers: pending}
	}
	for i := range m.signal {
		if c := m.signal[i].Swap(nil); c != nil {
			conns = append(conns, c)
		}
	}
	m.exists = false
	m.rec = store.MailboxRecord{}
	return conns
}
