package storetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/store"
)

// Mailboxes is what the mailbox handler asks of its store once the
// decisions move there (docs/cluster-mailbox.md, "Plan", steps 1 and 7):
// the claim outcome, the PUT outcome, prune, erase, scan, state and the
// push registration. It is shaped after store/cluster/mailboxjs, which has
// it (through a thin adapter for the types below); the Pebble side does
// not yet. The types here are meant to move into package store with the
// interface. Watch is not part of it yet: Pebble's watch is the handler's
// own replay and live path, so its shape is settled when that moves.
//
// name is "<app>/<id>", dir is store.DirP2C or store.DirC2P, now is unix
// nanoseconds. Every failure that is not an answer (timeout, no quorum)
// is store.ErrUnavailable.
type Mailboxes interface {
	// Mailbox reads the claim record; store.ErrNotFound when none.
	Mailbox(ctx context.Context, name string) (store.MailboxRecord, error)
	// Claim creates the mailbox for token (or takes over one idle for
	// longer than idle), or answers whether token holds it; a holder's
	// claim moves LastActive to now (a backend that declares
	// CoalescedHeartbeats only once touchEvery has passed since the
	// stored value).
	Claim(ctx context.Context, name string, token store.Hash, now int64, touchEvery, idle time.Duration) (ClaimOutcome, error)
	// Touch moves LastActive forward to now (never back, never creates).
	Touch(ctx context.Context, name string, now int64) error
	// Put decides and stores one envelope (env's bytes 1..8 are seq).
	Put(ctx context.Context, name string, dir byte, seq uint64, env []byte, lim MailboxLimits, now int64) (PutResult, error)
	// Envelope returns one stored envelope's bytes and whether it exists.
	Envelope(ctx context.Context, name string, dir byte, seq uint64) ([]byte, bool, error)
	// Scan calls fn for every stored envelope above after, ascending,
	// until fn returns false; env is fn's to keep. maxBytes (0: the
	// backend's default) bounds one read from the backend, not the scan.
	Scan(ctx context.Context, name string, dir byte, after uint64, maxBytes int, fn func(seq uint64, env []byte) bool) error
	// State is the direction's head (HEAD …/<dir>).
	State(ctx context.Context, name string, dir byte) (MailboxHead, error)
	// Prune deletes every envelope at or below through and raises the
	// pruned mark to through (never lowers it).
	Prune(ctx context.Context, name string, dir byte, through uint64) error
	// Erase removes the mailbox: claim, envelopes, marks, registrations.
	Erase(ctx context.Context, name string) error
	// PushRegistration reads the sealed registration; store.ErrNotFound
	// when none.
	PushRegistration(ctx context.Context, name string, dir byte) ([]byte, error)
	SetPushRegistration(ctx context.Context, name string, dir byte, sealed []byte) error
	DeletePushRegistration(ctx context.Context, name string, dir byte) error
}

// ClaimOutcome is the answer to a claim.
type ClaimOutcome int

const (
	ClaimCreated ClaimOutcome = iota + 1 // 201
	ClaimSame                            // 204
	ClaimTaken                           // 409 taken
)

// PutOutcome is what a Put decided.
type PutOutcome int

const (
	PutCreated     PutOutcome = iota + 1 // 201
	PutRetry                             // 200: the same bytes were stored before
	PutConflict                          // 409: other bytes were stored before
	PutPruned                            // 409: at or below the pruned mark
	PutFull                              // 507
	PutRateLimited                       // 429
	PutNoMailbox                         // 404: no claim (never, or erased meanwhile)
)

func (o PutOutcome) String() string {
	names := [...]string{"?", "Created", "Retry", "Conflict", "Pruned", "Full", "RateLimited", "NoMailbox"}
	if o < 0 || int(o) >= len(names) {
		return fmt.Sprintf("PutOutcome(%d)", int(o))
	}
	return names[o]
}

// MailboxLimits are the per-direction bounds a Put is decided against.
// Zero bursts mean no bucket (Pebble keeps its buckets in the handler).
type MailboxLimits struct {
	MaxStored, MaxStoredBytes int
	EnvelopeBurst             int
	EnvelopeEvery             time.Duration
	PushBurst                 int
	PushEvery                 time.Duration
	Notify                    bool
}

// PutResult is a Put's answer.
type PutResult struct {
	Outcome    PutOutcome
	RetryAfter time.Duration // RateLimited: when a token is back
	Push       bool          // Created with Notify and a push token taken
	Rev        uint64        // Created: the head's revision after the write
}

// MailboxHead is one direction's state. Rev identifies it: every change
// (write, prune) moves it, so a node's cached head is current exactly
// when its Rev equals the store's.
type MailboxHead struct {
	Rev          uint64
	Max          uint64 // highest sequence stored since the last erase
	Count, Bytes int
	Pruned       uint64
	Stored       []SeqRun // sorted, disjoint, inclusive
}

// SeqRun is the inclusive range [From, To] of stored sequences.
type SeqRun struct{ From, To uint64 }

// First is the lowest stored sequence (0: none); Last the highest.
func (h MailboxHead) First() uint64 {
	if len(h.Stored) == 0 {
		return 0
	}
	return h.Stored[0].From
}

func (h MailboxHead) Last() uint64 {
	if len(h.Stored) == 0 {
		return 0
	}
	return h.Stored[len(h.Stored)-1].To
}

// Has reports whether seq is stored.
func (h MailboxHead) Has(seq uint64) bool {
	for _, r := range h.Stored {
		if r.From <= seq && seq <= r.To {
			return true
		}
	}
	return false
}

