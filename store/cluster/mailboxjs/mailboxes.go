package mailboxjs

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Mailboxes is store.Mailboxes over a Store: the decisions are the
// Store's (made against the direction's head by compare-and-set); this
// type adds what one node keeps for them: the claim cache that lets an
// authorized request go without a round trip, the watcher places, the
// foreground marks and the OnGone callbacks.
type Mailboxes struct {
	s       *Store
	lim     store.MailboxLimits
	log     *slog.Logger
	sweeper *Sweeper
	slots   jetstream.Stream // er_watch's stream: leader reads of a slot's last message
	ctl     *nats.Subscription
	owner   []byte // this node's slot value

	// Tunables, fixed after NewMailboxes (tests shorten them).
	slotTTL, slotRefresh, fgTimeout time.Duration
	claimCap                        int

	mu     sync.Mutex
	claims map[string]*claimEntry
	dirs   map[string]*dirPresence // cacheKey(name, dir): places held here, foreground
	held   map[*slot]struct{}
	gone   []func(name string)
	closed bool

	hub        *hub
	reconnects atomic.Uint64 // the connection's, as of the last resync
	// dropLive, in tests, loses the republished messages it returns true
	// for, as a reconnect or a slow consumer would.
	dropLive atomic.Pointer[func(*nats.Msg) bool]

	stop    chan struct{}
	done    chan struct{} // the refresher's
	hubDone chan struct{}
}

var _ store.Mailboxes = (*Mailboxes)(nil)

// WatchBucket holds the watcher places: key <app>.<id>.<dir>.<0-7>.
const WatchBucket = "er_watch"

const (
	defaultSlotTTL     = 90 * time.Second
	defaultSlotRefresh = 30 * time.Second
	// defaultFgTimeout bounds a Foreground question to the other nodes.
	// Only a node whose reader is in the foreground answers, so a
	// direction watched in the background costs the asker this long (in
	// the push sender, never on a PUT); a late answer costs a push that
	// was not needed, nothing more. Cross-node request/reply measured
	// 65 µs p50 and 270 µs p99 (CLUSTER.md §0).
	defaultFgTimeout = 25 * time.Millisecond
	// defaultClaimCap bounds the claim cache (about 150 bytes an entry).
	defaultClaimCap = 65536
	// sweepLease is the sweeper lease's TTL: longer than a sweep runs;
	// a node that dies holding it frees it after this long.
	sweepLease = 2 * time.Minute
)

// claimEntry is what this node knows of one mailbox's claim record. Its
// times are the callers' clock (unix ns).
type claimEntry struct {
	name  string
	token store.Hash
	// persisted is the LastActive the record holds as far as this node
	// knows; a write touches the record when it is TouchEvery old.
	persisted atomic.Int64
	// active is the latest activity this node knows of (the record, its
	// own claims and writes, the heads it read).
	active atomic.Int64
	// checked is when the record was last read through the leader (or
	// written by this node): entries older than TouchEvery are read
	// again, which bounds what a lost control message can leave stale.
	checked atomic.Int64
	holds   atomic.Int32
}

// NewMailboxes binds the lease and watcher buckets, subscribes to every
// mailbox's control subject and starts refreshing the watcher places this
// node holds. lim is taken WithDefaults.
func NewMailboxes(ctx context.Context, s *Store, lim store.MailboxLimits, log *slog.Logger) (*Mailboxes, error) {
	return newMailboxes(ctx, s, lim, log, nil)
}

// newMailboxes is NewMailboxes with tune (tests) changing the tunables
// before anything starts.
func newMailboxes(ctx context.Context, s *Store, lim store.MailboxLimits, log *slog.Logger, tune func(*Mailboxes)) (*Mailboxes, error) {
	if log == nil {
		log = slog.Default()
	}
	m := &Mailboxes{
		s: s, lim: lim.WithDefaults(), log: log,
		slotTTL: defaultSlotTTL, slotRefresh: defaultSlotRefresh, fgTimeout: defaultFgTimeout, claimCap: defaultClaimCap,
		claims: make(map[string]*claimEntry), dirs: make(map[string]*dirPresence), held: make(map[*slot]struct{}),
		stop: make(chan struct{}), done: make(chan struct{}), hubDone: make(chan struct{}),
		owner: ownerValue(s.c.Node(), s.c.Incarnation()),
	}
	m.hub = newHub(m.answerForeground)
	if tune != nil {
		tune(m)
	}
	var err error
	if m.sweeper, err = s.NewSweeper(ctx, sweepLease); err != nil {
		return nil, err
	}
	if _, err := s.c.Bucket(ctx, cluster.BucketConfig{Name: WatchBucket, KeyTTL: true}); err != nil {
		return nil, err
	}
	if m.slots, err = s.c.Stream(ctx, WatchBucket); err != nil {
		return nil, err
	}
	// One subscription for every mailbox's control subject: an erase,
	// an expiry or a takeover through any node drops this node's cached
	// claim and reaches OnGone.
	if m.ctl, err = s.nc.Subscribe("er.mbx.*.*.ctl", m.onControl); err != nil {
		return nil, cluster.Fail("subscribe control", err)
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		_ = m.ctl.Unsubscribe()
		return nil, cluster.Fail("subscribe control", err)
	}
	m.reconnects.Store(s.nc.Stats().Reconnects)
	go m.refreshLoop()
	go m.hub.run(m.stop, m.hubDone)
	return m, nil
}

