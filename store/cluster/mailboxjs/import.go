package mailboxjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// ImportSource is a single node's mailbox keyspace as the import reads it
// (*store.EnvelopeLog).
type ImportSource interface {
	State(name string, dir byte) (store.DirectionState, error)
	Scan(name string, dir byte, after uint64, fn func(seq uint64, env []byte) bool) error
	PushRegistration(name string, dir byte) ([]byte, error)
}

var _ ImportSource = (*store.EnvelopeLog)(nil)

// ErrImportConflict: the cluster holds something of an imported mailbox
// that differs from the single node's (another token's claim, other bytes
// under an envelope's sequence); the import leaves it and stops.
var ErrImportConflict = errors.New("mailboxjs: the cluster holds this mailbox differently")

// ImportStats is what one mailbox's import found in the single node's
// store; a second run reports the same.
type ImportStats struct {
	// Envelopes read from the single node (both directions): each is in
	// the cluster now, or was and has been pruned there since.
	Envelopes int
}

// Import moves one mailbox of a single node (name, its record rec, the
// rest read from from) into the cluster, idempotently: what the cluster
// already holds in the same state is left, so an import cut short is run
// again. In order: the claim record, then per direction the pruned mark,
// every envelope ascending and the sealed push registration.
//
// The claim is written exactly as stored (same token hash, same
// LastActive), not through Claim: Claim decides expiry against its now,
// and with the record's old LastActive as now it would take over, and
// purge, a cluster mailbox of another token that looks idle from that
// time. A cluster claim of the same token is left as it is (its
// LastActive may be newer); one of another token is ErrImportConflict
// with nothing written. Envelopes go through Put with no buckets and no
// caps of count or bytes (the single node admitted them; the head's set
// caps still apply, a direction past them is reported as full), at
// now = LastActive (or the direction's later activity, when it was
// written through the cluster since), so the import neither refreshes the
// mailbox's activity nor moves it back, and is not rate-limited: Created and Retry (the same bytes,
// imported before) are both fine, Pruned means the cluster pruned past
// it since, Conflict (other bytes) is ErrImportConflict. A registration
// (sealed under the bearer: moved as bytes, opened by the cluster's relay
// the same way) is written only where the cluster has none: one that
// differs was registered through the cluster since and is newer.
//
// Run it before the devices move to the cluster: a mailbox erased or
// pruned through the cluster after a first run is brought back by a
// second one (the import cannot tell an erase from never imported).
func (s *Store) Import(ctx context.Context, from ImportSource, name string, rec store.MailboxRecord) (ImportStats, error) {
	var st ImportStats
	n, err := s.names(name)
	if err != nil {
		return st, err
	}
	if err := s.importClaim(ctx, n, name, rec); err != nil {
		return st, err
	}
	for _, dir := range []byte{store.DirP2C, store.DirC2P} {
		k, err := s.importDirection(ctx, from, name, dir, rec.LastActive)
		st.Envelopes += k
		if err != nil {
			return st, err
		}
		if err := s.importRegistration(ctx, from, n, dir); err != nil {
			return st, err
		}
	}
	return st, nil
}

// importClaim creates the claim record exactly as rec (create-if-absent,
// one winner across writers), or leaves the cluster's when the same
// token holds it.
func (s *Store) importClaim(ctx context.Context, n names, name string, rec store.MailboxRecord) error {
	for round := range maxRounds {
		held, _, err := s.readClaim(ctx, n)
		switch {
		case err == nil && held.Token == rec.Token:
			return nil // imported before (or claimed through the cluster by the same bearer)
		case err == nil:
			return fmt.Errorf("import mailbox %s: its claim is held by another token in the cluster: %w", name, ErrImportConflict)
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("import mailbox %s: %w", name, err)
		}
		_, err = s.publish(ctx, n.claim(), claimBody(rec.Token, rec.LastActive), nats.Header{hdrExpSeq: {"0"}})
		if err == nil {
			// As a new claim does: whatever a previous holder's writes
			// left in a race with its erase goes before the import's
			// envelopes meet it.
			if err := s.purgeLeftovers(ctx, n); err != nil {
				return fmt.Errorf("import mailbox %s: %w", name, err)
			}
			return nil
		}
		if !cluster.Conflict(err) {
			return fmt.Errorf("import mailbox %s: %w", name, err)
		}
		backoff(round) // claimed meanwhile: read who holds it
	}
	return cluster.Fail("import mailbox "+name, errors.New("too many conflicts"))
}

