package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// Mailbox keys. A mailbox is named by "<app>/<id>"; neither part can hold
// a '/', so the name ends unambiguously at the '/' that follows it and every
// record of one mailbox shares a prefix:
//
//	'm' 'b' <app>/<id>                      mailbox record: token hash (32) | last active (8, unix ns)
//	'm' 'e' <app>/<id>/ <dir> <seq 8 BE>    envelope bytes
//	'm' 'k' <app>/<id>/ <dir>               pruned mark (8 BE)
//	'm' 'r' <app>/<id>/ <dir>               push registration (sealed)
//	'm' 'i' <last active 8 BE> <app>/<id>   idle index, oldest first
//
// dir is 'p' for p2c and 'c' for c2p.
const (
	serviceMailbox = 'm'

	kindMailbox  = 'b'
	kindEnvelope = 'e'
	kindPruned   = 'k'
	kindPush     = 'r'
	kindIdle     = 'i'
)

// Direction bytes of the keyspace.
const (
	DirP2C byte = 'p'
	DirC2P byte = 'c'
)

// MaxMailboxName bounds "<app>/<id>": 32 + 1 + 64.
const MaxMailboxName = 97

// maxEnvelopeKey is the longest envelope key.
const maxEnvelopeKey = 2 + MaxMailboxName + 1 + 1 + 8

// MailboxRecord is a mailbox's durable header.
type MailboxRecord struct {
	Token      Hash
	LastActive int64 // unix nanoseconds of the last claim or write
}

// EnvelopeLog keeps the mailboxes: their records, envelopes, pruned marks
// and the idle index. It has no lock of its own: the mailbox handler
// serializes the state changes of one mailbox, and Pebble orders the rest.
type EnvelopeLog struct {
	db *DB
	// keys pools envelope-key buffers: a key handed to Pebble escapes, so
	// a stack buffer would be one allocation per read.
	keys sync.Pool
}

// NewEnvelopeLog returns the mailbox keyspace of db.
func NewEnvelopeLog(db *DB) *EnvelopeLog {
	l := &EnvelopeLog{db: db}
	l.keys.New = func() any { return new([maxEnvelopeKey]byte) }
	return l
}

// EnvelopeKey appends the key of one envelope to dst (no allocation when
// dst has room for maxEnvelopeKey bytes).
func EnvelopeKey(dst []byte, name string, dir byte, seq uint64) []byte {
	dst = append(dst, serviceMailbox, kindEnvelope)
	dst = append(dst, name...)
	dst = append(dst, '/', dir)
	return binary.BigEndian.AppendUint64(dst, seq)
}

func envelopePrefix(name string, dir byte) []byte {
	k := append([]byte{serviceMailbox, kindEnvelope}, name...)
	return append(k, '/', dir)
}

func mailboxKey(name string) []byte {
	return append([]byte{serviceMailbox, kindMailbox}, name...)
}

func idleKey(at int64, name string) []byte {
	k := binary.BigEndian.AppendUint64([]byte{serviceMailbox, kindIdle}, uint64(at))
	return append(k, name...)
}

func markKey(kind byte, name string, dir byte) []byte {
	k := append([]byte{serviceMailbox, kind}, name...)
	return append(k, '/', dir)
}

// Mailbox reads a mailbox's record; ErrNotFound when it has none.
func (l *EnvelopeLog) Mailbox(name string) (MailboxRecord, error) {
	raw, err := l.db.Get(mailboxKey(name))
	if err != nil {
		return MailboxRecord{}, err
	}
	if len(raw) != HashLen+8 {
		return MailboxRecord{}, fmt.Errorf("store: mailbox record of %d bytes", len(raw))
	}
	var r MailboxRecord
	copy(r.Token[:], raw)
	r.LastActive = int64(binary.BigEndian.Uint64(raw[HashLen:]))
	return r, nil
}

func (l *EnvelopeLog) setRecord(b *Batch, name string, r MailboxRecord, prevActive int64) error {
	raw := make([]byte, HashLen+8)
	copy(raw, r.Token[:])
	binary.BigEndian.PutUint64(raw[HashLen:], uint64(r.LastActive))
	if prevActive != 0 {
		if err := b.Delete(idleKey(prevActive, name)); err != nil {
			return err
		}
	}
	if err := b.Set(idleKey(r.LastActive, name), nil); err != nil {
		return err
	}
	return b.Set(mailboxKey(name), raw)
}

