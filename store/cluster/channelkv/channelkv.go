// Package channelkv keeps the private channel relay's claim keys and tokens
// in the cluster's shared JetStream KV, so that every node answers a claim,
// a token and an operator's key command alike (store.ChannelClaimStore).
//
// Bucket er_chan_keys, every name built from hex digests only:
//
//	claim.<sha256 claim key>   the key record (JSON): host, used, claimed, owner and phone hashes
//	host.<sha256 host name>    reservation of the host name -> hex of the key hash
//	owner.<sha256 owner token> hint -> hex of the key hash
//	phone.<sha256 phone token> hint -> hex of the key hash
//
// KV has no multi-key transaction, so one key is the truth and the others
// are hints checked against it:
//
//   - The key record decides. A claim is one compare-and-set on claim.<k>
//     from unused to used: of any number of claims racing on any nodes
//     exactly one wins, and used never goes back.
//   - A token hint counts only when the record it names is claimed with
//     that token in that role (ByOwner, ByPhone, the in-use check). Hints
//     are written before the record's compare-and-set, so a crash between
//     the two leaves a hint naming a key that does not confirm it: the
//     token reaches nothing. After the compare-and-set the winner checks
//     its hints are in place, so a claim always leaves tokens that work.
//     A hint is stale once its record cannot confirm it any more (record
//     gone, or used with other tokens); a claim may then take it over by
//     compare-and-set. A hint naming a key that is still unused belongs to
//     a claim in flight (or one that crashed before its compare-and-set and
//     is settled by its retry) and makes the token in use.
//   - The host reservation is created before the record (create-if-absent:
//     two nodes adding one host name, one wins). One naming no record is
//     an add in flight for staleAfter, then stale (a crash between the
//     two writes).
//
// Releases and revocations change the record first (the tokens stop working
// at once, on every node, because every read goes to the stream leader) and
// then drop the hints they made stale, best effort. WatchForgotten tells
// every node of them, so that the node holding the computer's sockets
// closes them. Import moves a single node's keys in.
//
// Every NATS failure comes back wrapping store.ErrUnavailable (503 with
// Retry-After); a write is refused at once while the node's readiness says
// the shared store cannot take writes.
package channelkv

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Bucket is the KV bucket of the claim state.
const Bucket = "er_chan_keys"

// staleAfter is how long a host reservation naming no key record counts as
// an add in flight. An add takes at most one operation timeout (5 s), so a
// reservation older than this was left by a node that crashed between its
// two writes. (Its age is the stream leader's timestamp against this node's
// clock: nodes' clocks must agree to well within this.)
const staleAfter = 30 * time.Second

// Claims is the claim state of the private channel relay shared by every
// node of a cluster. It implements store.ChannelClaimStore.
type Claims struct {
	c      *cluster.Cluster
	kv     jetstream.KeyValue
	stream jetstream.Stream
	// staleAfter is the constant staleAfter; tests shorten it.
	staleAfter time.Duration
	// afterHints, when set by a test, runs between a claim's hints and its
	// compare-and-set.
	afterHints func()
}

var _ store.ChannelClaimStore = (*Claims)(nil)

// New binds (creating it the first time) the claim bucket.
func New(ctx context.Context, c *cluster.Cluster) (*Claims, error) {
	kv, err := c.Bucket(ctx, cluster.BucketConfig{Name: Bucket})
	if err != nil {
		return nil, fmt.Errorf("channelkv: %w", err)
	}
	st, err := c.Stream(ctx, Bucket)
	if err != nil {
		return nil, fmt.Errorf("channelkv: %w", cluster.Fail("bind stream of "+Bucket, err))
	}
	return &Claims{c: c, kv: kv, stream: st, staleAfter: staleAfter}, nil
}

// record is the JSON at claim.<k> (the same fields the Pebble store keeps).
type record struct {
	Host      string    `json:"host"`
	Created   time.Time `json:"created"`
	Used      bool      `json:"used"`
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
	Claimed   bool      `json:"claimed"`
	Owner     []byte    `json:"owner,omitempty"`
	Phone     []byte    `json:"phone,omitempty"`
}