// Close stops the refresher, gives back the places this node holds and
// unsubscribes.
func (m *Mailboxes) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	held := make([]*slot, 0, len(m.held))
	for sl := range m.held {
		held = append(held, sl)
	}
	m.mu.Unlock()
	close(m.stop)
	<-m.done
	<-m.hubDone
	m.hub.mu.Lock()
	watches := make([]*liveWatch, 0, len(m.hub.subs))
	for _, w := range m.hub.subs {
		watches = append(watches, w)
	}
	m.hub.mu.Unlock()
	for _, w := range watches {
		w.close()
	}
	for _, sl := range held {
		sl.leave()
	}
	return m.ctl.Unsubscribe()
}

// onControl runs on the control subscription's goroutine: it must not
// block, and neither may the OnGone callbacks it calls.
func (m *Mailboxes) onControl(msg *nats.Msg) {
	if string(msg.Data) != ctlErased {
		return
	}
	// er.mbx.<app>.<id>.ctl
	rest, ok := strings.CutPrefix(msg.Subject, "er.mbx.")
	rest, ok2 := strings.CutSuffix(rest, ".ctl")
	app, id, ok3 := strings.Cut(rest, ".")
	if !ok || !ok2 || !ok3 {
		return
	}
	name := app + "/" + id
	m.mu.Lock()
	delete(m.claims, name)
	fns := m.gone
	m.mu.Unlock()
	var upTo uint64 // 0: every claim
	if v := msg.Header.Get(hdrClaimRev); v != "" {
		upTo, _ = strconv.ParseUint(v, 10, 64)
	}
	m.hub.erased(name, upTo)
	for _, fn := range fns {
		fn(name)
	}
}

// OnGone registers fn, called with the name of every mailbox erased,
// expired or taken over through any node.
func (m *Mailboxes) OnGone(fn func(name string)) {
	m.mu.Lock()
	m.gone = append(m.gone[:len(m.gone):len(m.gone)], fn) // a new array: onControl reads the old one unlocked
	m.mu.Unlock()
}

func (m *Mailboxes) drop(name string) {
	m.mu.Lock()
	delete(m.claims, name)
	m.mu.Unlock()
}

// remember puts what this node learned of a claim record in the cache.
func (m *Mailboxes) remember(name string, token store.Hash, persisted, active, now int64) *claimEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.claims[name]
	if e == nil || e.token != token {
		if e == nil && len(m.claims) >= m.claimCap {
			m.evictLocked()
		}
		e = &claimEntry{name: name, token: token}
		m.claims[name] = e
	}
	e.persisted.Store(persisted)
	e.active.Store(max(active, persisted))
	e.checked.Store(now)
	return e
}

// evictLocked drops one entry: of a few sampled (Go's map order is
// random), the least recently checked that no request holds.
func (m *Mailboxes) evictLocked() {
	var victim *claimEntry
	i := 0
	for _, e := range m.claims {
		if victim == nil || (e.holds.Load() == 0 && (victim.holds.Load() != 0 || e.checked.Load() < victim.checked.Load())) {
			victim = e
		}
		if i++; i == 8 {
			break
		}
	}
	if victim != nil {
		delete(m.claims, victim.name) // a handle holding it keeps working
	}
}