// MailboxOptions select the optional parts of the contract.
type MailboxOptions struct {
	// RateBuckets: the backend keeps the envelope and push buckets
	// (MailboxLimits' bursts) in the head, as the cluster does. Pebble
	// keeps them in the handler and runs without.
	RateBuckets bool
	// Concurrent: the store decides calls racing on one mailbox itself
	// (the cluster: writers on several nodes). Pebble's handler
	// serializes them per mailbox before the store sees them.
	Concurrent bool

	// The two below are departures from the spec a backend may declare,
	// which skip the strict cases (the zero value is the spec).
	//
	// CoalescedHeartbeats: a 204 claim within touchEvery of the stored
	// LastActive writes nothing, so the idle timer runs from the stored
	// value and a mailbox can expire up to touchEvery before RELAY_IDLE
	// has passed since its last claim (mailboxjs).
	CoalescedHeartbeats bool
	// HeadCaps: a direction whose stored sequences are spread widely is
	// full (507) before it holds MaxStored envelopes, because its stored
	// set has a byte cap (mailboxjs: 146 envelopes when each is 2^40 above
	// the last, 512 at a spacing of 100, 4,084 of 4,096 at 2).
	HeadCaps bool
}

// MailboxEnvelope is a well-formed envelope of seq carrying body.
func MailboxEnvelope(seq uint64, body string) []byte {
	e := []byte{1}
	e = binary.BigEndian.AppendUint64(e, seq)
	e = append(e, body...)
	return append(e, make([]byte, 16)...) // the tag's room
}

// The contract's defaults: RELAY_IDLE, the claim's persist interval and
// RELAY_MAX_STORED / RELAY_MAX_STORED_BYTES.
const (
	mbxIdle       = 720 * time.Hour
	mbxTouchEvery = time.Hour
)

var mbxDefaultLimits = MailboxLimits{MaxStored: 4096, MaxStoredBytes: 32 << 20}

