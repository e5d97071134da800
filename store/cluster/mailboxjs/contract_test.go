package mailboxjs

import (
	"context"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/storetest"
)

// TestMailboxContract runs the mailbox store contract over 3 nodes, one
// Store per node, each call of a case through the next node. The head
// keeps the rate buckets here and writers race across nodes, so those
// parts of the contract run too. The Store departs from the spec in two
// ways the suite finds (each strict case fails with its flag off):
// heartbeats within touchEvery are not persisted, and the head's byte
// caps make a widely spread direction full early.
func TestMailboxContract(t *testing.T) {
	_, st := start(t)
	hs := make([]storetest.Mailboxes, len(st))
	for i, s := range st {
		hs[i] = contract{s}
	}
	storetest.Mailbox(t, hs, storetest.MailboxOptions{
		RateBuckets:         true,
		Concurrent:          true,
		CoalescedHeartbeats: true,
		HeadCaps:            true,
	})
}

// contract adapts a Store to storetest.Mailboxes: the same calls, with the
// outcome, limit and head types of the contract (which are to move into
// package store with the interface).
type contract struct{ s *Store }

var _ storetest.Mailboxes = contract{}

func (c contract) Mailbox(ctx context.Context, name string) (store.MailboxRecord, error) {
	return c.s.Mailbox(ctx, name)
}

func (c contract) Claim(ctx context.Context, name string, token store.Hash, now int64, touchEvery, idle time.Duration) (storetest.ClaimOutcome, error) {
	o, err := c.s.Claim(ctx, name, token, now, touchEvery, idle)
	switch o {
	case ClaimCreated:
		return storetest.ClaimCreated, err
	case ClaimSame:
		return storetest.ClaimSame, err
	case ClaimTaken:
		return storetest.ClaimTaken, err
	}
	return 0, err
}

func (c contract) Touch(ctx context.Context, name string, now int64) error {
	return c.s.Touch(ctx, name, now)
}

var putOutcomes = map[Outcome]storetest.PutOutcome{
	Created:     storetest.PutCreated,
	Retry:       storetest.PutRetry,
	Conflict:    storetest.PutConflict,
	Pruned:      storetest.PutPruned,
	Full:        storetest.PutFull,
	RateLimited: storetest.PutRateLimited,
	NoMailbox:   storetest.PutNoMailbox,
}

func (c contract) Put(ctx context.Context, name string, dir byte, seq uint64, env []byte, lim storetest.MailboxLimits, now int64) (storetest.PutResult, error) {
	r, err := c.s.Put(ctx, name, dir, seq, env, Limits(lim), now)
	return storetest.PutResult{Outcome: putOutcomes[r.Outcome], RetryAfter: r.RetryAfter, Push: r.Push, Rev: r.Rev}, err
}

func (c contract) Envelope(ctx context.Context, name string, dir byte, seq uint64) ([]byte, bool, error) {
	return c.s.Envelope(ctx, name, dir, seq)
}

func (c contract) Scan(ctx context.Context, name string, dir byte, after uint64, maxBytes int, fn func(seq uint64, env []byte) bool) error {
	return c.s.Scan(ctx, name, dir, after, maxBytes, fn)
}

func (c contract) State(ctx context.Context, name string, dir byte) (storetest.MailboxHead, error) {
	h, err := c.s.State(ctx, name, dir)
	out := storetest.MailboxHead{Rev: h.Rev, Max: h.Max, Count: h.Count, Bytes: h.Bytes, Pruned: h.Pruned}
	for _, r := range h.Stored {
		out.Stored = append(out.Stored, storetest.SeqRun(r))
	}
	return out, err
}

func (c contract) Prune(ctx context.Context, name string, dir byte, through uint64) error {
	return c.s.Prune(ctx, name, dir, through)
}

func (c contract) Erase(ctx context.Context, name string) error { return c.s.Erase(ctx, name) }

func (c contract) PushRegistration(ctx context.Context, name string, dir byte) ([]byte, error) {
	return c.s.PushRegistration(ctx, name, dir)
}

func (c contract) SetPushRegistration(ctx context.Context, name string, dir byte, sealed []byte) error {
	return c.s.SetPushRegistration(ctx, name, dir, sealed)
}

func (c contract) DeletePushRegistration(ctx context.Context, name string, dir byte) error {
	return c.s.DeletePushRegistration(ctx, name, dir)
}