// Open authorizes token for the live mailbox name from the node's cache
// when it can: an entry checked within TouchEvery and active within Idle
// answers at once, for its token or (ErrForbidden) against another, so a
// flood of wrong bearers costs the leader nothing either. Anything else
// is read through the leader. (An entry of a mailbox another token took
// over is never fresh: a takeover needs the mailbox idle, and its notice
// goes out before the new claim is written.)
func (m *Mailboxes) Open(ctx context.Context, name []byte, token store.Hash, now int64) (store.Mailbox, error) {
	m.mu.Lock()
	e := m.claims[string(name)]
	m.mu.Unlock()
	fresh := e != nil && now-e.checked.Load() <= int64(m.lim.TouchEvery) && now-e.active.Load() <= int64(m.lim.Idle)
	if fresh && e.token != token {
		return nil, store.ErrForbidden
	}
	if !fresh {
		var err error
		if e, err = m.verify(ctx, string(name), token, now); err != nil {
			return nil, err
		}
	}
	e.holds.Add(1)
	return &mailbox{m: m, e: e}, nil
}

// verify reads the claim record through the leader (and, when it looks
// idle, the heads: writes stamp them, not the record). A refused Open
// adds nothing to the cache.
func (m *Mailboxes) verify(ctx context.Context, name string, token store.Hash, now int64) (*claimEntry, error) {
	n, err := m.s.names(name)
	if err != nil {
		return nil, store.ErrNotFound // no such mailbox can exist
	}
	rec, _, err := m.s.readClaim(ctx, n)
	if errors.Is(err, store.ErrNotFound) {
		m.drop(name)
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	active := rec.LastActive
	if now-active > int64(m.lim.Idle) {
		w, err := m.s.lastWrite(ctx, n)
		if err != nil {
			return nil, err
		}
		if active = max(active, w); now-active > int64(m.lim.Idle) {
			m.drop(name) // gone: the sweeper or the next claim erases it
			return nil, store.ErrNotFound
		}
	}
	if rec.Token != token {
		m.mu.Lock()
		if e := m.claims[name]; e != nil && e.token != rec.Token {
			delete(m.claims, name) // stale: another holder now
		}
		m.mu.Unlock()
		return nil, store.ErrForbidden
	}
	return m.remember(name, rec.Token, rec.LastActive, active, now), nil
}

// Claim is Store.Claim with the limits' touchEvery and idle; a 201 or 204
// leaves the record in this node's cache.
func (m *Mailboxes) Claim(ctx context.Context, name []byte, token store.Hash, now int64) (store.ClaimOutcome, error) {
	key := string(name)
	o, persisted, err := m.s.claim(ctx, key, token, now, m.lim.TouchEvery, m.lim.Idle)
	if err != nil {
		return 0, err
	}
	switch o {
	case ClaimCreated:
		m.remember(key, token, persisted, now, now)
		return store.ClaimCreated, nil
	case ClaimSame:
		m.remember(key, token, persisted, now, now)
		return store.ClaimSame, nil
	case ClaimTaken:
		return store.ClaimTaken, nil
	}
	return 0, cluster.Fail("claim "+key, errors.New("no outcome"))
}

// ExpireIdle runs one sweep under the sweeper lease: on the node that
// wins it; the others return 0. Each erase tells every node (OnGone).
func (m *Mailboxes) ExpireIdle(ctx context.Context, now int64) (int, error) {
	erased, _, err := m.sweeper.Sweep(ctx, now-int64(m.lim.Idle))
	return len(erased), err
}

// limits are the Store's Put limits from the relay's.
func (m *Mailboxes) limits(notify bool) Limits {
	return Limits{
		MaxStored: m.lim.MaxStored, MaxStoredBytes: m.lim.MaxStoredBytes,
		EnvelopeBurst: m.lim.EnvelopeBurst, EnvelopeEvery: m.lim.EnvelopeEvery,
		PushBurst: m.lim.PushBurst, PushEvery: m.lim.PushEvery, Notify: notify,
	}
}

// unavailable makes a store error that is no answer wrap
// store.ErrUnavailable (most already do, through cluster.Fail).
func unavailable(op string, err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) {
		return err
	}
	return cluster.Fail(op, err)
}

// mailbox is one Open's handle.
type mailbox struct {
	m        *Mailboxes
	e        *claimEntry
	released atomic.Bool
}

var _ store.Mailbox = (*mailbox)(nil)

func (h *mailbox) Name() string { return h.e.name }

func (h *mailbox) Release() {
	if h.released.CompareAndSwap(false, true) {
		h.e.holds.Add(-1)
	}
}