// Claim writes a mailbox record (a new claim, or a heartbeat that moves
// LastActive from prevActive; prevActive 0 for a new mailbox). When fresh
// is true everything a previous, expired holder left is erased in the same
// durable batch.
func (l *EnvelopeLog) Claim(name string, r MailboxRecord, prevActive int64, fresh bool) error {
	b := l.db.NewBatch()
	if fresh {
		if err := l.eraseInto(b, name); err != nil {
			b.Discard()
			return err
		}
	}
	if err := l.setRecord(b, name, r, prevActive); err != nil {
		b.Discard()
		return err
	}
	return l.db.Commit(b)
}

// Put stores one envelope durably and, when touch is not nil, moves the
// mailbox's LastActive (from prevActive) in the same batch.
func (l *EnvelopeLog) Put(name string, dir byte, seq uint64, env []byte, touch *MailboxRecord, prevActive int64) error {
	b := l.db.NewBatch()
	var kb [maxEnvelopeKey]byte
	if err := b.Set(EnvelopeKey(kb[:0], name, dir, seq), env); err != nil {
		b.Discard()
		return err
	}
	if touch != nil {
		if err := l.setRecord(b, name, *touch, prevActive); err != nil {
			b.Discard()
			return err
		}
	}
	return l.db.Commit(b)
}

// Envelope calls fn with the stored bytes of one envelope (valid only
// during fn) and reports whether it exists.
func (l *EnvelopeLog) Envelope(name string, dir byte, seq uint64, fn func(env []byte)) (bool, error) {
	kb := l.keys.Get().(*[maxEnvelopeKey]byte)
	defer l.keys.Put(kb)
	v, closer, err := l.db.pdb.Get(EnvelopeKey(kb[:0], name, dir, seq))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: get envelope: %w", err)
	}
	if fn != nil {
		fn(v)
	}
	if err := closer.Close(); err != nil {
		return false, fmt.Errorf("store: get envelope: %w", err)
	}
	return true, nil
}

// AppendEnvelope appends the stored bytes of one envelope to dst and
// reports whether it exists (no allocation when dst has room).
func (l *EnvelopeLog) AppendEnvelope(dst []byte, name string, dir byte, seq uint64) ([]byte, bool, error) {
	kb := l.keys.Get().(*[maxEnvelopeKey]byte)
	defer l.keys.Put(kb)
	v, closer, err := l.db.pdb.Get(EnvelopeKey(kb[:0], name, dir, seq))
	if errors.Is(err, pebble.ErrNotFound) {
		return dst, false, nil
	}
	if err != nil {
		return dst, false, fmt.Errorf("store: get envelope: %w", err)
	}
	dst = append(dst, v...)
	if err := closer.Close(); err != nil {
		return dst, false, fmt.Errorf("store: get envelope: %w", err)
	}
	return dst, true, nil
}

// Scan calls fn for every envelope of a direction with a sequence above
// after, ascending, until fn returns false. The slice is valid only during fn.
func (l *EnvelopeLog) Scan(name string, dir byte, after uint64, fn func(seq uint64, env []byte) bool) error {
	prefix := envelopePrefix(name, dir)
	lower := binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), after)
	it, err := l.db.pdb.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: PrefixEnd(prefix)})
	if err != nil {
		return fmt.Errorf("store: scan envelopes: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		seq := binary.BigEndian.Uint64(k[len(k)-8:])
		if seq <= after {
			continue
		}
		v, verr := it.ValueAndErr()
		if verr != nil {
			_ = it.Close()
			return fmt.Errorf("store: scan envelopes: %w", verr)
		}
		if !fn(seq, v) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: scan envelopes: %w", err)
	}
	return nil
}

// DirectionState is what the handler keeps in memory of one direction.
type DirectionState struct {
	Count       int
	Bytes       int
	First, Last uint64
	Pruned      uint64
}

// State reads a direction's counts and marks (once, when a mailbox is
// first loaded into memory).
func (l *EnvelopeLog) State(name string, dir byte) (DirectionState, error) {
	var s DirectionState
	err := l.Scan(name, dir, 0, func(seq uint64, env []byte) bool {
		if s.Count == 0 {
			s.First = seq
		}
		s.Last = seq
		s.Count++
		s.Bytes += len(env)
		return true
	})
	if err != nil {
		return s, err
	}
	raw, err := l.db.Get(markKey(kindPruned, name, dir))
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return s, err
	case len(raw) == 8:
		s.Pruned = binary.BigEndian.Uint64(raw)
	}
	return s, nil
}

