package mailboxlocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"edgerelay/fastpath/envcache"
	"edgerelay/store"
)

// mailbox is the in-memory view of one mailbox, loaded from the store on
// first use, and the store.Mailbox handle of it. mu serializes its state
// changes: claims, erases, the bookkeeping of writes (not their disk
// syncs, which run unlocked so that concurrent writers share a group
// commit) and the watcher lists.
type mailbox struct {
	s    *Store
	name string
	key  uint64 // hash of name, the key of its rate-limit buckets
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
	lastUse   int64 // unix ns of the last request, for cache eviction
	// refs counts the holds of requests and sockets in progress (and the
	// sweeper's): an entry held is never evicted, so two entries of one
	// mailbox never exist at once. Changed only with the shard lock held
	// to take a hold; released without it.
	refs atomic.Int32
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
	// places counts the watcher places taken (JoinWatchers), from before
	// a socket's upgrade until it ends.
	places int
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

func (m *mailbox) Name() string { return m.name }

// Release ends a hold taken by Open (or the store's own lookups).
func (m *mailbox) Release() { m.refs.Add(-1) }

// quiet reports whether nothing holds this mailbox in memory (mu held).
func (m *mailbox) quiet() bool {
	for i := range m.dirs {
		d := &m.dirs[i]
		if len(d.watchers) > 0 || len(d.inflight) > 0 || d.places > 0 {
			return false
		}
	}
	return true
}

// load reads the mailbox record once (mu held).
func (m *mailbox) load() error {
	if m.loaded {
		return nil
	}
	rec, err := m.s.log.Mailbox(m.name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		m.exists = false
	case err != nil:
		return fmt.Errorf("mailboxlocal: load %s: %w", m.name, err)
	default:
		m.exists, m.rec, m.persisted = true, rec, rec.LastActive
	}
	m.loaded = true
	return nil
}

// direction returns a direction's state, loading it once (mu held).
func (m *mailbox) direction(dir byte) (*direction, error) {
	d := &m.dirs[dirIndex(dir)]
	if !d.loaded {
		st, err := m.s.log.State(m.name, dir)
		if err != nil {
			return nil, fmt.Errorf("mailboxlocal: load %s/%c: %w", m.name, dir, err)
		}
		d.DirectionState, d.loaded = st, true
	}
	return d, nil
}

// forget resets the in-memory state after an erase or expiry (mu held)
// and ends every watch with store.ErrErased. (The claim that creates the
// mailbox anew draws its new epoch.)
func (m *mailbox) forget() {
	for i := range m.dirs {
		for _, w := range m.dirs[i].watchers {
			w.end(store.ErrErased)
		}
		d := &m.dirs[i]
		m.dirs[i] = direction{loaded: true, inflight: d.inflight, places: d.places}
	}
	m.exists = false
	m.rec = store.MailboxRecord{}
}

// waitInflight waits until no write of m is in flight (mu held on entry
// and on return), so that an erase cannot be overtaken by a write's sync.
func (m *mailbox) waitInflight() {
	for {
		var ch chan struct{}
		for i := range m.dirs {
			for seq := range m.dirs[i].inflight {
				ch, _ = m.dirs[i].settled(seq)
				break
			}
		}
		if ch == nil {
			return
		}
		m.mu.Unlock()
		<-ch
		m.mu.Lock()
	}
}

// Put decides a PUT under the mailbox lock and, when it is a new envelope,
// writes it with the lock released so that concurrent writers share one
// sync. A second writer of a sequence in flight waits for the first to
// settle and decides again.
func (m *mailbox) Put(_ context.Context, dir byte, seq uint64, env []byte, notify bool, now int64) (store.PutResult, error) {
	s := m.s
	if ok, retry := s.envelopes.Take(m.key, now); !ok {
		return store.PutResult{Outcome: store.PutRateLimited, RetryAfter: retry}, nil
	}
	for {
		res, wait, err := m.reserve(dir, seq, env, now)
		if wait != nil {
			<-wait // the same sequence is being written: see how it ends
			continue
		}
		if err != nil || res.Outcome != store.PutCreated || !notify {
			return res, err
		}
		m.mu.Lock()
		res.Foreground = m.dirs[dirIndex(dir)].foregroundUntil > now
		m.mu.Unlock()
		if !res.Foreground {
			res.Push, _ = s.pushes.Take(m.key^uint64(dir)<<56, now)
		}
		return res, nil
	}
}

func (m *mailbox) reserve(dir byte, seq uint64, env []byte, now int64) (store.PutResult, chan struct{}, error) {
	s := m.s
	m.mu.Lock()
	m.lastUse = now
	if !m.exists || s.expired(m, now) { // erased since Open
		m.mu.Unlock()
		return store.PutResult{Outcome: store.PutNoMailbox}, nil, nil
	}
	d, err := m.direction(dir)
	if err != nil {
		m.mu.Unlock()
		return store.PutResult{}, nil, err
	}
	if ch, busy := d.settled(seq); busy {
		m.mu.Unlock()
		return store.PutResult{}, ch, nil
	}
	if seq <= d.Pruned {
		m.mu.Unlock()
		return store.PutResult{Outcome: store.PutPruned}, nil, nil
	}
	var same, exists bool
	// Above the last stored sequence nothing can be stored (a write of it
	// in flight was handled above): the usual, appending, case needs no
	// lookup.
	if d.Count > 0 && seq <= d.Last {
		same, exists = s.envs.Equal(envcache.Key{Epoch: m.epoch, Dir: dir, Seq: seq}, env)
		if !exists {
			exists, err = s.log.Envelope(m.name, dir, seq, func(stored []byte) { same = bytes.Equal(stored, env) })
		}
		if err != nil {
			m.mu.Unlock()
			return store.PutResult{}, nil, err
		}
	}
	if exists {
		m.mu.Unlock()
		if !same {
			return store.PutResult{Outcome: store.PutConflict}, nil, nil
		}
		return store.PutResult{Outcome: store.PutRetry}, nil, nil // stored already, nothing to wake
	}
	if d.Count+d.reservedCount+1 > s.lim.MaxStored || d.Bytes+d.reservedBytes+len(env) > s.lim.MaxStoredBytes {
		m.mu.Unlock()
		return store.PutResult{Outcome: store.PutFull}, nil, nil
	}
	if d.inflight == nil {
		d.inflight = make(map[uint64]chan struct{})
	}
	d.inflight[seq] = nil
	d.reservedCount++
	d.reservedBytes += len(env)
	m.rec.LastActive = now
	var touch *store.MailboxRecord
	prev := m.persisted
	if now-m.persisted >= s.touchEvery {
		touch = &store.MailboxRecord{Token: m.rec.Token, LastActive: now}
		m.persisted = now
	}
	m.mu.Unlock()

	// The envelope is not put in the envelope cache: a copy per write
	// cost 2 µs of server CPU per PUT at 64 writers (its fresh cache
	// lines evict the commit path's), and most envelopes reach their
	// reader through a watch socket or a batch, never a GET of one.
	err = s.log.Put(m.name, dir, seq, env, touch, prev)

	m.mu.Lock()
	done := d.inflight[seq]
	delete(d.inflight, seq)
	d.reservedCount--
	d.reservedBytes -= len(env)
	if err == nil {
		if d.Count == 0 || seq < d.First {
			d.First = seq
		}
		if seq > d.Last {
			d.Last = seq
		}
		d.Count++
		d.Bytes += len(env)
		for _, w := range d.watchers {
			w.deliver(seq, env)
		}
	}
	m.mu.Unlock()
	if done != nil {
		close(done)
	}
	if err != nil {
		return store.PutResult{}, nil, fmt.Errorf("mailboxlocal: put %s/%c/%d: %w", m.name, dir, seq, err)
	}
	return store.PutResult{Outcome: store.PutCreated}, nil, nil
}

// lookupRange says what the direction's state in memory settles about
// seq: outside the stored range (or pruned) it is not stored, and inside
// a range with no gap it is.
func (m *mailbox) lookupRange(dir byte, seq uint64) (inRange, noGap bool, key envcache.Key, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, err := m.direction(dir)
	if err != nil {
		return false, false, key, err
	}
	inRange = d.Count > 0 && seq >= d.First && seq <= d.Last && seq > d.Pruned
	noGap = uint64(d.Count) == d.Last-d.First+1
	return inRange, noGap, envcache.Key{Epoch: m.epoch, Dir: dir, Seq: seq}, nil
}

// HasEnvelope answers from memory when it can, else from the envelope
// cache, then the store.
func (m *mailbox) HasEnvelope(_ context.Context, dir byte, seq uint64) (bool, error) {
	inRange, noGap, key, err := m.lookupRange(dir, seq)
	switch {
	case err != nil || !inRange:
		return false, err
	case noGap || m.s.envs.Has(key):
		return true, nil
	}
	return m.s.log.Envelope(m.name, dir, seq, nil)
}

// AppendEnvelope reads from the envelope cache, then the store (keeping a
// copy in the cache).
func (m *mailbox) AppendEnvelope(_ context.Context, dst []byte, dir byte, seq uint64) ([]byte, bool, error) {
	inRange, _, key, err := m.lookupRange(dir, seq)
	if err != nil || !inRange {
		return dst, false, err
	}
	if out, found := m.s.envs.Append(dst, key); found {
		return out, true, nil
	}
	out, found, err := m.s.log.AppendEnvelope(dst, m.name, dir, seq)
	if found {
		m.s.envs.Put(key, out[len(dst):])
	}
	return out, found, err
}

func (m *mailbox) Scan(_ context.Context, dir byte, after uint64, fn func(seq uint64, env []byte) bool) error {
	return m.s.log.Scan(m.name, dir, after, fn)
}

func (m *mailbox) State(_ context.Context, dir byte) (store.DirectionState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, err := m.direction(dir)
	if err != nil {
		return store.DirectionState{}, err
	}
	return d.DirectionState, nil
}

func (m *mailbox) Prune(_ context.Context, dir byte, through uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	// A write still syncing could land below the new mark after it.
	m.waitInflight()
	d, err := m.direction(dir)
	if err != nil {
		return err
	}
	if through <= d.Pruned {
		return nil
	}
	if err := m.s.log.Prune(m.name, dir, through); err != nil {
		return fmt.Errorf("mailboxlocal: prune %s/%c: %w", m.name, dir, err)
	}
	// Recount what is left: pruning is rare and bounded by MaxStored.
	st, err := m.s.log.State(m.name, dir)
	if err != nil {
		return err
	}
	d.DirectionState = st
	return nil
}

func (m *mailbox) Erase(_ context.Context) error {
	m.mu.Lock()
	m.waitInflight()
	if err := m.s.log.Erase(m.name); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("mailboxlocal: erase %s: %w", m.name, err)
	}
	m.forget()
	m.mu.Unlock()
	m.s.notifyGone(m.name)
	return nil
}

