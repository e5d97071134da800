package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Mailboxes is the mailbox relay's store: the claims, envelopes, pruned
// marks, push registrations and watches of every mailbox, with the
// decisions about them (who holds a mailbox, whether an envelope is new,
// a retry, a conflict, over a limit). The handler owns only what is about
// one request or one socket; it never learns which backend it runs on.
//
// Two backends implement it: store/mailboxlocal (one node: Pebble, with
// the state of the mailboxes in use kept in memory, authoritative because
// it is the only writer) and store/cluster/mailboxjs (JetStream, shared by
// every node, each decision made against the direction's head by
// compare-and-set).
//
// Names are "<app>/<id>" (MaxMailboxName bytes at most); a name passed
// as a byte slice may alias the caller's scratch buffer and is copied
// when kept. now is unix nanoseconds. Every failure that is not an answer
// (disk full, no quorum, timeout) wraps ErrUnavailable or is an internal
// error.
type Mailboxes interface {
	// Open authorizes token for the live mailbox name and returns it,
	// held until Release: ErrNotFound when there is no live mailbox (none,
	// or idle longer than the idle time at now), ErrForbidden when another
	// token holds it. A refused Open keeps nothing.
	Open(ctx context.Context, name []byte, token Hash, now int64) (Mailbox, error)
	// Claim creates the mailbox for token (or takes over one idle longer
	// than the idle time: what its holder left is gone first), or, when
	// token holds it, restarts its idle timer (a heartbeat).
	Claim(ctx context.Context, name []byte, token Hash, now int64) (ClaimOutcome, error)
	// ExpireIdle erases the mailboxes idle longer than the idle time at
	// now and reports how many (in a cluster one node at a time does the
	// work; the others' calls return 0).
	ExpireIdle(ctx context.Context, now int64) (int, error)
	// OnGone registers fn, called with the name of every mailbox erased
	// or expired (through any node), so that the sockets a handler keeps
	// for it close. fn must not block.
	OnGone(fn func(name string))
}

// Mailbox is one live mailbox, authorized, held by a request or a socket.
// dir is DirP2C or DirC2P.
type Mailbox interface {
	// Name is "<app>/<id>".
	Name() string
	// Release ends the hold Open gave.
	Release()
	// Put decides and stores one envelope (env's bytes 1..8 are seq,
	// checked by the caller), charging the envelope bucket and, when
	// notify, the push bucket.
	Put(ctx context.Context, dir byte, seq uint64, env []byte, notify bool, now int64) (PutResult, error)
	// AppendEnvelope appends the stored envelope of seq to dst; found is
	// false when it is not stored (never written, pruned, erased).
	AppendEnvelope(ctx context.Context, dst []byte, dir byte, seq uint64) (out []byte, found bool, err error)
	// HasEnvelope reports whether seq is stored.
	HasEnvelope(ctx context.Context, dir byte, seq uint64) (bool, error)
	// Scan calls fn for each stored envelope above after, ascending, until
	// fn returns false; env is valid only during fn.
	Scan(ctx context.Context, dir byte, after uint64, fn func(seq uint64, env []byte) bool) error
	// State is the direction's stored range and count (HEAD …/<dir>).
	State(ctx context.Context, dir byte) (DirectionState, error)
	// Prune deletes every envelope at or below through and raises the
	// pruned mark to through (never lowers it).
	Prune(ctx context.Context, dir byte, through uint64) error
	// Erase removes the mailbox and everything in it; every watch of it,
	// on every node, ends with ErrErased.
	Erase(ctx context.Context) error
	// PushRegistration reads the sealed registration of a direction
	// (ErrNotFound when none); the others store and remove it.
	PushRegistration(ctx context.Context, dir byte) ([]byte, error)
	SetPushRegistration(ctx context.Context, dir byte, sealed []byte) error
	DeletePushRegistration(ctx context.Context, dir byte) error
	// DropPushRegistration removes the registration only while it is
	// still sent (a provider refused that token): a newer one stays.
	DropPushRegistration(ctx context.Context, dir byte, sent []byte) (bool, error)
	// Watch starts delivering the direction's envelopes above cfg.After
	// (the stored ones ascending, then each new one as it is stored), each
	// once, and returns at once: a watch costs no goroutine of its own
	// while it waits (a backend may run one while it replays). cfg.End is
	// called once, from any goroutine, when the watch ends by itself: the
	// mailbox went (ErrErased), the watcher fell behind
	// (ErrWatchOverflow), Deliver failed (its error) or the store did
	// (wrapping ErrUnavailable). stop ends it; End is not called once
	// stop has returned. ctx bounds the replay.
	Watch(ctx context.Context, dir byte, cfg WatchConfig) (stop func(), err error)
	// JoinWatchers takes one of the direction's MaxWatchers places, across
	// every node; ErrTooManyWatchers when all are taken. leave gives it
	// back (a node that dies gives its places back by itself).
	JoinWatchers(ctx context.Context, dir byte) (leave func(), err error)
	// SetForeground marks the direction's reader in the foreground until
	// until (its watch socket sent ping); Foreground reports whether a
	// reader is, on any node.
	SetForeground(dir byte, until int64)
	Foreground(ctx context.Context, dir byte, now int64) bool
}