var putOutcomes = [...]store.PutOutcome{
	Created:     store.PutCreated,
	Retry:       store.PutRetry,
	Conflict:    store.PutConflict,
	Pruned:      store.PutPruned,
	Full:        store.PutFull,
	RateLimited: store.PutRateLimited,
	NoMailbox:   store.PutNoMailbox,
}

// Put is Store.Put; a stored envelope moves the record's LastActive when
// this node's view of it is TouchEvery old (the head has the write's time
// at once: the record is for the sweeper's first pass and for Open).
//
// A notify for a reader this node holds in the foreground spends no push
// token (PutResult.Foreground); a reader in the foreground on another
// node is the push sender's question (Foreground), not the PUT's.
func (h *mailbox) Put(ctx context.Context, dir byte, seq uint64, env []byte, notify bool, now int64) (store.PutResult, error) {
	fg := notify && h.m.localForeground(h.e.name, dir, now)
	r, err := h.m.s.Put(ctx, h.e.name, dir, seq, env, h.m.limits(notify && !fg), now)
	if err != nil {
		return store.PutResult{}, err
	}
	if r.Outcome <= 0 || int(r.Outcome) >= len(putOutcomes) {
		return store.PutResult{}, cluster.Fail("put "+h.e.name, errors.New("no outcome"))
	}
	switch r.Outcome {
	case NoMailbox:
		h.m.drop(h.e.name)
	case Created:
		h.touch(ctx, now)
	}
	return store.PutResult{Outcome: putOutcomes[r.Outcome], RetryAfter: r.RetryAfter, Push: r.Push, Foreground: fg && r.Outcome == Created}, nil
}

func (h *mailbox) touch(ctx context.Context, now int64) {
	e := h.e
	for a := e.active.Load(); a < now && !e.active.CompareAndSwap(a, now); a = e.active.Load() {
	}
	old := e.persisted.Load()
	if now-old < int64(h.m.lim.TouchEvery) || !e.persisted.CompareAndSwap(old, now) {
		return // not due, or another write of this node touches it
	}
	if err := h.m.s.Touch(ctx, e.name, now); err != nil {
		// The envelope is stored and its head carries the write's time,
		// so the mailbox stays alive; the next write touches again.
		e.persisted.CompareAndSwap(now, old)
	}
}

func (h *mailbox) AppendEnvelope(ctx context.Context, dst []byte, dir byte, seq uint64) ([]byte, bool, error) {
	env, ok, err := h.m.s.Envelope(ctx, h.e.name, dir, seq)
	if err != nil || !ok {
		return dst, false, err
	}
	return append(dst, env...), true, nil
}

func (h *mailbox) HasEnvelope(ctx context.Context, dir byte, seq uint64) (bool, error) {
	return h.m.s.HasEnvelope(ctx, h.e.name, dir, seq)
}

func (h *mailbox) Scan(ctx context.Context, dir byte, after uint64, fn func(seq uint64, env []byte) bool) error {
	return h.m.s.Scan(ctx, h.e.name, dir, after, 0, fn)
}

func (h *mailbox) State(ctx context.Context, dir byte) (store.DirectionState, error) {
	hd, err := h.m.s.State(ctx, h.e.name, dir)
	if err != nil {
		return store.DirectionState{}, err
	}
	return store.DirectionState{Count: hd.Count, Bytes: hd.Bytes, First: hd.First(), Last: hd.Last(), Pruned: hd.Pruned}, nil
}

func (h *mailbox) Prune(ctx context.Context, dir byte, through uint64) error {
	return h.m.s.Prune(ctx, h.e.name, dir, through)
}

// Erase is Store.Erase: its control message ends every watch of the
// mailbox and reaches every node's OnGone.
func (h *mailbox) Erase(ctx context.Context) error {
	h.m.drop(h.e.name)
	return h.m.s.Erase(ctx, h.e.name)
}

func (h *mailbox) PushRegistration(ctx context.Context, dir byte) ([]byte, error) {
	return h.m.s.PushRegistration(ctx, h.e.name, dir)
}

func (h *mailbox) SetPushRegistration(ctx context.Context, dir byte, sealed []byte) error {
	return h.m.s.SetPushRegistration(ctx, h.e.name, dir, sealed)
}

func (h *mailbox) DeletePushRegistration(ctx context.Context, dir byte) error {
	return h.m.s.DeletePushRegistration(ctx, h.e.name, dir)
}

func (h *mailbox) DropPushRegistration(ctx context.Context, dir byte, sent []byte) (bool, error) {
	return h.m.s.DropPushRegistration(ctx, h.e.name, dir, sent)
}