func (m *mailbox) PushRegistration(_ context.Context, dir byte) ([]byte, error) {
	return m.s.log.PushRegistration(m.name, dir)
}

// SetPushRegistration stores a registration unless the mailbox went since
// Open (store.ErrNotFound).
func (m *mailbox) SetPushRegistration(_ context.Context, dir byte, sealed []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.exists {
		return store.ErrNotFound
	}
	return m.s.log.SetPushRegistration(m.name, dir, sealed)
}

func (m *mailbox) DeletePushRegistration(_ context.Context, dir byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s.log.DeletePushRegistration(m.name, dir)
}

func (m *mailbox) DropPushRegistration(_ context.Context, dir byte, sent []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.s.log.PushRegistration(m.name, dir)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !bytes.Equal(now, sent)) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, m.s.log.DeletePushRegistration(m.name, dir)
}

// JoinWatchers takes one of the direction's places before an upgrade.
func (m *mailbox) JoinWatchers(_ context.Context, dir byte) (func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := &m.dirs[dirIndex(dir)]
	if d.places >= store.MaxWatchers {
		return nil, store.ErrTooManyWatchers
	}
	d.places++
	m.refs.Add(1) // the place holds the mailbox in memory until left
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.dirs[dirIndex(dir)].places--
			m.mu.Unlock()
			m.Release()
		})
	}, nil
}

func (m *mailbox) SetForeground(dir byte, until int64) {
	m.mu.Lock()
	d := &m.dirs[dirIndex(dir)]
	d.foregroundUntil = max(d.foregroundUntil, until)
	m.mu.Unlock()
}

func (m *mailbox) Foreground(_ context.Context, dir byte, now int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dirs[dirIndex(dir)].foregroundUntil > now
}