// importDirection sets the pruned mark and puts every envelope of dir,
// ascending; it reports how many envelopes it read.
func (s *Store) importDirection(ctx context.Context, from ImportSource, name string, dir byte, now int64) (int, error) {
	where := fmt.Sprintf("import mailbox %s/%s", name, dirToken(dir))
	ds, err := from.State(name, dir)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", where, err)
	}
	// A direction written through the cluster since (by the same bearer)
	// keeps its later activity: Put stamps the head with now.
	h, err := s.State(ctx, name, dir)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", where, err)
	}
	now = max(now, h.Active)
	if ds.Pruned > 0 {
		// Prune never lowers a mark; at or below the cluster's it only
		// finishes that mark's purge.
		if err := s.Prune(ctx, name, dir, ds.Pruned); err != nil {
			return 0, fmt.Errorf("%s: pruned mark %d: %w", where, ds.Pruned, err)
		}
	}
	k := 0
	var perr error
	err = from.Scan(name, dir, ds.Pruned, func(seq uint64, env []byte) bool {
		k++
		// Put is done with env when it returns (the publish waited for
		// its ack), so the slice Scan lends is not kept.
		r, err := s.Put(ctx, name, dir, seq, env, Limits{}, now)
		switch {
		case err != nil:
			perr = fmt.Errorf("%s: envelope %d: %w", where, seq, err)
		case r.Outcome == Created, r.Outcome == Retry, r.Outcome == Pruned:
		case r.Outcome == Conflict:
			perr = fmt.Errorf("%s: envelope %d: the cluster holds other bytes under its sequence: %w", where, seq, ErrImportConflict)
		case r.Outcome == Full:
			perr = fmt.Errorf("%s: envelope %d: the direction's head cannot list it (sequences spread too far, written out of order); prune it on the single node and import again", where, seq)
		case r.Outcome == NoMailbox:
			perr = fmt.Errorf("%s: envelope %d: the mailbox was erased in the cluster during the import", where, seq)
		default:
			perr = fmt.Errorf("%s: envelope %d: unexpected outcome %d", where, seq, r.Outcome)
		}
		return perr == nil
	})
	if err != nil {
		return k, fmt.Errorf("%s: %w", where, err)
	}
	return k, perr
}

// importRegistration copies dir's sealed registration where the cluster
// has none, by compare-and-set on the registration's subject (a
// registration made through the cluster meanwhile is newer and stays).
func (s *Store) importRegistration(ctx context.Context, from ImportSource, n names, dir byte) error {
	where := fmt.Sprintf("import mailbox %s/%s/%s push registration", n.app, n.id, dirToken(dir))
	sealed, err := from.PushRegistration(n.app+"/"+n.id, dir)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	for round := range maxRounds {
		_, rev, err := s.pushReg(ctx, n, dir)
		if err == nil {
			return nil // the same (imported before) or newer: left either way
		}
		if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%s: %w", where, err)
		}
		// rev is 0, or a dropped registration's tombstone.
		_, err = s.publish(ctx, n.push(dir), sealed, nats.Header{
			hdrExpSeq: {strconv.FormatUint(rev, 10)}, hdrRollup: {"sub"},
		})
		if err == nil {
			return nil
		}
		if !cluster.Conflict(err) {
			return fmt.Errorf("%s: %w", where, err)
		}
		backoff(round)
	}
	return cluster.Fail(where, errors.New("too many conflicts"))
}