// Mailbox runs the contract of Mailboxes. handles are views of one shared
// state (Pebble: the same store N times; the cluster: one per node); the
// calls of each case go through the handles in turn, and results are read
// back through every handle. Every case uses its own mailbox names, so the
// state needs no reset.
func Mailbox(t *testing.T, handles []Mailboxes, opt MailboxOptions) {
	r := &rotor[Mailboxes]{hs: handles}
	t0 := time.Now().UnixNano()
	ctx := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	tokA, tokB := hash("mbx-token-a"), hash("mbx-token-b")

	claim := func(t *testing.T, h Mailboxes, name string, tok store.Hash, now int64) ClaimOutcome {
		t.Helper()
		o, err := h.Claim(ctx(t), name, tok, now, mbxTouchEvery, mbxIdle)
		if err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		return o
	}
	putLim := func(t *testing.T, h Mailboxes, name string, dir byte, seq uint64, env []byte, lim MailboxLimits, now int64, want PutOutcome) PutResult {
		t.Helper()
		res, err := h.Put(ctx(t), name, dir, seq, env, lim, now)
		if err != nil {
			t.Fatalf("put %s %c %d: %v", name, dir, seq, err)
		}
		if res.Outcome != want {
			t.Fatalf("put %s %c %d: %v, want %v", name, dir, seq, res.Outcome, want)
		}
		if res.Outcome != PutCreated && res.Push {
			t.Fatalf("put %s %c %d: %v pushes", name, dir, seq, res.Outcome)
		}
		return res
	}
	put := func(t *testing.T, h Mailboxes, name string, dir byte, seq uint64, env []byte, want PutOutcome) PutResult {
		t.Helper()
		return putLim(t, h, name, dir, seq, env, mbxDefaultLimits, t0, want)
	}
	body := func(seq uint64) []byte { return MailboxEnvelope(seq, fmt.Sprint("m", seq)) }
	state := func(t *testing.T, h Mailboxes, name string, dir byte) MailboxHead {
		t.Helper()
		s, err := h.State(ctx(t), name, dir)
		if err != nil {
			t.Fatalf("state %s %c: %v", name, dir, err)
		}
		return s
	}
	// scan lists the sequences above after, checking each envelope's bytes
	// against want (nil: body).
	scan := func(t *testing.T, h Mailboxes, name string, dir byte, after uint64, maxBytes int, want func(uint64) []byte) []uint64 {
		t.Helper()
		if want == nil {
			want = body
		}
		var seqs []uint64
		var kept [][]byte
		err := h.Scan(ctx(t), name, dir, after, maxBytes, func(seq uint64, env []byte) bool {
			seqs = append(seqs, seq)
			kept = append(kept, env)
			return true
		})
		if err != nil {
			t.Fatalf("scan %s %c after %d: %v", name, dir, after, err)
		}
		// Checked after the scan: env is the callback's to keep, so a
		// buffer reused by the backend shows here.
		for i, seq := range seqs {
			if !bytes.Equal(kept[i], want(seq)) {
				t.Fatalf("scan %s %c: envelope %d has other bytes (%q)", name, dir, seq, kept[i])
			}
		}
		return seqs
	}
	// headIs checks a direction's head through every handle.
	headIs := func(t *testing.T, name string, dir byte, count, bytes int, pruned uint64, stored []SeqRun) MailboxHead {
		t.Helper()
		var h MailboxHead
		for range handles {
			h = state(t, r.next(), name, dir)
			if h.Count != count || h.Bytes != bytes || h.Pruned != pruned || !slices.Equal(h.Stored, stored) {
				t.Fatalf("head of %s %c: %+v, want count %d bytes %d pruned %d stored %v", name, dir, h, count, bytes, pruned, stored)
			}
		}
		return h
	}
	envelopeIs := func(t *testing.T, name string, dir byte, seq uint64, want []byte) {
		t.Helper()
		for range handles {
			got, ok, err := r.next().Envelope(ctx(t), name, dir, seq)
			if err != nil {
				t.Fatalf("envelope %s %c %d: %v", name, dir, seq, err)
			}
			if ok != (want != nil) || !bytes.Equal(got, want) {
				t.Fatalf("envelope %s %c %d: %q %v, want %q", name, dir, seq, got, ok, want)
			}
		}
	}
	sizes := func(seqs ...uint64) int {
		n := 0
		for _, s := range seqs {
			n += len(body(s))
		}
		return n
	}

	t.Run("Claim", func(t *testing.T) {
		name := "ct/claim1"
		if _, err := r.next().Mailbox(ctx(t), name); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("record before the claim: %v", err)
		}
		if o := claim(t, r.next(), name, tokA, t0); o != ClaimCreated {
			t.Fatalf("first claim: %d", o)
		}
		recordIs := func(t *testing.T, tok store.Hash, active int64) {
			t.Helper()
			for range handles {
				rec, err := r.next().Mailbox(ctx(t), name)
				if err != nil || rec.Token != tok || rec.LastActive != active {
					t.Fatalf("record %+v %v, want token %x active %d", rec, err, tok[:4], active)
				}
			}
		}
		recordIs(t, tokA, t0)
		// Within touchEvery a heartbeat is answered without a write; at
		// touchEvery it moves LastActive.
		if o := claim(t, r.next(), name, tokA, t0+int64(mbxTouchEvery)-1); o != ClaimSame {
			t.Fatalf("same token: %d", o)
		}
		if opt.CoalescedHeartbeats {
			recordIs(t, tokA, t0)
		} else {
			recordIs(t, tokA, t0+int64(mbxTouchEvery)-1)
		}
		if o := claim(t, r.next(), name, tokA, t0+int64(mbxTouchEvery)); o != ClaimSame {
			t.Fatalf("same token at touchEvery: %d", o)
		}
		recordIs(t, tokA, t0+int64(mbxTouchEvery))
		for range handles {
			if o := claim(t, r.next(), name, tokB, t0+int64(mbxTouchEvery)); o != ClaimTaken {
				t.Fatalf("other token: %d", o)
			}
		}
		recordIs(t, tokA, t0+int64(mbxTouchEvery))
	})

	t.Run("Touch", func(t *testing.T) {
		name := "ct/touch1"
		claim(t, r.next(), name, tokA, t0)
		activeIs := func(t *testing.T, want int64) {
			t.Helper()
			for range handles {
				if rec, err := r.next().Mailbox(ctx(t), name); err != nil || rec.LastActive != want {
					t.Fatalf("record %+v %v, want active %d", rec, err, want)
				}
			}
		}
		if err := r.next().Touch(ctx(t), name, t0+5); err != nil {
			t.Fatal(err)
		}
		activeIs(t, t0+5)
		if err := r.next().Touch(ctx(t), name, t0+2); err != nil { // never back
			t.Fatal(err)
		}
		activeIs(t, t0+5)
		if err := r.next().Touch(ctx(t), "ct/touch-none", t0); err != nil {
			t.Fatalf("touch of no mailbox: %v", err)
		}
		if _, err := r.next().Mailbox(ctx(t), "ct/touch-none"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("touch created a mailbox: %v", err)
		}
	})

	t.Run("ClaimOfAnIdleMailbox", func(t *testing.T) {
		name := "ct/idle1"
		claim(t, r.next(), name, tokA, t0)
		writer := r.next() // it wrote, so it may hold the head
		put(t, writer, name, store.DirP2C, 1, body(1), PutCreated)
		if err := r.next().SetPushRegistration(ctx(t), name, store.DirC2P, []byte("sealed")); err != nil {
			t.Fatal(err)
		}
		// At exactly idle it is alive; one nanosecond past it is gone and
		// the new holder finds it empty.
		if o := claim(t, r.next(), name, tokB, t0+int64(mbxIdle)); o != ClaimTaken {
			t.Fatalf("claim at idle: %d", o)
		}
		if o := claim(t, r.next(), name, tokB, t0+int64(mbxIdle)+1); o != ClaimCreated {
			t.Fatalf("claim past idle: %d", o)
		}
		for range handles {
			h := r.next()
			if rec, err := h.Mailbox(ctx(t), name); err != nil || rec.Token != tokB {
				t.Fatalf("record after the takeover: %+v %v", rec, err)
			}
			if got := scan(t, h, name, store.DirP2C, 0, 0, nil); len(got) != 0 {
				t.Fatalf("the old holder's envelopes survived: %v", got)
			}
			if _, err := h.PushRegistration(ctx(t), name, store.DirC2P); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the old holder's registration survived: %v", err)
			}
		}
		put(t, writer, name, store.DirP2C, 1, MailboxEnvelope(1, "new holder"), PutCreated)
		envelopeIs(t, name, store.DirP2C, 1, MailboxEnvelope(1, "new holder"))

		// Its own holder, back after idle, gets a new mailbox too.
		name = "ct/idle3"
		claim(t, r.next(), name, tokA, t0)
		put(t, writer, name, store.DirC2P, 1, body(1), PutCreated)
		if o := claim(t, r.next(), name, tokA, t0+int64(mbxIdle)+1); o != ClaimCreated {
			t.Fatalf("the holder's claim past idle: %d", o)
		}
		envelopeIs(t, name, store.DirC2P, 1, nil)
		headIs(t, name, store.DirC2P, 0, 0, 0, nil)
		put(t, writer, name, store.DirC2P, 1, MailboxEnvelope(1, "again"), PutCreated)

		// A write keeps a mailbox alive: the handler touches the record
		// with it (once per touchEvery).
		name = "ct/idle2"
		claim(t, r.next(), name, tokA, t0)
		putLim(t, r.next(), name, store.DirC2P, 1, body(1), mbxDefaultLimits, t0+int64(mbxIdle), PutCreated)
		if err := r.next().Touch(ctx(t), name, t0+int64(mbxIdle)); err != nil {
			t.Fatal(err)
		}
		if o := claim(t, r.next(), name, tokB, t0+int64(mbxIdle)+1); o != ClaimTaken {
			t.Fatalf("claim of a mailbox kept by a write: %d", o)
		}
		if o := claim(t, r.next(), name, tokA, t0+int64(mbxIdle)+1); o != ClaimSame {
			t.Fatalf("holder's claim of a mailbox kept by a write: %d", o)
		}
	})

	t.Run("HeartbeatRestartsIdle", func(t *testing.T) {
		if opt.CoalescedHeartbeats {
			t.Skip("the backend coalesces heartbeats within touchEvery")
		}
		// "204 … restarts the idle timer": idle runs from the last claim,
		// however soon after the one before it came.
		name := "ct/heartbeat1"
		claim(t, r.next(), name, tokA, t0)
		t1 := t0 + int64(mbxTouchEvery)/2
		if o := claim(t, r.next(), name, tokA, t1); o != ClaimSame {
			t.Fatalf("heartbeat: %d", o)
		}
		if o := claim(t, r.next(), name, tokB, t1+int64(mbxIdle)); o != ClaimTaken {
			t.Fatalf("claim at idle after the heartbeat: %d", o)
		}
		if o := claim(t, r.next(), name, tokB, t1+int64(mbxIdle)+1); o != ClaimCreated {
			t.Fatalf("claim past idle after the heartbeat: %d", o)
		}
	})

	t.Run("PutOutcomes", func(t *testing.T) {
		name := "ct/put1"
		for range handles {
			put(t, r.next(), name, store.DirP2C, 1, body(1), PutNoMailbox)
		}
		claim(t, r.next(), name, tokA, t0)
		headIs(t, name, store.DirP2C, 0, 0, 0, nil)
		res := put(t, r.next(), name, store.DirP2C, 1, body(1), PutCreated)
		if res.Push {
			t.Fatal("a put without Notify pushes")
		}
		for range handles {
			put(t, r.next(), name, store.DirP2C, 1, body(1), PutRetry)
			put(t, r.next(), name, store.DirP2C, 1, MailboxEnvelope(1, "other"), PutConflict)
		}
		envelopeIs(t, name, store.DirP2C, 1, body(1))
		headIs(t, name, store.DirP2C, 1, sizes(1), 0, []SeqRun{{1, 1}})
		// The other direction is its own.
		headIs(t, name, store.DirC2P, 0, 0, 0, nil)
		envelopeIs(t, name, store.DirC2P, 1, nil)
		put(t, r.next(), name, store.DirC2P, 1, MailboxEnvelope(1, "c2p"), PutCreated)
		envelopeIs(t, name, store.DirC2P, 1, MailboxEnvelope(1, "c2p"))
		envelopeIs(t, name, store.DirP2C, 1, body(1))
	})

	t.Run("OutOfOrder", func(t *testing.T) {
		name := "ct/ooo1"
		claim(t, r.next(), name, tokA, t0)
		for _, seq := range []uint64{1, 2, 5, 3} { // 3 below the max
			put(t, r.next(), name, store.DirC2P, seq, body(seq), PutCreated)
		}
		h := headIs(t, name, store.DirC2P, 4, sizes(1, 2, 3, 5), 0, []SeqRun{{1, 3}, {5, 5}})
		if h.Max != 5 || h.First() != 1 || h.Last() != 5 || h.Has(4) || !h.Has(3) {
			t.Fatalf("head %+v", h)
		}
		envelopeIs(t, name, store.DirC2P, 3, body(3))
		envelopeIs(t, name, store.DirC2P, 4, nil)
		for range handles {
			if got := scan(t, r.next(), name, store.DirC2P, 0, 0, nil); !slices.Equal(got, []uint64{1, 2, 3, 5}) {
				t.Fatalf("scan %v", got)
			}
		}
		put(t, r.next(), name, store.DirC2P, 3, body(3), PutRetry)
		put(t, r.next(), name, store.DirC2P, 3, MailboxEnvelope(3, "other"), PutConflict)
		put(t, r.next(), name, store.DirC2P, 4, body(4), PutCreated)
		headIs(t, name, store.DirC2P, 5, sizes(1, 2, 3, 4, 5), 0, []SeqRun{{1, 5}})
		if got := scan(t, r.next(), name, store.DirC2P, 2, 0, nil); !slices.Equal(got, []uint64{3, 4, 5}) {
			t.Fatalf("scan after 2: %v", got)
		}
		// A hole far below the max, then the max moves on.
		put(t, r.next(), name, store.DirC2P, 9, body(9), PutCreated)
		put(t, r.next(), name, store.DirC2P, 7, body(7), PutCreated)
		put(t, r.next(), name, store.DirC2P, 10, body(10), PutCreated)
		if got := scan(t, r.next(), name, store.DirC2P, 4, 0, nil); !slices.Equal(got, []uint64{5, 7, 9, 10}) {
			t.Fatalf("scan after 4: %v", got)
		}
	})

	t.Run("Limits", func(t *testing.T) {
		// Count: at the bound stored, one past full and nothing stored.
		name := "ct/count1"
		claim(t, r.next(), name, tokA, t0)
		lim := MailboxLimits{MaxStored: 3, MaxStoredBytes: 1 << 20}
		for seq := uint64(1); seq <= 3; seq++ {
			putLim(t, r.next(), name, store.DirP2C, seq, body(seq), lim, t0, PutCreated)
		}
		for range handles {
			putLim(t, r.next(), name, store.DirP2C, 4, body(4), lim, t0, PutFull)
		}
		headIs(t, name, store.DirP2C, 3, sizes(1, 2, 3), 0, []SeqRun{{1, 3}})
		envelopeIs(t, name, store.DirP2C, 4, nil)
		// A full direction still answers retries and conflicts as such.
		putLim(t, r.next(), name, store.DirP2C, 2, body(2), lim, t0, PutRetry)
		putLim(t, r.next(), name, store.DirP2C, 2, MailboxEnvelope(2, "other"), lim, t0, PutConflict)
		// A prune frees room: one more fits, then full again.
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 1); err != nil {
			t.Fatal(err)
		}
		putLim(t, r.next(), name, store.DirP2C, 1, body(1), lim, t0, PutPruned) // the mark before 507
		putLim(t, r.next(), name, store.DirP2C, 4, body(4), lim, t0, PutCreated)
		putLim(t, r.next(), name, store.DirP2C, 5, body(5), lim, t0, PutFull)
		headIs(t, name, store.DirP2C, 3, sizes(2, 3, 4), 1, []SeqRun{{2, 4}})

		// Bytes: exactly at the bound stored, one byte past full.
		name = "ct/bytes1"
		claim(t, r.next(), name, tokA, t0)
		e1, e2 := MailboxEnvelope(1, "abcd"), MailboxEnvelope(2, "abcde")
		lim = MailboxLimits{MaxStored: 10, MaxStoredBytes: len(e1) + len(e2)}
		putLim(t, r.next(), name, store.DirC2P, 1, e1, lim, t0, PutCreated)
		putLim(t, r.next(), name, store.DirC2P, 2, e2, lim, t0, PutCreated)
		for range handles {
			putLim(t, r.next(), name, store.DirC2P, 3, MailboxEnvelope(3, ""), lim, t0, PutFull)
		}
		headIs(t, name, store.DirC2P, 2, len(e1)+len(e2), 0, []SeqRun{{1, 2}})
		name = "ct/bytes2"
		claim(t, r.next(), name, tokA, t0)
		lim = MailboxLimits{MaxStored: 10, MaxStoredBytes: len(e2) - 1}
		putLim(t, r.next(), name, store.DirC2P, 2, e2, lim, t0, PutFull) // one envelope past the bound
		lim.MaxStoredBytes++
		putLim(t, r.next(), name, store.DirC2P, 2, e2, lim, t0, PutCreated)
	})

	t.Run("LimitsWhateverTheSpacing", func(t *testing.T) {
		if opt.HeadCaps {
			t.Skip("the backend caps the stored set's encoding")
		}
		// MaxStored envelopes fit however far apart their sequences are.
		name := "ct/spread1"
		claim(t, r.next(), name, tokA, t0)
		const n, gap = 200, uint64(1) << 40
		lim := MailboxLimits{MaxStored: n, MaxStoredBytes: 1 << 20}
		for i := uint64(1); i <= n; i++ {
			putLim(t, r.next(), name, store.DirP2C, i*gap, body(i*gap), lim, t0, PutCreated)
		}
		putLim(t, r.next(), name, store.DirP2C, (n+1)*gap, body((n+1)*gap), lim, t0, PutFull)
		if h := state(t, r.next(), name, store.DirP2C); h.Count != n || len(h.Stored) != n {
			t.Fatalf("head: count %d, %d runs", h.Count, len(h.Stored))
		}
	})

	t.Run("Scan", func(t *testing.T) {
		name := "ct/scan1"
		claim(t, r.next(), name, tokA, t0)
		for seq := uint64(1); seq <= 12; seq++ {
			if seq == 6 {
				continue // filled below the max
			}
			put(t, r.next(), name, store.DirP2C, seq, body(seq), PutCreated)
		}
		put(t, r.next(), name, store.DirP2C, 6, body(6), PutCreated)
		all := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
		one := len(body(10))
		for _, maxBytes := range []int{0, 1, one, 3*one + 1, 1 << 20} {
			for _, after := range []uint64{0, 1, 5, 6, 11, 12, 100} {
				want := all[min(int(after), len(all)):]
				if got := scan(t, r.next(), name, store.DirP2C, after, maxBytes, nil); !slices.Equal(got, want) {
					t.Fatalf("scan after %d, maxBytes %d: %v, want %v", after, maxBytes, got, want)
				}
			}
		}
		// fn stops it at once.
		var got []uint64
		err := r.next().Scan(ctx(t), name, store.DirP2C, 2, one, func(seq uint64, env []byte) bool {
			got = append(got, seq)
			return len(got) < 3
		})
		if err != nil || !slices.Equal(got, []uint64{3, 4, 5}) {
			t.Fatalf("stopped scan: %v %v", got, err)
		}
		// Nothing to list: an empty direction, a mailbox that never was.
		if got := scan(t, r.next(), name, store.DirC2P, 0, 0, nil); len(got) != 0 {
			t.Fatalf("empty direction: %v", got)
		}
		if got := scan(t, r.next(), "ct/scan-none", store.DirC2P, 0, 0, nil); len(got) != 0 {
			t.Fatalf("no mailbox: %v", got)
		}
	})

	t.Run("StateAndPrune", func(t *testing.T) {
		name := "ct/prune1"
		claim(t, r.next(), name, tokA, t0)
		var res PutResult
		for _, seq := range []uint64{1, 2, 3, 5, 6, 4} {
			res = put(t, r.next(), name, store.DirP2C, seq, body(seq), PutCreated)
		}
		h := headIs(t, name, store.DirP2C, 6, sizes(1, 2, 3, 4, 5, 6), 0, []SeqRun{{1, 6}})
		if res.Rev == 0 || h.Rev != res.Rev || h.Max != 6 {
			t.Fatalf("head %+v after a put of rev %d", h, res.Rev)
		}
		// Through 0 removes nothing.
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 0); err != nil {
			t.Fatal(err)
		}
		headIs(t, name, store.DirP2C, 6, sizes(1, 2, 3, 4, 5, 6), 0, []SeqRun{{1, 6}})
		// Through 4: the out-of-order 4 and the in-order ones below it go.
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 4); err != nil {
			t.Fatal(err)
		}
		h2 := headIs(t, name, store.DirP2C, 2, sizes(5, 6), 4, []SeqRun{{5, 6}})
		if h2.Rev == h.Rev {
			t.Fatalf("a prune left the revision at %d", h.Rev)
		}
		for range handles {
			if got := scan(t, r.next(), name, store.DirP2C, 0, 0, nil); !slices.Equal(got, []uint64{5, 6}) {
				t.Fatalf("scan after prune: %v", got)
			}
		}
		for _, seq := range []uint64{1, 4} {
			envelopeIs(t, name, store.DirP2C, seq, nil)
			put(t, r.next(), name, store.DirP2C, seq, body(seq), PutPruned)
		}
		// A lower mark does not lower it.
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 2); err != nil {
			t.Fatal(err)
		}
		headIs(t, name, store.DirP2C, 2, sizes(5, 6), 4, []SeqRun{{5, 6}})
		put(t, r.next(), name, store.DirP2C, 3, body(3), PutPruned)
		put(t, r.next(), name, store.DirP2C, 7, body(7), PutCreated)
		// Past the last: empty, and the mark holds above it.
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 100); err != nil {
			t.Fatal(err)
		}
		headIs(t, name, store.DirP2C, 0, 0, 100, nil)
		put(t, r.next(), name, store.DirP2C, 50, body(50), PutPruned)
		put(t, r.next(), name, store.DirP2C, 100, body(100), PutPruned)
		put(t, r.next(), name, store.DirP2C, 101, body(101), PutCreated)
		headIs(t, name, store.DirP2C, 1, sizes(101), 100, []SeqRun{{101, 101}})
		if got := scan(t, r.next(), name, store.DirP2C, 0, 0, nil); !slices.Equal(got, []uint64{101}) {
			t.Fatalf("scan: %v", got)
		}
		// A direction never written keeps a mark too.
		if err := r.next().Prune(ctx(t), name, store.DirC2P, 5); err != nil {
			t.Fatal(err)
		}
		headIs(t, name, store.DirC2P, 0, 0, 5, nil)
		put(t, r.next(), name, store.DirC2P, 5, body(5), PutPruned)
		put(t, r.next(), name, store.DirC2P, 6, body(6), PutCreated)
		headIs(t, name, store.DirC2P, 1, sizes(6), 5, []SeqRun{{6, 6}})
	})

	t.Run("PruneSeenByTheWriter", func(t *testing.T) {
		// A handle that wrote (and may hold the head) answers from the
		// prune another handle made.
		name := "ct/stale1"
		claim(t, r.next(), name, tokA, t0)
		writer := r.next()
		for seq := uint64(1); seq <= 3; seq++ {
			put(t, writer, name, store.DirP2C, seq, body(seq), PutCreated)
		}
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 2); err != nil {
			t.Fatal(err)
		}
		put(t, writer, name, store.DirP2C, 2, body(2), PutPruned)
		put(t, writer, name, store.DirP2C, 1, MailboxEnvelope(1, "other"), PutPruned)
		put(t, writer, name, store.DirP2C, 3, body(3), PutRetry)
		// Room freed elsewhere is room for the writer.
		lim := MailboxLimits{MaxStored: 2, MaxStoredBytes: 1 << 20}
		putLim(t, writer, name, store.DirP2C, 4, body(4), lim, t0, PutCreated)
		putLim(t, writer, name, store.DirP2C, 5, body(5), lim, t0, PutFull)
		if err := r.next().Prune(ctx(t), name, store.DirP2C, 3); err != nil {
			t.Fatal(err)
		}
		putLim(t, writer, name, store.DirP2C, 5, body(5), lim, t0, PutCreated)
		headIs(t, name, store.DirP2C, 2, sizes(4, 5), 3, []SeqRun{{4, 5}})
	})

	t.Run("PruneKeepingAnOutOfOrderFirst", func(t *testing.T) {
		// The first envelope kept was written below the max: the bytes
		// freed still come out exact.
		name := "ct/prune2"
		claim(t, r.next(), name, tokA, t0)
		for _, seq := range []uint64{1, 2, 8, 3, 5, 4, 9} { // 3, 4, 5 out of order
			put(t, r.next(), name, store.DirC2P, seq, body(seq), PutCreated)
		}
		if err := r.next().Prune(ctx(t), name, store.DirC2P, 2); err != nil {
			t.Fatal(err)
		}
		headIs(t, name, store.DirC2P, 5, sizes(3, 4, 5, 8, 9), 2, []SeqRun{{3, 5}, {8, 9}})
		if err := r.next().Prune(ctx(t), name, store.DirC2P, 6); err != nil { // through a hole
			t.Fatal(err)
		}
		headIs(t, name, store.DirC2P, 2, sizes(8, 9), 6, []SeqRun{{8, 9}})
		put(t, r.next(), name, store.DirC2P, 7, body(7), PutCreated)
		headIs(t, name, store.DirC2P, 3, sizes(7, 8, 9), 6, []SeqRun{{7, 9}})
		if got := scan(t, r.next(), name, store.DirC2P, 0, 0, nil); !slices.Equal(got, []uint64{7, 8, 9}) {
			t.Fatalf("scan: %v", got)
		}
		if err := r.next().Prune(ctx(t), name, store.DirC2P, 8); err != nil { // the out-of-order 7 and the in-order 8
			t.Fatal(err)
		}
		headIs(t, name, store.DirC2P, 1, sizes(9), 8, []SeqRun{{9, 9}})
	})

	t.Run("ScanLongAndLarge", func(t *testing.T) {
		// More envelopes than one read returns, and envelopes whose sum
		// is over any one read's byte bound.
		name := "ct/scan2"
		claim(t, r.next(), name, tokA, t0)
		const many = 300
		want := make([]uint64, many)
		for i := range want {
			want[i] = uint64(i + 1)
			put(t, r.next(), name, store.DirP2C, want[i], body(want[i]), PutCreated)
		}
		for _, after := range []uint64{0, 255, 256, 299} {
			if got := scan(t, r.next(), name, store.DirP2C, after, 0, nil); !slices.Equal(got, want[after:]) {
				t.Fatalf("scan after %d: %d envelopes, want %d", after, len(got), many-int(after))
			}
		}
		large := func(seq uint64) []byte { return MailboxEnvelope(seq, strings.Repeat(fmt.Sprint(seq%10), 65536-25)) }
		for seq := uint64(1); seq <= 20; seq++ {
			put(t, r.next(), name, store.DirC2P, seq, large(seq), PutCreated)
		}
		headIs(t, name, store.DirC2P, 20, 20*65536, 0, []SeqRun{{1, 20}})
		for _, maxBytes := range []int{0, 1, 65536, 100 << 10} {
			if got := scan(t, r.next(), name, store.DirC2P, 3, maxBytes, large); len(got) != 17 || got[0] != 4 || got[16] != 20 {
				t.Fatalf("scan of large envelopes, maxBytes %d: %v", maxBytes, got)
			}
		}
	})

	t.Run("Erase", func(t *testing.T) {
		name := "ct/erase1"
		claim(t, r.next(), name, tokA, t0)
		writer := r.next() // it wrote last, so it may hold the head
		for seq := uint64(1); seq <= 3; seq++ {
			put(t, writer, name, store.DirP2C, seq, body(seq), PutCreated)
			put(t, writer, name, store.DirC2P, seq, body(seq), PutCreated)
		}
		if err := writer.Prune(ctx(t), name, store.DirC2P, 2); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []byte{store.DirP2C, store.DirC2P} {
			if err := writer.SetPushRegistration(ctx(t), name, dir, []byte("sealed")); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.next().Erase(ctx(t), name); err != nil {
			t.Fatal(err)
		}
		gone := func(t *testing.T) {
			t.Helper()
			for range handles {
				h := r.next()
				if _, err := h.Mailbox(ctx(t), name); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("record after erase: %v", err)
				}
				for _, dir := range []byte{store.DirP2C, store.DirC2P} {
					if _, err := h.PushRegistration(ctx(t), name, dir); !errors.Is(err, store.ErrNotFound) {
						t.Fatalf("registration %c after erase: %v", dir, err)
					}
					if got := scan(t, h, name, dir, 0, 0, nil); len(got) != 0 {
						t.Fatalf("scan %c after erase: %v", dir, got)
					}
				}
			}
			for _, dir := range []byte{store.DirP2C, store.DirC2P} {
				headIs(t, name, dir, 0, 0, 0, nil)
				envelopeIs(t, name, dir, 3, nil)
			}
		}
		gone(t)
		// The node that wrote last learns of the erase from the store.
		put(t, writer, name, store.DirP2C, 4, body(4), PutNoMailbox)
		put(t, writer, name, store.DirP2C, 1, body(1), PutNoMailbox)
		for range handles {
			put(t, r.next(), name, store.DirC2P, 4, body(4), PutNoMailbox)
		}
		gone(t)
		if err := r.next().Erase(ctx(t), name); err != nil {
			t.Fatalf("erase of an erased mailbox: %v", err)
		}
		// A new claim starts empty: no mark, no envelopes, any bytes.
		if o := claim(t, r.next(), name, tokB, t0); o != ClaimCreated {
			t.Fatalf("claim after erase: %d", o)
		}
		fresh := func(seq uint64) []byte { return MailboxEnvelope(seq, "fresh") }
		put(t, writer, name, store.DirP2C, 1, fresh(1), PutCreated)
		put(t, writer, name, store.DirC2P, 1, fresh(1), PutCreated)
		envelopeIs(t, name, store.DirP2C, 1, fresh(1))
		headIs(t, name, store.DirC2P, 1, len(fresh(1)), 0, []SeqRun{{1, 1}})
		if got := scan(t, r.next(), name, store.DirP2C, 0, 0, fresh); !slices.Equal(got, []uint64{1}) {
			t.Fatalf("scan after the new claim: %v", got)
		}
		if err := r.next().Erase(ctx(t), "ct/erase-none"); err != nil {
			t.Fatalf("erase of no mailbox: %v", err)
		}
	})

	t.Run("PushRegistration", func(t *testing.T) {
		name := "ct/push1"
		claim(t, r.next(), name, tokA, t0)
		regIs := func(t *testing.T, dir byte, want string) {
			t.Helper()
			for range handles {
				got, err := r.next().PushRegistration(ctx(t), name, dir)
				if want == "" {
					if !errors.Is(err, store.ErrNotFound) {
						t.Fatalf("registration %c: %q %v, want none", dir, got, err)
					}
					continue
				}
				if err != nil || string(got) != want {
					t.Fatalf("registration %c: %q %v, want %q", dir, got, err, want)
				}
			}
		}
		regIs(t, store.DirC2P, "")
		for _, v := range []string{"one", "two"} { // the second replaces the first
			if err := r.next().SetPushRegistration(ctx(t), name, store.DirC2P, []byte(v)); err != nil {
				t.Fatal(err)
			}
			regIs(t, store.DirC2P, v)
		}
		regIs(t, store.DirP2C, "")
		if err := r.next().SetPushRegistration(ctx(t), name, store.DirP2C, []byte("p")); err != nil {
			t.Fatal(err)
		}
		if err := r.next().DeletePushRegistration(ctx(t), name, store.DirC2P); err != nil {
			t.Fatal(err)
		}
		regIs(t, store.DirC2P, "")
		regIs(t, store.DirP2C, "p")
		if err := r.next().DeletePushRegistration(ctx(t), name, store.DirC2P); err != nil {
			t.Fatalf("delete of no registration: %v", err)
		}
	})

	t.Run("RateBuckets", func(t *testing.T) {
		if !opt.RateBuckets {
			t.Skip("the handler keeps the buckets")
		}
		name := "ct/rate1"
		claim(t, r.next(), name, tokA, t0)
		every := time.Hour
		lim := MailboxLimits{MaxStored: 10, MaxStoredBytes: 1 << 20, EnvelopeBurst: 3, EnvelopeEvery: every, PushBurst: 2, PushEvery: every, Notify: true}
		for seq := uint64(1); seq <= 3; seq++ {
			if res := putLim(t, r.next(), name, store.DirP2C, seq, body(seq), lim, t0, PutCreated); res.Push != (seq <= 2) {
				t.Fatalf("seq %d: push %v", seq, res.Push)
			}
		}
		res := putLim(t, r.next(), name, store.DirP2C, 4, body(4), lim, t0, PutRateLimited)
		if res.RetryAfter <= 0 || res.RetryAfter > every {
			t.Fatalf("retry after %v", res.RetryAfter)
		}
		headIs(t, name, store.DirP2C, 3, sizes(1, 2, 3), 0, []SeqRun{{1, 3}})
		// A retry costs no token and is not refused by an empty bucket.
		putLim(t, r.next(), name, store.DirP2C, 1, body(1), lim, t0, PutRetry)
		// A token back after every, in both buckets.
		if res := putLim(t, r.next(), name, store.DirP2C, 4, body(4), lim, t0+int64(every), PutCreated); !res.Push {
			t.Fatal("no push with a token back")
		}
		// The other direction has its own buckets (p2c's push bucket is
		// empty at t0), and a put without Notify takes no push token.
		lim = MailboxLimits{MaxStored: 10, MaxStoredBytes: 1 << 20, PushBurst: 1, PushEvery: every}
		putLim(t, r.next(), name, store.DirC2P, 1, body(1), lim, t0, PutCreated)
		lim.Notify = true
		if res := putLim(t, r.next(), name, store.DirC2P, 2, body(2), lim, t0, PutCreated); !res.Push {
			t.Fatal("c2p: no push from a full bucket")
		}
		if res := putLim(t, r.next(), name, store.DirC2P, 3, body(3), lim, t0, PutCreated); res.Push {
			t.Fatal("c2p: pushed from an empty bucket")
		}
	})

	if !opt.Concurrent {
		return
	}
	t.Run("Racing", func(t *testing.T) {
		// Every handle at once, several calls each: the store's answers
		// are exact as if they came one by one.
		race := func(n int, call func(i int)) {
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { call(i) })
			}
			wg.Wait()
		}
		const racers = 6
		hs := make([]Mailboxes, racers)
		for i := range hs {
			hs[i] = r.next()
		}
		count := func(outs []PutOutcome, o PutOutcome) int {
			n := 0
			for _, x := range outs {
				if x == o {
					n++
				}
			}
			return n
		}
		// One claim wins.
		name := "ct/race1"
		claims := make([]ClaimOutcome, racers)
		race(racers, func(i int) {
			o, err := hs[i].Claim(ctx(t), name, hash(fmt.Sprint("race-token-", i)), t0, mbxTouchEvery, mbxIdle)
			if err != nil {
				t.Errorf("claim %d: %v", i, err)
			}
			claims[i] = o
		})
		winner := slices.Index(claims, ClaimCreated)
		if winner < 0 || slices.Index(claims[winner+1:], ClaimCreated) >= 0 {
			t.Fatalf("claims: %v", claims)
		}
		if rec, err := r.next().Mailbox(ctx(t), name); err != nil || rec.Token != hash(fmt.Sprint("race-token-", winner)) {
			t.Fatalf("record %+v %v, want racer %d's token", rec, err, winner)
		}
		// One seq, other bytes: one stored, the rest conflicts.
		outs := make([]PutOutcome, racers)
		race(racers, func(i int) {
			res, err := hs[i].Put(ctx(t), name, store.DirP2C, 1, MailboxEnvelope(1, fmt.Sprint("racer", i)), mbxDefaultLimits, t0)
			if err != nil {
				t.Errorf("put %d: %v", i, err)
			}
			outs[i] = res.Outcome
		})
		if count(outs, PutCreated) != 1 || count(outs, PutConflict) != racers-1 {
			t.Fatalf("racing puts of seq 1: %v", outs)
		}
		won := slices.Index(outs, PutCreated)
		envelopeIs(t, name, store.DirP2C, 1, MailboxEnvelope(1, fmt.Sprint("racer", won)))
		// The same bytes: one stored, the rest retries.
		race(racers, func(i int) {
			res, err := hs[i].Put(ctx(t), name, store.DirP2C, 2, body(2), mbxDefaultLimits, t0)
			if err != nil {
				t.Errorf("put %d: %v", i, err)
			}
			outs[i] = res.Outcome
		})
		if count(outs, PutCreated) != 1 || count(outs, PutRetry) != racers-1 {
			t.Fatalf("racing retries of seq 2: %v", outs)
		}
		// Distinct seqs against a count bound: exactly the bound stored.
		const each, bound = 4, 10
		lim := MailboxLimits{MaxStored: bound, MaxStoredBytes: 1 << 20}
		all := make([]PutOutcome, racers*each)
		race(racers, func(i int) {
			for j := range each {
				seq := uint64(3 + i*each + j)
				res, err := hs[i].Put(ctx(t), name, store.DirC2P, seq, body(seq), lim, t0)
				if err != nil {
					t.Errorf("put %d: %v", seq, err)
				}
				all[i*each+j] = res.Outcome
			}
		})
		if count(all, PutCreated) != bound || count(all, PutFull) != len(all)-bound {
			t.Fatalf("racing puts against a bound of %d: %v", bound, all)
		}
		h := state(t, r.next(), name, store.DirC2P)
		var stored []uint64
		if err := r.next().Scan(ctx(t), name, store.DirC2P, 0, 0, func(seq uint64, env []byte) bool {
			stored = append(stored, seq)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if h.Count != bound || len(stored) != bound {
			t.Fatalf("after racing puts: head %+v, scan %v", h, stored)
		}
		if opt.RateBuckets {
			// A burst is exact across racers too.
			name := "ct/race2"
			claim(t, r.next(), name, tokA, t0)
			lim := MailboxLimits{MaxStored: 100, MaxStoredBytes: 1 << 20, EnvelopeBurst: 7, EnvelopeEvery: time.Hour}
			race(racers, func(i int) {
				for j := range each {
					seq := uint64(1 + i*each + j)
					res, err := hs[i].Put(ctx(t), name, store.DirP2C, seq, body(seq), lim, t0)
					if err != nil {
						t.Errorf("put %d: %v", seq, err)
					}
					all[i*each+j] = res.Outcome
				}
			})
			if count(all, PutCreated) != 7 || count(all, PutRateLimited) != len(all)-7 {
				t.Fatalf("racing puts against a burst of 7: %v", all)
			}
		}
	})
}
