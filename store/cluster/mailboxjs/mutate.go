package mailboxjs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Prune deletes every envelope of a direction at or below through and
// records through as the pruned mark. The head moves first, by a
// compare-and-set mark message (so the count, bytes and mark are exact at
// once across nodes); the purge that frees the envelopes follows and is
// idempotent: if this node dies between the two, the next prune (or the
// sweeper) finishes it, and no read returns an envelope at or below the
// mark meanwhile.
func (s *Store) Prune(ctx context.Context, name string, dir byte, through uint64) error {
	n, err := s.names(name)
	if err != nil {
		return err
	}
	for round := range maxRounds {
		h, err := s.readHead(ctx, n, dir)
		if err != nil {
			return err
		}
		if through <= h.Pruned && h.Rev != 0 {
			return s.purgeThrough(ctx, n, dir, &h, h.Pruned, 0)
		}
		next := cloneHead(h)
		// The bytes freed: in-order ones from the running totals (the
		// first envelope kept carries the total through itself), the
		// out-of-order ones one by one (rare).
		keep, err := s.search(ctx, s.leaderGet, n, dir, &h, through+1)
		if err != nil {
			return err
		}
		cumBefore := h.CumInOrder
		if keep != nil {
			kh, err := decodeHead(keep.hdr.Get(hdrHead), keep.seq)
			if err != nil {
				return fmt.Errorf("mailboxjs: prune %s: %w", name, err)
			}
			cumBefore = kh.CumInOrder - uint64(len(keep.data))
			next.FirstStream = keep.seq
		}
		freed := cumBefore - h.PrunedCum
		next.PrunedCum = cumBefore
		for _, seq := range h.OutOfOrder {
			if seq > through {
				break
			}
			env, ok, err := s.lookup(ctx, n, dir, &h, seq)
			if err != nil {
				return err
			}
			if ok {
				freed += uint64(len(env))
			}
		}
		removed := 0
		for _, r := range h.Stored {
			if r.From > through {
				break
			}
			removed += int(min(r.To, through) - r.From + 1)
		}
		next.pruneThrough(through)
		next.Count -= removed
		next.Bytes -= int(freed)
		if next.Count == 0 {
			next.Bytes = 0
		}
		hdr := nats.Header{
			hdrExpSeq:  {strconv.FormatUint(h.Rev, 10)},
			hdrExpSubj: {n.dirAll(dir)},
			hdrHead:    {encodeHead(&next)},
			hdrRollup:  {"sub"},
		}
		ack, err := s.publish(ctx, n.mark(dir), nil, hdr)
		if err == nil {
			next.Rev = ack.Sequence
			if next.Count == 0 {
				next.FirstStream = ack.Sequence + 1
			}
			s.remember(name, dir, next)
			bound := ack.Sequence
			if keep != nil {
				bound = keep.seq
			}
			return s.purgeThrough(ctx, n, dir, &h, through, bound)
		}
		if !cluster.Conflict(err) {
			return err
		}
		backoff(round)
	}
	return cluster.Fail("prune "+name, errors.New("too many conflicts"))
}

// purgeThrough removes the envelopes a prune through through left behind:
// the in-order ones below stream sequence bound (0: found again from the
// head) and the out-of-order ones at or below through that h listed.
func (s *Store) purgeThrough(ctx context.Context, n names, dir byte, h *Head, through, bound uint64) error {
	st := s.streams[n.shard]
	if bound == 0 {
		bound = h.FirstStream
	}
	if bound > 1 {
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(n.inOrder(dir)), jetstream.WithPurgeSequence(bound)); err != nil {
			return cluster.Fail("prune "+n.inOrder(dir), err)
		}
	}
	for _, seq := range h.OutOfOrder {
		if seq > through {
			break
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(n.ooo(dir, seq))); err != nil {
			return cluster.Fail("prune "+n.ooo(dir, seq), err)
		}
	}
	return nil
}