// role is a token's role: its hint's prefix and its field in the record.
type role struct {
	prefix string
	field  func(*record) []byte
}

var (
	ownerRole = role{"owner.", func(r *record) []byte { return r.Owner }}
	phoneRole = role{"phone.", func(r *record) []byte { return r.Phone }}
)

func (r role) key(tok store.Hash) string { return r.prefix + hex.EncodeToString(tok[:]) }

// confirms reports whether the record is claimed with tok in role r.
func (r role) confirms(rec *record, tok store.Hash) bool {
	return rec != nil && rec.Claimed && subtle.ConstantTimeCompare(r.field(rec), tok[:]) == 1
}

func claimKey(h store.Hash) string { return "claim." + hex.EncodeToString(h[:]) }

func hostKey(host string) string {
	d := sha256.Sum256([]byte(host))
	return "host." + hex.EncodeToString(d[:])
}

func toChannelKey(h store.Hash, rec *record) store.ChannelKey {
	k := store.ChannelKey{Hash: h, Host: rec.Host, Created: rec.Created, Used: rec.Used, ClaimedAt: rec.ClaimedAt, Claimed: rec.Claimed}
	copy(k.Owner[:], rec.Owner)
	copy(k.Phone[:], rec.Phone)
	return k
}

// parseHash reads a hex key hash from a hint or reservation value.
func parseHash(v []byte) (store.Hash, bool) {
	var h store.Hash
	if hex.DecodedLen(len(v)) != len(h) {
		return h, false
	}
	_, err := hex.Decode(h[:], v)
	return h, err == nil
}

func hexValue(h store.Hash) []byte { return []byte(hex.EncodeToString(h[:])) }

// record reads the key record of h: nil when there is none.
func (s *Claims) record(ctx context.Context, h store.Hash) (*record, uint64, error) {
	e, err := cluster.Get(ctx, s.kv, claimKey(h))
	if err != nil || e == nil {
		return nil, 0, err
	}
	rec, err := decode(e.Value())
	return rec, e.Revision(), err
}

func decode(raw []byte) (*record, error) {
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("channelkv: key record: %w", err)
	}
	return &rec, nil
}

func encode(rec *record) ([]byte, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("channelkv: encode key record: %w", err)
	}
	return raw, nil
}

