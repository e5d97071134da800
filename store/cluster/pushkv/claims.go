package pushkv

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// claimRecord is one token's claim in er_push_claims (JSON: small, and
// readable with the nats CLI).
type claimRecord struct {
	Owner     string   `json:"owner"`     // key id
	ClaimedAt int64    `json:"claimedAt"` // unix ms, the claiming node's clock
	Confirmed bool     `json:"confirmed"` // something was delivered under it; sticky
	InFlight  []flight `json:"inFlight,omitempty"`
}

// flight is one send in flight under a claim. Started is the node's wall
// clock (not the caller's now): it bounds how long the entry counts.
type flight struct {
	ID          string `json:"id"`
	Node        string `json:"node"`
	Incarnation string `json:"inc"`
	Started     int64  `json:"started"` // unix ms
}

// errClaimed ends a claim's compare-and-set without a write.
var errClaimed = errors.New("pushkv: claimed")

func (g *Gateway) claimKey(token store.Hash) string {
	return g.prefix + hex.EncodeToString(token[:])
}

// readClaim reads the claim at key: the record and its revision (0 with an
// empty record when there is none).
func (g *Gateway) readClaim(ctx context.Context, key string) (claimRecord, uint64, error) {
	var rec claimRecord
	e, err := g.claims.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyDeleted):
		return rec, e.Revision(), nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return rec, 0, nil
	case err != nil:
		return rec, 0, cluster.Fail("read claim", err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, 0, fmt.Errorf("pushkv: claim record: %w", err)
	}
	return rec, e.Revision(), nil
}

// writeClaim stores rec at key over revision rev (0: the key holds none,
// or a delete marker at rev), or deletes it when rec has no owner.
func (g *Gateway) writeClaim(ctx context.Context, key string, rec *claimRecord, rev uint64) error {
	if rec.Owner == "" {
		if rev == 0 {
			return nil
		}
		_, err := g.deleteKV(ctx, g.claims, key, rev)
		return err
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("pushkv: encode claim: %w", err)
	}
	if rev == 0 {
		_, err = g.claims.Create(ctx, key, raw)
	} else {
		_, err = g.claims.Update(ctx, key, raw, rev)
	}
	return err
}

// updateClaim runs fn on the token's claim by compare-and-set until a
// write lands; fn returning cluster.ErrSkip writes nothing.
func (g *Gateway) updateClaim(token store.Hash, fn func(ctx context.Context, rec *claimRecord) error) error {
	ctx, cancel, err := g.op()
	if err != nil {
		return err
	}
	defer cancel()
	key := g.claimKey(token)
	return casLoop("claim", func() (bool, error) {
		rec, rev, err := g.readClaim(ctx, key)
		if err != nil {
			return false, err
		}
		if err := fn(ctx, &rec); err != nil {
			if errors.Is(err, cluster.ErrSkip) {
				return true, nil
			}
			return false, err
		}
		if err := g.writeClaim(ctx, key, &rec, rev); err != nil {
			if cluster.Conflict(err) {
				return false, err
			}
			return false, cluster.Fail("write claim", err)
		}
		return true, nil
	})
}

// prune drops the in-flight entries that no live request stands for: of a
// node incarnation that is gone, or older than flightMax. When that empties
// an unconfirmed claim, the claim is released: the dead request's own
// settle would have released it. It reports whether it changed rec. A node
// whose liveness cannot be read counts as alive (keep what is held until
// the store answers).
func (g *Gateway) prune(ctx context.Context, rec *claimRecord, wall time.Time) bool {
	if len(rec.InFlight) == 0 {
		return false
	}
	alive := map[string]bool{}
	keep := rec.InFlight[:0]
	for _, f := range rec.InFlight {
		if wall.UnixMilli()-f.Started > flightMax.Milliseconds() {
			continue
		}
		id := f.Node + "/" + f.Incarnation
		ok, seen := alive[id]
		if !seen {
			var err error
			if ok, err = g.c.Alive(ctx, f.Node, f.Incarnation); err != nil {
				ok = true
			}
			alive[id] = ok
		}
		if ok {
			keep = append(keep, f)
		}
	}
	if len(keep) == len(rec.InFlight) {
		return false
	}
	rec.InFlight = keep
	if len(keep) == 0 && !rec.Confirmed {
		*rec = claimRecord{}
	}
	return true
}

