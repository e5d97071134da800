// Package mailboxlocal is the single node's mailbox store: Pebble (through
// store.EnvelopeLog) with the state of the mailboxes in use kept in memory.
// That state is authoritative because this process is the only writer:
// the decisions of store.Mailboxes (who holds a mailbox, whether a PUT is
// new, a retry, a conflict, over a limit) are made against it under the
// mailbox's lock, and the disk syncs run with the lock released, so that
// concurrent writers share one group commit.
package mailboxlocal

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"edgerelay/fastpath/bucket"
	"edgerelay/fastpath/envcache"
	"edgerelay/store"
)

// Config wires a Store.
type Config struct {
	Log    *store.EnvelopeLog
	Limits store.MailboxLimits
	// EnvelopeCache is RELAY_ENVELOPE_CACHE: the bytes of recently read
	// envelopes kept in memory, so that reading one again skips Pebble's
	// read path. 0 is DefaultEnvelopeCache; negative, none.
	EnvelopeCache int
	// MaxLoaded bounds the mailboxes kept in memory (see cache): 0 is
	// DefaultMaxLoaded. Past it, a mailbox nothing holds is dropped and
	// read from the store again when next used.
	MaxLoaded int
	Logger    *slog.Logger
}

// DefaultEnvelopeCache is RELAY_ENVELOPE_CACHE's default: 32 MiB.
const DefaultEnvelopeCache = 32 << 20

// DefaultMaxLoaded is how many mailboxes stay in memory by default:
// 131,072 entries of about 500 bytes each (both directions loaded and a
// rate-limit bucket; TestLoadedMailboxBytes measures it) are about 64 MiB
// at most.
const DefaultMaxLoaded = 1 << 17

// cacheIdle is how long an unused mailbox stays in memory.
const cacheIdle = 10 * time.Minute

// Store is the single node's store.Mailboxes.
type Store struct {
	log        *store.EnvelopeLog
	lim        store.MailboxLimits
	touchEvery int64
	logger     *slog.Logger
	cache      *cache
	// envs holds copies of recent envelopes (nil: none), keyed by the
	// mailbox's epoch.
	envs *envcache.Cache
	// envelopes is the spec's per-mailbox bucket of envelopes stored,
	// pushes the per-direction push bucket.
	envelopes, pushes *bucket.Set

	goneMu sync.Mutex
	gone   []func(name string)
}

var (
	_ store.Mailboxes            = (*Store)(nil)
	_ store.Mailbox              = (*mailbox)(nil)
	_ store.MailboxStatsReporter = (*Store)(nil)
)

// New returns the store of cfg.Log's mailboxes.
func New(cfg Config) (*Store, error) {
	if cfg.Log == nil {
		return nil, errors.New("mailboxlocal: no envelope log")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.EnvelopeCache == 0 {
		cfg.EnvelopeCache = DefaultEnvelopeCache
	}
	if cfg.MaxLoaded <= 0 {
		cfg.MaxLoaded = DefaultMaxLoaded
	}
	lim := cfg.Limits.WithDefaults()
	envelopes, err := bucket.NewSet(bucket.Config{Burst: lim.EnvelopeBurst, Interval: lim.EnvelopeEvery})
	if err != nil {
		return nil, fmt.Errorf("mailboxlocal: envelope bucket: %w", err)
	}
	pushes, err := bucket.NewSet(bucket.Config{Burst: lim.PushBurst, Interval: lim.PushEvery})
	if err != nil {
		return nil, fmt.Errorf("mailboxlocal: push bucket: %w", err)
	}
	return &Store{
		log: cfg.Log, lim: lim, touchEvery: int64(lim.TouchEvery), logger: cfg.Logger,
		cache: newCache(cfg.MaxLoaded), envs: envcache.New(cfg.EnvelopeCache),
		envelopes: envelopes, pushes: pushes,
	}, nil
}

// expired reports whether a loaded mailbox has been idle too long (mu held).
func (s *Store) expired(m *mailbox, now int64) bool {
	return m.exists && now-m.rec.LastActive > int64(s.lim.Idle)
}

// Open authorizes token for a live mailbox. A mailbox in memory is
// checked under its lock. One that is not is first read from the store
// without making an entry, and only a request that passes makes one: a
// refused request keeps nothing, so unauthenticated requests of random
// ids cannot fill memory. The entry made loads the record again under its
// lock, since the store may have changed between the two reads.
func (s *Store) Open(_ context.Context, name []byte, token store.Hash, now int64) (store.Mailbox, error) {
	m := s.cache.lookup(name)
	if m == nil {
		rec, err := s.log.Mailbox(string(name)) // a miss reads the store anyway
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, store.ErrNotFound
		case err != nil:
			return nil, fmt.Errorf("mailboxlocal: peek %s: %w", name, err)
		case now-rec.LastActive > int64(s.lim.Idle):
			return nil, store.ErrNotFound
		case subtle.ConstantTimeCompare(rec.Token[:], token[:]) != 1:
			return nil, store.ErrForbidden
		}
		m = s.cache.acquire(s, name)
	}
	if err := m.authorize(token, now); err != nil {
		m.Release()
		return nil, err
	}
	return m, nil
}