// Prune deletes every envelope of a direction at or below through and
// records through as the pruned mark, durably.
func (l *EnvelopeLog) Prune(name string, dir byte, through uint64) error {
	b := l.db.NewBatch()
	prefix := envelopePrefix(name, dir)
	start := binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), 0)
	var end []byte
	if through == ^uint64(0) {
		end = PrefixEnd(prefix)
	} else {
		end = binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), through+1)
	}
	var mark [8]byte
	binary.BigEndian.PutUint64(mark[:], through)
	if err := errors.Join(b.DeleteRange(start, end), b.Set(markKey(kindPruned, name, dir), mark[:])); err != nil {
		b.Discard()
		return err
	}
	return l.db.Commit(b)
}

// Erase removes a mailbox and everything in it, durably.
func (l *EnvelopeLog) Erase(name string) error {
	b := l.db.NewBatch()
	if err := l.eraseInto(b, name); err != nil {
		b.Discard()
		return err
	}
	return l.db.Commit(b)
}

func (l *EnvelopeLog) eraseInto(b *Batch, name string) error {
	rec, err := l.Mailbox(name)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return err
	default:
		if err := b.Delete(idleKey(rec.LastActive, name)); err != nil {
			return err
		}
	}
	var errs []error
	errs = append(errs, b.Delete(mailboxKey(name)))
	for _, kind := range []byte{kindEnvelope, kindPruned, kindPush} {
		p := append([]byte{serviceMailbox, kind}, name...)
		p = append(p, '/')
		errs = append(errs, b.DeleteRange(p, PrefixEnd(p)))
	}
	return errors.Join(errs...)
}

// IdleBefore calls fn with the name of every mailbox whose last activity is
// before cutoff, oldest first, until fn returns false.
func (l *EnvelopeLog) IdleBefore(cutoff int64, fn func(name string, lastActive int64) bool) error {
	lower := []byte{serviceMailbox, kindIdle}
	upper := binary.BigEndian.AppendUint64([]byte{serviceMailbox, kindIdle}, uint64(cutoff))
	it, err := l.db.pdb.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("store: idle scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 10 {
			continue
		}
		if !fn(string(k[10:]), int64(binary.BigEndian.Uint64(k[2:10]))) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: idle scan: %w", err)
	}
	return nil
}

// DropIdle removes one idle-index entry (a stale one, left by writes that
// committed out of order, or one whose mailbox was just erased).
func (l *EnvelopeLog) DropIdle(at int64, name string) error {
	b := l.db.NewBatch()
	if err := b.Delete(idleKey(at, name)); err != nil {
		b.Discard()
		return err
	}
	return l.db.Commit(b)
}

// PushRegistration reads the sealed push registration of a direction;
// ErrNotFound when there is none.
func (l *EnvelopeLog) PushRegistration(name string, dir byte) ([]byte, error) {
	return l.db.Get(markKey(kindPush, name, dir))
}

// SetPushRegistration stores a sealed registration durably.
func (l *EnvelopeLog) SetPushRegistration(name string, dir byte, sealed []byte) error {
	b := l.db.NewBatch()
	if err := b.Set(markKey(kindPush, name, dir), sealed); err != nil {
		b.Discard()
		return err
	}
	return l.db.Commit(b)
}

// DeletePushRegistration removes a direction's registration durably.
func (l *EnvelopeLog) DeletePushRegistration(name string, dir byte) error {
	b := l.db.NewBatch()
	if err := b.Delete(markKey(kindPush, name, dir)); err != nil {
		b.Discard()
		return err
	}
	return l.db.Commit(b)
}

// EachMailbox calls fn with the name and record of every mailbox, in name
// order, until fn returns false (cluster import reads the whole keyspace
// this way; a record of the wrong size is an error, not skipped, so that
// nothing is left behind unnoticed).
func (l *EnvelopeLog) EachMailbox(fn func(name string, rec MailboxRecord) bool) error {
	prefix := []byte{serviceMailbox, kindMailbox}
	it, err := l.db.pdb.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: PrefixEnd(prefix)})
	if err != nil {
		return fmt.Errorf("store: mailbox scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		raw, verr := it.ValueAndErr()
		if verr != nil {
			_ = it.Close()
			return fmt.Errorf("store: mailbox scan: %w", verr)
		}
		if len(raw) != HashLen+8 {
			_ = it.Close()
			return fmt.Errorf("store: mailbox record of %q: %d bytes", k[len(prefix):], len(raw))
		}
		var r MailboxRecord
		copy(r.Token[:], raw)
		r.LastActive = int64(binary.BigEndian.Uint64(raw[HashLen:]))
		if !fn(string(k[len(prefix):]), r) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: mailbox scan: %w", err)
	}
	return nil
}