// takeable reports whether another key may take over rec at now: the
// claim is ClaimHold old and its owner is not active.
func (g *Gateway) takeable(rec *claimRecord, now time.Time) bool {
	if now.UnixMilli()-rec.ClaimedAt < store.ClaimHold.Milliseconds() {
		return false
	}
	// The mirror alone: a claim ClaimHold old has an owner at least as
	// old, which every node's mirror holds unless it was revoked.
	owner, ok := g.byIDLocal(rec.Owner)
	return !ok || !owner.Active(now)
}

// Claim binds token to keyID for one send, by the rules of the Pebble
// store (store.PushGateway.Claim), serialized across nodes by
// compare-and-set on the token's record. The send's in-flight entry is
// written before Claim returns.
func (g *Gateway) Claim(token store.Hash, keyID string, now time.Time) (store.ClaimTicket, error) {
	ref := newRef()
	err := g.updateClaim(token, func(ctx context.Context, rec *claimRecord) error {
		wall := time.Now()
		g.prune(ctx, rec, wall)
		mine := flight{ID: ref, Node: g.c.Node(), Incarnation: g.c.Incarnation(), Started: wall.UnixMilli()}
		switch {
		case rec.Owner == keyID:
			rec.InFlight = append(rec.InFlight, mine)
			return nil
		case rec.Owner != "" && !g.takeable(rec, now):
			return errClaimed
		}
		// A new owner; sends in flight under the previous one find no
		// entry of theirs when they settle, and change nothing.
		*rec = claimRecord{Owner: keyID, ClaimedAt: now.UnixMilli(), InFlight: []flight{mine}}
		return nil
	})
	if errors.Is(err, errClaimed) {
		return store.ClaimTicket{}, store.ErrTokenClaimed
	}
	if err != nil {
		return store.ClaimTicket{}, err
	}
	return store.NewClaimTicket(token, ref), nil
}

// Settle ends the send of t: its in-flight entry goes; delivered confirms
// the claim; an undelivered send that was the last in flight of an
// unconfirmed claim releases it. A ticket whose claim was taken over since
// (its entry is gone) changes nothing.
func (g *Gateway) Settle(t store.ClaimTicket, delivered bool) error {
	ref := t.Ref()
	if ref == "" {
		return nil
	}
	return g.updateClaim(t.Token(), func(_ context.Context, rec *claimRecord) error {
		at := -1
		for i, f := range rec.InFlight {
			if f.ID == ref {
				at = i
				break
			}
		}
		if at < 0 {
			return cluster.ErrSkip
		}
		rec.InFlight = append(rec.InFlight[:at], rec.InFlight[at+1:]...)
		switch {
		case delivered:
			rec.Confirmed = true
		case !rec.Confirmed && len(rec.InFlight) == 0:
			*rec = claimRecord{}
		}
		return nil
	})
}

// ClaimOf returns the claim of token with the sends in flight under it on
// every live node; ok false when the token is free (also when the only
// sends of an unconfirmed claim were on a node that is gone).
func (g *Gateway) ClaimOf(token store.Hash) (store.PushClaim, bool, error) {
	ctx, cancel, err := g.op()
	if err != nil {
		return store.PushClaim{}, false, err
	}
	defer cancel()
	rec, _, err := g.readClaim(ctx, g.claimKey(token))
	if err != nil {
		return store.PushClaim{}, false, err
	}
	g.prune(ctx, &rec, time.Now())
	if rec.Owner == "" {
		return store.PushClaim{}, false, nil
	}
	return store.PushClaim{
		Owner: rec.Owner, ClaimedAt: time.UnixMilli(rec.ClaimedAt).UTC(), Confirmed: rec.Confirmed, InFlight: len(rec.InFlight),
	}, true, nil
}