// Erase removes a mailbox and everything in it (claim, heads, envelopes,
// marks, registrations: one purge, one Raft operation) and then tells
// every node on the mailbox's control subject, so that their watch and
// signal sockets close with 1000.
func (s *Store) Erase(ctx context.Context, name string) error {
	n, err := s.names(name)
	if err != nil {
		return err
	}
	if err := s.streams[n.shard].Purge(ctx, jetstream.WithPurgeSubject(n.base+".>")); err != nil {
		return cluster.Fail("erase "+name, err)
	}
	s.forget(name)
	if err := s.nc.Publish(n.control(), []byte(ctlErased)); err != nil {
		return cluster.Fail("erase "+name+": notify", err)
	}
	return nil
}

const ctlErased = "erased"

// hdrClaimRev on an erased notice names the revision of the claim that
// went (a takeover): watches of a later claim ignore it. Without it
// (an erase, the sweeper) every watch of the mailbox ends.
const hdrClaimRev = "Er-Claim-Rev"

// PushRegistration reads the sealed registration of a direction;
// store.ErrNotFound when there is none.
func (s *Store) PushRegistration(ctx context.Context, name string, dir byte) ([]byte, error) {
	n, err := s.names(name)
	if err != nil {
		return nil, err
	}
	data, _, err := s.pushReg(ctx, n, dir)
	return data, err
}

// pushReg reads a registration and its stream sequence through the
// leader. An empty message is a dropped one (DropPushRegistration's
// compare-and-set tombstone; sealed bytes are never empty).
func (s *Store) pushReg(ctx context.Context, n names, dir byte) ([]byte, uint64, error) {
	m, err := s.leaderGet(ctx, n.stream, getReq{LastFor: n.push(dir)})
	if errors.Is(err, errNoMsg) {
		return nil, 0, store.ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	if len(m.data) == 0 {
		return nil, m.seq, store.ErrNotFound
	}
	return m.data, m.seq, nil
}

// DropPushRegistration removes a direction's registration only while it
// still holds sent (a provider refused the token sealed in it): an empty
// message replaces it by compare-and-set on its stream sequence, so a
// newer registration stored meanwhile stays; the tombstone is then purged
// (only up to itself: anything newer is kept).
func (s *Store) DropPushRegistration(ctx context.Context, name string, dir byte, sent []byte) (bool, error) {
	n, err := s.names(name)
	if err != nil {
		return false, err
	}
	for round := range maxRounds {
		cur, rev, err := s.pushReg(ctx, n, dir)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !bytes.Equal(cur, sent) {
			return false, nil
		}
		ack, err := s.publish(ctx, n.push(dir), nil, nats.Header{
			hdrExpSeq: {strconv.FormatUint(rev, 10)}, hdrRollup: {"sub"},
		})
		if err == nil {
			// Best effort: a tombstone left reads as none and goes with
			// the next registration (rollup) or the mailbox.
			_ = s.streams[n.shard].Purge(ctx, jetstream.WithPurgeSubject(n.push(dir)), jetstream.WithPurgeSequence(ack.Sequence+1))
			return true, nil
		}
		if !cluster.Conflict(err) {
			return false, err
		}
		backoff(round)
	}
	return false, cluster.Fail("drop push registration "+name, errors.New("too many conflicts"))
}

// SetPushRegistration stores a sealed registration (the relay seals it
// with a key derived from the bearer; this backend never sees a device
// token), replacing the previous one in the same write.
func (s *Store) SetPushRegistration(ctx context.Context, name string, dir byte, sealed []byte) error {
	n, err := s.names(name)
	if err != nil {
		return err
	}
	_, err = s.publish(ctx, n.push(dir), sealed, nats.Header{hdrRollup: {"sub"}})
	return err
}

// DeletePushRegistration removes a direction's registration.
func (s *Store) DeletePushRegistration(ctx context.Context, name string, dir byte) error {
	n, err := s.names(name)
	if err != nil {
		return err
	}
	if err := s.streams[n.shard].Purge(ctx, jetstream.WithPurgeSubject(n.push(dir))); err != nil {
		return cluster.Fail("delete push registration", err)
	}
	return nil
}