// MaxWatchers is the spec's bound on the watch sockets of one direction.
const MaxWatchers = 8

// WatchConfig is one watcher.
type WatchConfig struct {
	// After: deliver every stored envelope above it, then each new one.
	After uint64
	// Deliver sends one envelope. For a replayed one (replayed true) it
	// may wait for room (pacing); for a live one it must not block: a
	// socket whose queue is full closes itself and ends the watch.
	Deliver func(ctx context.Context, env []byte, replayed bool) error
	// End is told why the watch ended by itself (see Mailbox.Watch).
	End func(error)
}

// Why a watch ended or a place was refused.
var (
	ErrForbidden       = errors.New("store: mailbox held by another token")
	ErrErased          = errors.New("store: mailbox erased")
	ErrWatchOverflow   = errors.New("store: watcher fell behind")
	ErrTooManyWatchers = errors.New("store: too many watchers")
)

// ClaimOutcome is the answer to a claim.
type ClaimOutcome int

const (
	ClaimCreated ClaimOutcome = iota + 1 // 201
	ClaimSame                            // 204: a heartbeat
	ClaimTaken                           // 409 taken
)

// PutOutcome is what a Put decided.
type PutOutcome int

const (
	PutCreated     PutOutcome = iota + 1 // 201
	PutRetry                             // 200: the same bytes were stored before (push nothing)
	PutConflict                          // 409: other bytes were stored before
	PutPruned                            // 409: at or below the pruned mark
	PutFull                              // 507
	PutRateLimited                       // 429, RetryAfter set
	PutNoMailbox                         // 404: erased or expired since Open
)

func (o PutOutcome) String() string {
	names := [...]string{"?", "Created", "Retry", "Conflict", "Pruned", "Full", "RateLimited", "NoMailbox"}
	if o < 0 || int(o) >= len(names) {
		return fmt.Sprintf("PutOutcome(%d)", int(o))
	}
	return names[o]
}

// PutResult is a Put's answer.
type PutResult struct {
	Outcome    PutOutcome
	RetryAfter time.Duration // RateLimited: when a token is back
	Push       bool          // Created with notify and a push token taken
	// Foreground: Created with notify, and the reader was in the
	// foreground as far as this node could tell at once: no push token
	// was spent (the push sender asks Foreground again before sending).
	Foreground bool
}

// MailboxStats are a backend's in-memory figures for /metrics. A backend
// may report them by implementing MailboxStatsReporter.
type MailboxStats struct {
	// Loaded is how many mailboxes the node holds in memory.
	Loaded int
	// Envelope cache lookups and the bytes it holds (zero: no cache).
	EnvelopeHits, EnvelopeMisses uint64
	EnvelopeBytes                int
}

// MailboxStatsReporter is implemented by backends that keep mailboxes in
// memory.
type MailboxStatsReporter interface{ MailboxStats() MailboxStats }

// MailboxLimits are the spec's per-mailbox bounds, given to a backend.
type MailboxLimits struct {
	// Idle is RELAY_IDLE: a mailbox with no claim and no write for this
	// long is gone.
	Idle time.Duration
	// TouchEvery is how far a mailbox's last activity may run ahead of
	// what the store holds (0: a hundredth of Idle, at most a minute).
	TouchEvery time.Duration
	// MaxStored, MaxStoredBytes: RELAY_MAX_STORED, RELAY_MAX_STORED_BYTES
	// per direction.
	MaxStored, MaxStoredBytes int
	// The envelope bucket (120, one back every 500 ms) and the push
	// bucket per direction (20, one every 2 s).
	EnvelopeBurst int
	EnvelopeEvery time.Duration
	PushBurst     int
	PushEvery     time.Duration
}

// DefaultMailboxLimits are the spec's.
func DefaultMailboxLimits() MailboxLimits {
	return MailboxLimits{
		Idle: 720 * time.Hour, MaxStored: 4096, MaxStoredBytes: 32 << 20,
		EnvelopeBurst: 120, EnvelopeEvery: time.Second / 2,
		PushBurst: 20, PushEvery: 2 * time.Second,
	}
}

// WithDefaults fills the zero fields with the spec's values.
func (l MailboxLimits) WithDefaults() MailboxLimits {
	d := DefaultMailboxLimits()
	if l.Idle <= 0 {
		l.Idle = d.Idle
	}
	if l.MaxStored <= 0 {
		l.MaxStored = d.MaxStored
	}
	if l.MaxStoredBytes <= 0 {
		l.MaxStoredBytes = d.MaxStoredBytes
	}
	if l.EnvelopeBurst <= 0 || l.EnvelopeEvery <= 0 {
		l.EnvelopeBurst, l.EnvelopeEvery = d.EnvelopeBurst, d.EnvelopeEvery
	}
	if l.PushBurst <= 0 || l.PushEvery <= 0 {
		l.PushBurst, l.PushEvery = d.PushBurst, d.PushEvery
	}
	if l.TouchEvery <= 0 {
		l.TouchEvery = min(l.Idle/100, time.Minute)
	}
	return l
}