// AddKey stores a new claim key hash for host; host names are unique across
// the cluster.
func (s *Claims) AddKey(h store.Hash, host string, now time.Time) error {
	if err := s.c.Writable("add claim key"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	resKey := hostKey(host)
	resRev, err := s.kv.Create(ctx, resKey, hexValue(h))
	if err != nil && !cluster.Conflict(err) {
		return cluster.Fail("reserve host", err)
	}
	if err != nil {
		if resRev, err = s.takeHost(ctx, h, host, resKey); err != nil {
			return err
		}
	}
	raw, err := encode(&record{Host: host, Created: now.UTC()})
	if err != nil {
		return err
	}
	if _, err := s.kv.Create(ctx, claimKey(h), raw); err != nil {
		if !cluster.Conflict(err) {
			return cluster.Fail("add claim key", err)
		}
		// Another host holds this key hash: give the name back.
		_ = cluster.Delete(ctx, s.kv, resKey, resRev)
		if rec, _, err := s.record(ctx, h); err == nil && rec != nil {
			return fmt.Errorf("store: claim key already stored for host %q", rec.Host)
		}
		return errors.New("store: claim key already stored")
	}
	return nil
}

// takeHost handles an existing reservation of host: ErrHostExists while it
// names a key of that host (or an add in flight), else it takes the stale
// reservation over and returns its revision.
func (s *Claims) takeHost(ctx context.Context, h store.Hash, host, resKey string) (uint64, error) {
	e, err := cluster.Get(ctx, s.kv, resKey)
	if err != nil {
		return 0, err
	}
	exists := fmt.Errorf("%w: %q", store.ErrHostExists, host)
	if e == nil { // deleted between our create and this read: an add or revoke raced
		return 0, exists
	}
	k, ok := parseHash(e.Value())
	if ok {
		rec, _, err := s.record(ctx, k)
		if err != nil {
			return 0, err
		}
		if rec != nil && rec.Host == host {
			return 0, exists
		}
		if rec == nil && k == h {
			// Our own earlier add that crashed before its record: finish it.
			return e.Revision(), nil
		}
		if rec == nil && time.Since(e.Created()) < s.staleAfter {
			return 0, exists
		}
	}
	rev, err := s.kv.Update(ctx, resKey, hexValue(h), e.Revision())
	if cluster.Conflict(err) {
		return 0, exists
	}
	if err != nil {
		return 0, cluster.Fail("reserve host", err)
	}
	return rev, nil
}

// HasKey reports whether a claim key with hash h is stored.
func (s *Claims) HasKey(h store.Hash) (bool, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	rec, _, err := s.record(ctx, h)
	return rec != nil, err
}

// Keys lists every stored claim key, ordered by host name. The key names
// come from the stream leader's subject list, so a key added through any
// node a moment ago is listed.
func (s *Claims) Keys() ([]store.ChannelKey, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	const prefix = "$KV." + Bucket + ".claim."
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, cluster.Fail("list claim keys", err)
	}
	var hashes []store.Hash
	for subj := range info.State.Subjects {
		if h, ok := parseHash([]byte(strings.TrimPrefix(subj, prefix))); ok {
			hashes = append(hashes, h)
		}
	}
	recs := make([]*record, len(hashes))
	err = cluster.Each(len(hashes), func(i int) (err error) {
		recs[i], _, err = s.record(ctx, hashes[i])
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]store.ChannelKey, 0, len(hashes))
	for i, rec := range recs {
		if rec != nil { // nil: a revoked key's delete marker
			out = append(out, toChannelKey(hashes[i], rec))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

// hint is a token hint this claim wrote, with the revision it wrote.
type hint struct {
	r   role
	tok store.Hash
	rev uint64
}

// Claim binds owner and phone token hashes to the unused key h and returns
// the key's host (see the package comment for the order of the writes).
func (s *Claims) Claim(h, owner, phone store.Hash, now time.Time) (string, error) {
	if err := s.c.Writable("claim"); err != nil {
		return "", err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	rec, _, err := s.record(ctx, h)
	switch {
	case err != nil:
		return "", err
	case rec == nil:
		return "", store.ErrUnknownKey
	case rec.Used:
		return "", store.ErrKeyUsed
	}
	// Either token in either role anywhere makes the claim refused, as in
	// the Pebble store.
	for _, tok := range []store.Hash{owner, phone} {
		for _, r := range []role{ownerRole, phoneRole} {
			if inUse, err := s.hintBlocks(ctx, r, tok, h); err != nil || inUse {
				return "", orInUse(err)
			}
		}
	}
	var wrote []hint
	for _, w := range []struct {
		r   role
		tok store.Hash
	}{{ownerRole, owner}, {phoneRole, phone}} {
		rev, err := s.takeHint(ctx, w.r, w.tok, h)
		if err != nil {
			s.dropHints(ctx, h, wrote)
			return "", err
		}
		if rev != 0 {
			wrote = append(wrote, hint{w.r, w.tok, rev})
		}
	}
	if s.afterHints != nil {
		s.afterHints()
	}
	var host string
	_, err = cluster.Update(ctx, s.kv, claimKey(h), func(cur []byte, _ uint64) ([]byte, error) {
		if cur == nil {
			return nil, store.ErrUnknownKey
		}
		rec, err := decode(cur)
		if err != nil {
			return nil, err
		}
		if rec.Used {
			return nil, store.ErrKeyUsed
		}
		rec.Used, rec.Claimed, rec.ClaimedAt = true, true, now.UTC()
		rec.Owner, rec.Phone = owner[:], phone[:]
		host = rec.Host
		return encode(rec)
	})
	if err != nil {
		s.dropHints(ctx, h, wrote)
		return "", err
	}
	// A hint adopted from an identical claim racing this one may have been
	// dropped by that claim when it lost; the record confirms both tokens
	// now, so nobody else can take a hint over: put back any that is gone.
	for _, w := range []struct {
		r   role
		tok store.Hash
	}{{ownerRole, owner}, {phoneRole, phone}} {
		// Best effort: the claim is won and must be answered so (a 503
		// would make the computer's retry read 409); a hint that is still
		// gone after a failed read is the narrow case above on top of a
		// failing store.
		_ = s.ensureHint(ctx, w.r, w.tok, h)
	}
	return host, nil
}

// ensureHint creates the hint of tok in role r naming h when it is gone
// (read first: it is nearly always there, and a failed create costs two
// round trips).
func (s *Claims) ensureHint(ctx context.Context, r role, tok, h store.Hash) error {
	e, err := cluster.Get(ctx, s.kv, r.key(tok))
	if err != nil || e != nil {
		return err
	}
	if _, err := s.kv.Create(ctx, r.key(tok), hexValue(h)); err != nil && !cluster.Conflict(err) {
		return cluster.Fail("claim: token hint", err)
	}
	return nil
}

func orInUse(err error) error {
	if err != nil {
		return err
	}
	return store.ErrTokenInUse
}

// hintBlocks reports whether the hint for tok in role r names a key other
// than h that holds the token (claimed with it, or still unused: a claim in
// flight).
func (s *Claims) hintBlocks(ctx context.Context, r role, tok, h store.Hash) (bool, error) {
	e, err := cluster.Get(ctx, s.kv, r.key(tok))
	if err != nil || e == nil {
		return false, err
	}
	return s.holds(ctx, e, r, tok, h)
}

func (s *Claims) holds(ctx context.Context, e jetstream.KeyValueEntry, r role, tok, h store.Hash) (bool, error) {
	k, ok := parseHash(e.Value())
	if !ok || k == h {
		return false, nil
	}
	rec, _, err := s.record(ctx, k)
	if err != nil || rec == nil {
		return false, err
	}
	return !rec.Used || r.confirms(rec, tok), nil
}

// takeHint points the hint of tok in role r at h: created, or taken over
// when stale. It returns the revision written, or 0 when the hint already
// named h (an identical claim in flight wrote it: not ours to drop).
func (s *Claims) takeHint(ctx context.Context, r role, tok, h store.Hash) (uint64, error) {
	key := r.key(tok)
	rev, err := s.kv.Create(ctx, key, hexValue(h))
	if err == nil {
		return rev, nil
	}
	if !cluster.Conflict(err) {
		return 0, cluster.Fail("claim: token hint", err)
	}
	e, err := cluster.Get(ctx, s.kv, key)
	if err != nil {
		return 0, err
	}
	if e == nil {
		return 0, store.ErrTokenInUse // changed under us: another claim races for it
	}
	if k, ok := parseHash(e.Value()); ok && k == h {
		return 0, nil
	}
	if inUse, err := s.holds(ctx, e, r, tok, h); err != nil || inUse {
		return 0, orInUse(err)
	}
	rev, err = s.kv.Update(ctx, key, hexValue(h), e.Revision())
	if cluster.Conflict(err) {
		return 0, store.ErrTokenInUse
	}
	if err != nil {
		return 0, cluster.Fail("claim: token hint", err)
	}
	return rev, nil
}

// dropHints deletes the hints a claim wrote unless the record of h confirms
// them (an identical claim won with them). Best effort: a hint left behind
// is stale, and harmless.
func (s *Claims) dropHints(ctx context.Context, h store.Hash, hs []hint) {
	if len(hs) == 0 {
		return
	}
	rec, _, err := s.record(ctx, h)
	if err != nil {
		return
	}
	for _, x := range hs {
		if !x.r.confirms(rec, x.tok) {
			_ = cluster.Delete(ctx, s.kv, x.r.key(x.tok), x.rev)
		}
	}
}

// dropStale deletes the hints of a claimed key once its record no longer
// confirms them, if they still name it. Best effort.
func (s *Claims) dropStale(ctx context.Context, k store.ChannelKey) {
	if !k.Claimed {
		return
	}
	for _, x := range []struct {
		r   role
		tok store.Hash
	}{{ownerRole, k.Owner}, {phoneRole, k.Phone}} {
		e, err := cluster.Get(ctx, s.kv, x.r.key(x.tok))
		if err != nil || e == nil {
			continue
		}
		if n, ok := parseHash(e.Value()); ok && n == k.Hash {
			_ = cluster.Delete(ctx, s.kv, x.r.key(x.tok), e.Revision())
		}
	}
}

// ByOwner finds the claimed key whose owner token hashes to owner.
func (s *Claims) ByOwner(owner store.Hash) (store.ChannelKey, error) {
	return s.byToken(ownerRole, owner)
}

// ByPhone finds the claimed key whose phone token hashes to phone.
func (s *Claims) ByPhone(phone store.Hash) (store.ChannelKey, error) {
	return s.byToken(phoneRole, phone)
}

func (s *Claims) byToken(r role, tok store.Hash) (store.ChannelKey, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	k, rec, _, err := s.lookup(ctx, r, tok)
	if err != nil {
		return store.ChannelKey{}, err
	}
	return toChannelKey(k, rec), nil
}

// lookup follows the hint of tok to its record and checks the record
// confirms it: ErrUnknownToken otherwise.
func (s *Claims) lookup(ctx context.Context, r role, tok store.Hash) (store.Hash, *record, uint64, error) {
	e, err := cluster.Get(ctx, s.kv, r.key(tok))
	if err != nil {
		return store.Hash{}, nil, 0, err
	}
	if e == nil {
		return store.Hash{}, nil, 0, store.ErrUnknownToken
	}
	k, ok := parseHash(e.Value())
	if !ok {
		return store.Hash{}, nil, 0, store.ErrUnknownToken
	}
	rec, rev, err := s.record(ctx, k)
	if err != nil {
		return store.Hash{}, nil, 0, err
	}
	if !r.confirms(rec, tok) {
		return store.Hash{}, nil, 0, store.ErrUnknownToken
	}
	return k, rec, rev, nil
}

// Release forgets the tokens of the computer whose owner token hashes to
// owner; the claim key stays used. It returns the key as it was claimed.
func (s *Claims) Release(owner store.Hash) (store.ChannelKey, error) {
	if err := s.c.Writable("release"); err != nil {
		return store.ChannelKey{}, err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	h, _, _, err := s.lookup(ctx, ownerRole, owner)
	if err != nil {
		return store.ChannelKey{}, err
	}
	var was store.ChannelKey
	_, err = cluster.Update(ctx, s.kv, claimKey(h), func(cur []byte, _ uint64) ([]byte, error) {
		if cur == nil {
			return nil, store.ErrUnknownToken
		}
		rec, err := decode(cur)
		if err != nil {
			return nil, err
		}
		if !ownerRole.confirms(rec, owner) {
			return nil, store.ErrUnknownToken
		}
		was = toChannelKey(h, rec)
		rec.Claimed, rec.Owner, rec.Phone = false, nil, nil
		return encode(rec)
	})
	if err != nil {
		return store.ChannelKey{}, err
	}
	s.dropStale(ctx, was)
	return was, nil
}

// Revoke removes host's claim key: a claimed computer loses its tokens and
// the key can never be claimed again.
func (s *Claims) Revoke(host string) (store.ChannelKey, error) {
	if err := s.c.Writable("revoke"); err != nil {
		return store.ChannelKey{}, err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	unknown := fmt.Errorf("%w: %q", store.ErrUnknownHost, host)
	res, err := cluster.Get(ctx, s.kv, hostKey(host))
	if err != nil {
		return store.ChannelKey{}, err
	}
	if res == nil {
		return store.ChannelKey{}, unknown
	}
	h, ok := parseHash(res.Value())
	if !ok {
		return store.ChannelKey{}, unknown
	}
	for range 8 { // a claim or release racing the revoke: read again
		rec, rev, err := s.record(ctx, h)
		if err != nil {
			return store.ChannelKey{}, err
		}
		if rec == nil || rec.Host != host {
			return store.ChannelKey{}, unknown
		}
		err = cluster.Delete(ctx, s.kv, claimKey(h), rev)
		if cluster.Conflict(err) {
			continue
		}
		if err != nil {
			return store.ChannelKey{}, err
		}
		k := toChannelKey(h, rec)
		_ = cluster.Delete(ctx, s.kv, hostKey(host), res.Revision())
		s.dropStale(ctx, k)
		return k, nil
	}
	return store.ChannelKey{}, cluster.Fail("revoke "+host, errors.New("the key record kept changing"))
}

// ErrImportConflict is returned by Import for a key the cluster already
// holds in another state.
var ErrImportConflict = errors.New("channelkv: the cluster holds this claim key in another state")

// Import writes one claim key as the Pebble store lists it
// (store.ChannelClaims.Keys: hash, host, state and token hashes) into the
// cluster, for moving a single node's store into the cluster. It writes in
// the order a claim does (token hints, host reservation, record), so an
// import cut short leaves nothing that works halfway, and it is idempotent:
// a key already imported in the same state is left as it is. A key the
// cluster holds in another state, or whose host or tokens another key holds,
// is an error (ErrImportConflict, ErrHostExists, ErrTokenInUse) naming the
// host.
func (s *Claims) Import(k store.ChannelKey) error {
	if err := s.c.Writable("import claim key"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	rec := &record{Host: k.Host, Created: k.Created.UTC(), Used: k.Used, ClaimedAt: k.ClaimedAt.UTC(), Claimed: k.Claimed}
	if k.Claimed {
		rec.Owner, rec.Phone = k.Owner[:], k.Phone[:]
		for _, w := range []struct {
			r   role
			tok store.Hash
		}{{ownerRole, k.Owner}, {phoneRole, k.Phone}} {
			if _, err := s.takeHint(ctx, w.r, w.tok, k.Hash); err != nil {
				return fmt.Errorf("import %q: %w", k.Host, err)
			}
		}
	}
	raw, err := encode(rec)
	if err != nil {
		return err
	}
	resKey := hostKey(k.Host)
	if _, err := s.kv.Create(ctx, resKey, hexValue(k.Hash)); err != nil {
		if !cluster.Conflict(err) {
			return cluster.Fail("import: reserve host", err)
		}
		e, err := cluster.Get(ctx, s.kv, resKey)
		if err != nil {
			return err
		}
		if n, ok := parseHash(cluster.Value(e)); !ok || n != k.Hash {
			if _, err := s.takeHost(ctx, k.Hash, k.Host, resKey); err != nil {
				return fmt.Errorf("import %q: %w", k.Host, err)
			}
		}
	}
	if _, err := s.kv.Create(ctx, claimKey(k.Hash), raw); err != nil {
		if !cluster.Conflict(err) {
			return cluster.Fail("import claim key", err)
		}
		e, err := cluster.Get(ctx, s.kv, claimKey(k.Hash))
		if err != nil {
			return err
		}
		if e == nil || string(e.Value()) != string(raw) {
			return fmt.Errorf("%w: host %q", ErrImportConflict, k.Host)
		}
	}
	return nil
}

// WatchForgotten calls fn, from one goroutine, with the key hash of every
// claim released or revoked through any node from now until ctx ends, so
// that the node holding that computer's sockets closes them, as the spec
// wants of a release or revocation (channel.Handler.Forget). For one made
// through this node the handler has closed them already and fn finds
// nothing to close. The watch is an ordered consumer, which resumes by
// itself after a reconnect.
func (s *Claims) WatchForgotten(ctx context.Context, fn func(store.Hash)) error {
	w, err := s.kv.Watch(ctx, "claim.>", jetstream.UpdatesOnly())
	if err != nil {
		return cluster.Fail("watch claim keys", err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			var e jetstream.KeyValueEntry
			var ok bool
			select {
			case <-ctx.Done():
				return
			case e, ok = <-w.Updates():
			}
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			h, ok := parseHash([]byte(strings.TrimPrefix(e.Key(), "claim.")))
			if !ok {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut { // revoked
				fn(h)
				continue
			}
			if rec, err := decode(e.Value()); err == nil && rec.Used && !rec.Claimed { // released
				fn(h)
			}
		}
	}()
	return nil
}