// authorize checks, under the lock, that the mailbox is live and token
// holds it.
func (m *mailbox) authorize(token store.Hash, now int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastUse = now
	if err := m.load(); err != nil {
		return err
	}
	if !m.exists || m.s.expired(m, now) {
		return store.ErrNotFound
	}
	if subtle.ConstantTimeCompare(m.rec.Token[:], token[:]) != 1 {
		return store.ErrForbidden
	}
	return nil
}

// Claim creates, heartbeats or refuses. A claim of a mailbox not in memory
// that another token holds is refused from the store's record without
// making an entry.
func (s *Store) Claim(_ context.Context, name []byte, token store.Hash, now int64) (store.ClaimOutcome, error) {
	m := s.cache.lookup(name)
	if m == nil {
		rec, err := s.log.Mailbox(string(name))
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return 0, fmt.Errorf("mailboxlocal: peek %s: %w", name, err)
		case now-rec.LastActive <= int64(s.lim.Idle) && subtle.ConstantTimeCompare(rec.Token[:], token[:]) != 1:
			return store.ClaimTaken, nil
		}
		m = s.cache.acquire(s, name)
	}
	defer m.Release()
	return m.claim(token, now)
}

func (m *mailbox) claim(token store.Hash, now int64) (store.ClaimOutcome, error) {
	s := m.s
	m.mu.Lock()
	m.lastUse = now
	if err := m.load(); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	expired := s.expired(m, now)
	if m.exists && !expired {
		if subtle.ConstantTimeCompare(m.rec.Token[:], token[:]) != 1 {
			m.mu.Unlock()
			return store.ClaimTaken, nil
		}
		// A heartbeat: restarts the idle timer like a write, durably.
		rec := store.MailboxRecord{Token: token, LastActive: now}
		if err := s.log.Claim(m.name, rec, m.persisted, false); err != nil {
			m.mu.Unlock()
			return 0, fmt.Errorf("mailboxlocal: heartbeat %s: %w", m.name, err)
		}
		m.rec, m.persisted = rec, now
		m.mu.Unlock()
		return store.ClaimSame, nil
	}
	if expired {
		m.waitInflight()
		m.forget()
	}
	rec := store.MailboxRecord{Token: token, LastActive: now}
	// Only an expired holder can have left anything behind (erase and
	// the sweep remove everything at once); a fresh claim of a name never
	// used writes no range deletion, which would slow every later read.
	if err := s.log.Claim(m.name, rec, 0, expired); err != nil {
		m.mu.Unlock()
		return 0, fmt.Errorf("mailboxlocal: claim %s: %w", m.name, err)
	}
	m.exists, m.rec, m.persisted = true, rec, now
	m.epoch = s.cache.nextEpoch()
	for i := range m.dirs {
		m.dirs[i].loaded = false
	}
	m.mu.Unlock()
	if expired {
		s.notifyGone(m.name)
	}
	return store.ClaimCreated, nil
}

// OnGone registers fn for every mailbox erased or expired.
func (s *Store) OnGone(fn func(name string)) {
	s.goneMu.Lock()
	s.gone = append(s.gone, fn)
	s.goneMu.Unlock()
}

func (s *Store) notifyGone(name string) {
	s.goneMu.Lock()
	fns := s.gone
	s.goneMu.Unlock()
	for _, fn := range fns {
		fn(name)
	}
}

// MailboxStats reports the caches for /metrics.
func (s *Store) MailboxStats() store.MailboxStats {
	hits, misses := s.envs.Lookups()
	return store.MailboxStats{Loaded: s.cache.len(), EnvelopeHits: hits, EnvelopeMisses: misses, EnvelopeBytes: s.envs.Stats().Bytes}
}

// ExpireIdle erases every mailbox whose last claim or write is older than
// the idle time at now, a bounded batch per call, and drops from memory
// the mailboxes nobody used for cacheIdle. The mailboxes already answer
// 404 the moment they expire; this reclaims their space.
func (s *Store) ExpireIdle(_ context.Context, now int64) (int, error) {
	defer s.envelopes.Sweep(now)
	defer s.pushes.Sweep(now)
	defer s.cache.evictIdle(now - int64(cacheIdle))
	cutoff := now - int64(s.lim.Idle)
	type entry struct {
		name string
		at   int64
	}
	var entries []entry
	err := s.log.IdleBefore(cutoff, func(name string, at int64) bool {
		entries = append(entries, entry{name, at})
		return len(entries) < 1000 // a bounded batch per round
	})
	if err != nil {
		return 0, fmt.Errorf("mailboxlocal: idle scan: %w", err)
	}
	erased := 0
	var errs []error
	for _, e := range entries {
		// The sweeper's own work makes an entry; one it does not erase
		// is left unused (lastUse 0), for the next round to evict.
		m := s.cache.acquire(s, []byte(e.name))
		gone, err := m.expire(e.at, now)
		m.Release()
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			erased++
			s.notifyGone(e.name)
		}
	}
	return erased, errors.Join(errs...)
}

// expire is ExpireIdle's work on one index entry (m held); it reports
// whether it erased the mailbox.
func (m *mailbox) expire(at, now int64) (bool, error) {
	s := m.s
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.load(); err != nil {
		return false, err
	}
	switch {
	case !m.exists || (at != m.persisted && !s.expired(m, now)):
		// A stale index entry (the mailbox was claimed or written
		// since, or is gone): drop the entry alone.
		if err := s.log.DropIdle(at, m.name); err != nil {
			return false, fmt.Errorf("mailboxlocal: idle index cleanup: %w", err)
		}
		return false, nil
	case !s.expired(m, now):
		// Written since, but not yet persisted: persist it now, which
		// moves its index entry forward.
		rec := store.MailboxRecord{Token: m.rec.Token, LastActive: m.rec.LastActive}
		if err := s.log.Claim(m.name, rec, at, false); err != nil {
			return false, fmt.Errorf("mailboxlocal: idle touch: %w", err)
		}
		m.persisted = rec.LastActive
		return false, nil
	}
	m.waitInflight()
	if err := s.log.Erase(m.name); err != nil {
		return false, fmt.Errorf("mailboxlocal: expiry erase: %w", err)
	}
	if err := s.log.DropIdle(at, m.name); err != nil {
		s.logger.Error("idle index cleanup failed", "err", err)
	}
	m.forget()
	return true, nil
}

// Evict drops from memory the mailboxes nobody has used since cutoff and
// that nothing holds (ExpireIdle does it for those unused for 10 minutes;
// tests, to make the next request read the store), and reports how many.
func (s *Store) Evict(cutoff int64) int { return s.cache.evictIdle(cutoff) }
