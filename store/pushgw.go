package store

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"edgerelay/fastpath/bucket"
)

// Push gateway keys. One key store (see PushScope) keeps the API keys of
// the gateway's callers, the device-token claims made under them and the
// daily budget counter:
//
//	'g' <scope> 'k' <sha256 api key>        key hash index -> key id
//	'g' <scope> 'i' <key id>                key record (JSON pushKeyRecord)
//	'g' <scope> 'b' <mount> '|' <bucket>    the mount's self-registered key id for an address bucket
//	'g' <scope> 't' <sha256 device token>   claim: confirmed (1) | claimed at (8 BE, unix ms) | owner key id
//	'g' <scope> 'd' <UTC day 8 BE>          budget: sends reserved that day (8 BE)
//
// scope is 's' for the key store both mounts share, 'f' or 'a' for the
// FCM or APNs mount's own store when the operator keeps them apart. The
// one-key-per-address slot is per mount even in the shared store, as with
// the reference's two deployments: a server registers on both mounts from
// one address and keeps both keys. A key registered before slots had a
// mount holds the legacy slot 'b' <bucket> until it is revoked.
// API keys and device tokens exist here only as SHA-256 digests; key ids
// are random UUIDs and address buckets are IPv4 addresses or IPv6 /64
// prefixes, neither of them a secret.
//
// What is durable and what is not: key records, the owner, claimed-at and
// confirmed of every claim, and the budget reservation are written with
// synced commits. A claim's in-flight count is not: it counts sends of this
// process, so after a restart it is zero by definition, and keeping it only
// in memory is what guarantees a crashed or evicted request cannot pin a
// token forever (the reference's bug).
const (
	serviceGateway = 'g'

	kindGatewayKeyHash = 'k'
	kindGatewayKey     = 'i'
	kindGatewayBucket  = 'b'
	kindGatewayClaim   = 't'
	kindGatewayBudget  = 'd'
)

// PushScope names one push-gateway key store inside the database.
type PushScope byte

// The key stores: one shared by both mounts, or one per mount.
const (
	PushScopeShared PushScope = 's'
	PushScopeFCM    PushScope = 'f'
	PushScopeAPNs   PushScope = 'a'
)

// Sources of a push-gateway key.
const (
	PushSourceSelf  = "self"  // minted by POST /register
	PushSourceAdmin = "admin" // minted by the operator
)

// ClaimHold is how long a fresh claim cannot be taken over, whatever
// happened to its owner (the reference's KV-convergence window).
const ClaimHold = 60 * time.Second

// budgetBlock is how many budget draws one durable write reserves. A draw
// inside the reservation writes nothing; a crash forfeits at most the
// unused rest of one block for that day (the gateway then refuses early,
// never late), and a clean stop writes the exact count (FlushBudget).
const budgetBlock = 64

// claimStripes serializes claims per device token: a token's claim and
// settle run under its stripe's mutex, so check-then-write is atomic while
// different tokens proceed in parallel.
const claimStripes = 256

// Errors of the push gateway's records.
var (
	ErrUnknownPushKey = errors.New("store: unknown push gateway key")
	ErrPushKeyExists  = errors.New("store: push gateway key already exists")
	// ErrTokenClaimed refuses a claim: the token is bound to another key
	// that is active, or was claimed less than ClaimHold ago.
	ErrTokenClaimed = errors.New("store: device token is bound to a different active api key")
)

// PushKey is one API key of the gateway; never the key itself.
type PushKey struct {
	ID        string
	Hash      Hash // SHA-256 of the key's text
	Label     string
	Enabled   bool
	CreatedAt time.Time
	// ExpiresAt is when the key stops working; zero means never.
	ExpiresAt time.Time
	// Source is PushSourceSelf or PushSourceAdmin.
	Source string
	// RegisteredIP is the address bucket a self-registered key was minted
	// for, "" for the operator's keys.
	RegisteredIP string
	// Mount is the gateway mount ("fcm", "apns") a self-registered key was
	// minted on: the address slot it holds is the mount's. "" for the
	// operator's keys and for keys registered before slots had a mount.
	Mount string
}

// Slot names the one-key-per-address slot a self-registered key holds:
// its mount's, for its address bucket. Buckets (IPv4 addresses, IPv6 /64
// prefixes) hold no '|'; a key without a mount holds the legacy slot, the
// bare bucket.
func (k *PushKey) Slot() string {
	if k.Mount == "" {
		return k.RegisteredIP
	}
	return k.Mount + "|" + k.RegisteredIP
}

// Expired reports whether the key has expired at now.
func (k *PushKey) Expired(now time.Time) bool {
	return !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt)
}

// Active reports whether the key can send at now: it exists (the caller
// holds it), is enabled and has not expired.
func (k *PushKey) Active(now time.Time) bool { return k.Enabled && !k.Expired(now) }

// pushKeyRecord is the JSON stored under 'g' <scope> 'i' <id>. Keys change
// rarely (created, disabled, revoked), so JSON costs nothing that matters.
type pushKeyRecord struct {
	ID           string     `json:"id"`
	Hash         string     `json:"hash"` // hex SHA-256 of the key's text
	Label        string     `json:"label"`
	Enabled      bool       `json:"enabled"`
	CreatedAt    time.Time  `json:"createdAt"`
	ExpiresAt    *time.Time `json:"expiresAt"`
	Source       string     `json:"source"`
	RegisteredIP *string    `json:"registeredIp"`
	Mount        string     `json:"mount,omitempty"`
}

func toPushKeyRecord(k *PushKey) pushKeyRecord {
	rec := pushKeyRecord{
		ID: k.ID, Hash: hex.EncodeToString(k.Hash[:]), Label: k.Label, Enabled: k.Enabled,
		CreatedAt: k.CreatedAt.UTC(), Source: k.Source, Mount: k.Mount,
	}
	if !k.ExpiresAt.IsZero() {
		t := k.ExpiresAt.UTC()
		rec.ExpiresAt = &t
	}
	if k.RegisteredIP != "" {
		ip := k.RegisteredIP
		rec.RegisteredIP = &ip
	}
	return rec
}

// EncodePushKey is the stored form of k (JSON), the same in every backend
// so that an operator's tools read one format.
func EncodePushKey(k PushKey) ([]byte, error) {
	raw, err := json.Marshal(toPushKeyRecord(&k))
	if err != nil {
		return nil, fmt.Errorf("store: encode push key: %w", err)
	}
	return raw, nil
}

// DecodePushKey reads a key record written by EncodePushKey.
func DecodePushKey(raw []byte) (PushKey, error) {
	var rec pushKeyRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return PushKey{}, fmt.Errorf("store: push key record: %w", err)
	}
	return fromPushKeyRecord(rec)
}

func fromPushKeyRecord(rec pushKeyRecord) (PushKey, error) {
	k := PushKey{ID: rec.ID, Label: rec.Label, Enabled: rec.Enabled, CreatedAt: rec.CreatedAt, Source: rec.Source, Mount: rec.Mount}
	raw, err := hex.DecodeString(rec.Hash)
	if err != nil || len(raw) != HashLen {
		return k, fmt.Errorf("store: push key %q: bad hash", rec.ID)
	}
	copy(k.Hash[:], raw)
	if rec.ExpiresAt != nil {
		k.ExpiresAt = *rec.ExpiresAt
	}
	if rec.RegisteredIP != nil {
		k.RegisteredIP = *rec.RegisteredIP
	}
	return k, nil
}

// PushGatewayStore is one push-gateway key store as the gateway's handler
// uses it: keys, device-token claims, the daily budget and the minute
// limits. PushGateway keeps it in Pebble for one process; the cluster
// backend (store/cluster/pushkv) keeps it in JetStream, exact across
// nodes. Both pass the contract suite in store/storetest.
type PushGatewayStore interface {
	// KeyByHash is the send path's lookup: local to the process and
	// allocation-free in every backend.
	KeyByHash(h Hash) (PushKey, bool)
	KeyByID(id string) (PushKey, bool)
	Keys() []PushKey
	AddKey(k PushKey) error
	RegisterKey(k PushKey) (superseded *PushKey, err error)
	SetKeyEnabled(id string, enabled bool) error
	DeleteKey(id string) error

	Claim(token Hash, keyID string, now time.Time) (ClaimTicket, error)
	Settle(t ClaimTicket, delivered bool) error
	ClaimOf(token Hash) (c PushClaim, ok bool, err error)

	DrawBudget(limit int64, now time.Time) (BudgetDraw, bool, error)
	RefundBudget(d BudgetDraw)
	BudgetUsed(now time.Time) (int64, error)
	FlushBudget() error

	// RateLimiter returns a family of per-minute limits (perMinute takes
	// a minute, refilled evenly), one bucket per key. name tells the
	// families of one store apart across nodes ("send.fcm"); each call
	// returns a family of its own.
	RateLimiter(name string, perMinute int) (PushRateLimiter, error)
}

// PushRateLimiter is one family of minute limits, keyed by a SHA-256
// digest (of an API key, of an address bucket).
type PushRateLimiter interface {
	// Take takes one token of key's bucket at now; false: limited.
	Take(key Hash, now time.Time) (bool, error)
	// Sweep lets go of the state of buckets idle long enough to be full
	// again (memory follows the active keys); a no-op where the state is
	// not the process's.
	Sweep(now time.Time)
}

var _ PushGatewayStore = (*PushGateway)(nil)

// PushGateway is the durable state of one push-gateway key store: keys,
// device-token claims and the daily budget.
//
// Keys are few and read on every send, so all of them are held in memory
// (loaded once, updated after each committed write); the process that
// opened the database is the only writer, because Pebble's lock keeps any
// other out. Open exactly one PushGateway per scope per process: its
// mutexes are what make claims and budget draws atomic.
type PushGateway struct {
	db    *DB
	scope PushScope

	// writeMu serializes key writers (create, register, disable, revoke):
	// they read the maps, commit, then publish under keysMu. Readers take
	// only keysMu, and never wait for a commit.
	writeMu  sync.Mutex
	keysMu   sync.RWMutex
	byHash   map[Hash]*PushKey
	byID     map[string]*PushKey
	byBucket map[string]string // address slot (PushKey.slot) -> key id

	epochs  atomic.Uint64 // claim epochs, to tell a settle of a taken-over claim
	stripes [claimStripes]claimStripe

	budget budgetState

	ratesMu sync.Mutex
	rates   map[string]localRate // RateLimiter's families by name
}

// claimStripe holds the claims of its tokens that have sends in flight.
type claimStripe struct {
	mu     sync.Mutex
	active map[Hash]*claimState
	_      [40]byte // keep stripes on separate cache lines
}

// claimState is one token's claim while sends are in flight under it.
type claimState struct {
	owner     string // key id
	claimedAt int64  // unix ms
	confirmed bool   // something was delivered under this claim; sticky
	inFlight  int
	epoch     uint64 // changes on every (re)claim by a new owner
}

// budgetState is the daily budget counter of this process.
type budgetState struct {
	mu       sync.Mutex
	loaded   bool
	day      int64 // days since the Unix epoch, UTC
	used     int64 // draws counted today (refunds subtract)
	reserved int64 // durable count for today; used <= reserved
	// exact is set by FlushBudget: from then on every draw and refund
	// writes the exact count, so that sends still finishing while the
	// gateway stops leave no reservation behind.
	exact bool
}

// NewPushGateway returns the key store scope of db, with its keys loaded.
func NewPushGateway(db *DB, scope PushScope) (*PushGateway, error) {
	switch scope {
	case PushScopeShared, PushScopeFCM, PushScopeAPNs:
	default:
		return nil, fmt.Errorf("store: unknown push gateway scope %q", byte(scope))
	}
	g := &PushGateway{
		db: db, scope: scope,
		byHash: make(map[Hash]*PushKey), byID: make(map[string]*PushKey), byBucket: make(map[string]string),
	}
	for i := range g.stripes {
		g.stripes[i].active = make(map[Hash]*claimState)
	}
	err := db.Scan(g.prefix(kindGatewayKey), func(_, v []byte) error {
		var rec pushKeyRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("store: push key record: %w", err)
		}
		k, err := fromPushKeyRecord(rec)
		if err != nil {
			return err
		}
		g.byHash[k.Hash] = &k
		g.byID[k.ID] = &k
		return nil
	})
	if err != nil {
		return nil, err
	}
	prefix := g.prefix(kindGatewayBucket)
	err = db.Scan(prefix, func(k, v []byte) error {
		g.byBucket[string(k[len(prefix):])] = string(v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (g *PushGateway) prefix(kind byte) []byte {
	return []byte{serviceGateway, byte(g.scope), kind}
}

func (g *PushGateway) key(kind byte, rest []byte) []byte {
	k := make([]byte, 0, 3+len(rest))
	k = append(k, serviceGateway, byte(g.scope), kind)
	return append(k, rest...)
}

// ---- keys ----

// KeyByHash returns the key whose text hashes to h. It takes a read lock
// and copies the record: no allocation on the send path.
func (g *PushGateway) KeyByHash(h Hash) (PushKey, bool) {
	g.keysMu.RLock()
	defer g.keysMu.RUnlock()
	if k := g.byHash[h]; k != nil {
		return *k, true
	}
	return PushKey{}, false
}

// KeyByID returns the key with id.
func (g *PushGateway) KeyByID(id string) (PushKey, bool) {
	g.keysMu.RLock()
	defer g.keysMu.RUnlock()
	if k := g.byID[id]; k != nil {
		return *k, true
	}
	return PushKey{}, false
}

// Keys lists every key, oldest first.
func (g *PushGateway) Keys() []PushKey {
	g.keysMu.RLock()
	out := make([]PushKey, 0, len(g.byID))
	for _, k := range g.byID {
		out = append(out, *k)
	}
	g.keysMu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// AddKey stores a new key. It is durable when it returns nil.
func (g *PushGateway) AddKey(k PushKey) error {
	_, err := g.putKey(k, false)
	return err
}

// RegisterKey stores a new self-registered key for the address bucket
// k.RegisteredIP on the mount k.Mount and, in the same commit, revokes the
// key that slot had: one active key per bucket and mount. Racing
// registrations are serialized, so of any number of them exactly one key
// survives (the last to commit). It returns the superseded key, if there
// was one.
func (g *PushGateway) RegisterKey(k PushKey) (superseded *PushKey, err error) {
	if k.RegisteredIP == "" {
		return nil, errors.New("store: a registered key needs its address bucket")
	}
	return g.putKey(k, true)
}

func (g *PushGateway) putKey(k PushKey, register bool) (*PushKey, error) {
	if k.ID == "" {
		return nil, errors.New("store: push key without id")
	}
	raw, err := json.Marshal(toPushKeyRecord(&k))
	if err != nil {
		return nil, fmt.Errorf("store: encode push key: %w", err)
	}
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	// Only writers change the maps, and writeMu is held: reading them
	// without keysMu is safe here.
	if g.byID[k.ID] != nil || g.byHash[k.Hash] != nil {
		return nil, ErrPushKeyExists
	}
	var old *PushKey
	b := g.db.NewBatch()
	sets := [][2][]byte{
		{g.key(kindGatewayKey, []byte(k.ID)), raw},
		{g.key(kindGatewayKeyHash, k.Hash[:]), []byte(k.ID)},
	}
	if register {
		if id, ok := g.byBucket[k.Slot()]; ok && g.byID[id] != nil {
			old = g.byID[id]
			if err := g.deleteKeyRecords(b, old); err != nil {
				b.Discard()
				return nil, err
			}
		}
		sets = append(sets, [2][]byte{g.key(kindGatewayBucket, []byte(k.Slot())), []byte(k.ID)})
	}
	for _, kv := range sets {
		if err := b.Set(kv[0], kv[1]); err != nil {
			b.Discard()
			return nil, err
		}
	}
	if err := g.db.Commit(b); err != nil {
		return nil, err
	}
	g.keysMu.Lock()
	defer g.keysMu.Unlock()
	if old != nil {
		g.forget(old)
	}
	g.byID[k.ID] = &k
	g.byHash[k.Hash] = &k
	if register {
		g.byBucket[k.Slot()] = k.ID
	}
	if old != nil {
		c := *old
		return &c, nil
	}
	return nil, nil
}

// deleteKeyRecords adds the removal of k's records to b; the caller holds
// writeMu.
func (g *PushGateway) deleteKeyRecords(b *Batch, k *PushKey) error {
	if err := b.Delete(g.key(kindGatewayKey, []byte(k.ID))); err != nil {
		return err
	}
	if err := b.Delete(g.key(kindGatewayKeyHash, k.Hash[:])); err != nil {
		return err
	}
	if k.RegisteredIP != "" && g.byBucket[k.Slot()] == k.ID {
		return b.Delete(g.key(kindGatewayBucket, []byte(k.Slot())))
	}
	return nil
}

// forget drops k from the maps; the caller holds writeMu and keysMu.
func (g *PushGateway) forget(k *PushKey) {
	delete(g.byID, k.ID)
	delete(g.byHash, k.Hash)
	if k.RegisteredIP != "" && g.byBucket[k.Slot()] == k.ID {
		delete(g.byBucket, k.Slot())
	}
}

// SetKeyEnabled enables or disables the key id. A disabled key is refused
// at /send and no longer protects its device-token claims once they are
// ClaimHold old.
func (g *PushGateway) SetKeyEnabled(id string, enabled bool) error {
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	cur := g.byID[id]
	if cur == nil {
		return ErrUnknownPushKey
	}
	if cur.Enabled == enabled {
		return nil
	}
	k := *cur
	k.Enabled = enabled
	raw, err := json.Marshal(toPushKeyRecord(&k))
	if err != nil {
		return fmt.Errorf("store: encode push key: %w", err)
	}
	b := g.db.NewBatch()
	if err := b.Set(g.key(kindGatewayKey, []byte(id)), raw); err != nil {
		b.Discard()
		return err
	}
	if err := g.db.Commit(b); err != nil {
		return err
	}
	g.keysMu.Lock()
	defer g.keysMu.Unlock()
	g.byID[id] = &k
	g.byHash[k.Hash] = &k
	return nil
}

// DeleteKey revokes the key id: its records go, so the key is unknown from
// the commit on, and its claims are free for takeover once ClaimHold old.
func (g *PushGateway) DeleteKey(id string) error {
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	k := g.byID[id]
	if k == nil {
		return ErrUnknownPushKey
	}
	b := g.db.NewBatch()
	if err := g.deleteKeyRecords(b, k); err != nil {
		b.Discard()
		return err
	}
	if err := g.db.Commit(b); err != nil {
		return err
	}
	g.keysMu.Lock()
	defer g.keysMu.Unlock()
	g.forget(k)
	return nil
}

// ---- device-token claims ----

// ClaimTicket is an allowed claim, to be settled exactly once with Settle.
// The zero ticket settles to nothing.
type ClaimTicket struct {
	token Hash
	state *claimState
	epoch uint64
	ref   string // another backend's own name for the send's claim
}

// NewClaimTicket is another backend's ticket for token: ref names its
// record of the send ("" is the zero ticket, which settles to nothing).
func NewClaimTicket(token Hash, ref string) ClaimTicket {
	return ClaimTicket{token: token, ref: ref}
}

// Token is the device token's digest the ticket was issued for; Ref is
// what NewClaimTicket was given.
func (t ClaimTicket) Token() Hash { return t.token }
func (t ClaimTicket) Ref() string { return t.ref }

// PushClaim is the durable state of one token's claim, for inspection.
type PushClaim struct {
	Owner     string
	ClaimedAt time.Time
	Confirmed bool
	InFlight  int
}

func (g *PushGateway) stripe(token Hash) *claimStripe { return &g.stripes[token[0]] }

func (g *PushGateway) claimKey(token Hash) []byte { return g.key(kindGatewayClaim, token[:]) }

// loadClaim reads the durable claim of token; owner "" when there is none.
func (g *PushGateway) loadClaim(token Hash) (claimState, error) {
	raw, err := g.db.Get(g.claimKey(token))
	if errors.Is(err, ErrNotFound) {
		return claimState{}, nil
	}
	if err != nil {
		return claimState{}, err
	}
	if len(raw) < 10 {
		return claimState{}, fmt.Errorf("store: claim record of %d bytes", len(raw))
	}
	return claimState{
		confirmed: raw[0] == 1,
		claimedAt: int64(binary.BigEndian.Uint64(raw[1:9])),
		owner:     string(raw[9:]),
	}, nil
}

// writeClaim durably stores the claim st of token.
func (g *PushGateway) writeClaim(token Hash, owner string, claimedAt int64, confirmed bool) error {
	v := make([]byte, 9, 9+len(owner))
	if confirmed {
		v[0] = 1
	}
	binary.BigEndian.PutUint64(v[1:9], uint64(claimedAt))
	v = append(v, owner...)
	b := g.db.NewBatch()
	if err := b.Set(g.claimKey(token), v); err != nil {
		b.Discard()
		return err
	}
	return g.db.Commit(b)
}

func (g *PushGateway) deleteClaim(token Hash) error {
	b := g.db.NewBatch()
	if err := b.Delete(g.claimKey(token)); err != nil {
		b.Discard()
		return err
	}
	return g.db.Commit(b)
}

// Claim binds token to the key keyID for one send, following the rules of
// token pinning:
//
//   - no owner: keyID takes it (unconfirmed, claimed now);
//   - owner is keyID: one more send in flight under its claim;
//   - owner is another key: refused (ErrTokenClaimed) while the claim is
//     younger than ClaimHold or while the owner key is active (exists,
//     enabled, not expired); otherwise keyID takes it over.
//
// Taking a claim is a synced write, done before Claim returns: the caller
// delivers only after it, so that a stranger's first send cannot win a
// token. Every nil-error ticket must be settled exactly once.
func (g *PushGateway) Claim(token Hash, keyID string, now time.Time) (ClaimTicket, error) {
	s := g.stripe(token)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.active[token]
	if st == nil {
		cur, err := g.loadClaim(token)
		if err != nil {
			return ClaimTicket{}, err
		}
		if cur.owner == keyID {
			st = &cur
			st.epoch = g.epochs.Add(1)
			st.inFlight = 1
			s.active[token] = st
			return ClaimTicket{token: token, state: st, epoch: st.epoch}, nil
		}
		if cur.owner != "" && !g.takeable(&cur, now) {
			return ClaimTicket{}, ErrTokenClaimed
		}
		st = &claimState{}
	} else {
		if st.owner == keyID {
			st.inFlight++
			return ClaimTicket{token: token, state: st, epoch: st.epoch}, nil
		}
		if !g.takeable(st, now) {
			return ClaimTicket{}, ErrTokenClaimed
		}
	}
	// A new owner: write first, then publish. Sends still in flight under
	// the previous owner settle against an old epoch and change nothing.
	at := now.UnixMilli()
	if err := g.writeClaim(token, keyID, at, false); err != nil {
		return ClaimTicket{}, err
	}
	st.owner, st.claimedAt, st.confirmed, st.inFlight = keyID, at, false, 1
	st.epoch = g.epochs.Add(1)
	s.active[token] = st
	return ClaimTicket{token: token, state: st, epoch: st.epoch}, nil
}

// takeable reports whether another key may take over the claim st.
func (g *PushGateway) takeable(st *claimState, now time.Time) bool {
	if now.UnixMilli()-st.claimedAt < ClaimHold.Milliseconds() {
		return false
	}
	owner, ok := g.KeyByID(st.owner)
	return !ok || !owner.Active(now)
}

// Settle ends one send under t. delivered marks the claim confirmed
// (sticky). A send that delivered nothing releases the claim only when the
// claim was never confirmed and no other send under it is in flight. A
// ticket whose claim has since been taken over by another key changes
// nothing. The error reports a failed durable write; the in-flight count
// is released regardless.
func (g *PushGateway) Settle(t ClaimTicket, delivered bool) error {
	if t.state == nil {
		return nil
	}
	s := g.stripe(t.token)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.active[t.token]
	if st != t.state || st.epoch != t.epoch {
		return nil
	}
	st.inFlight--
	var err error
	switch {
	case delivered && !st.confirmed:
		if err = g.writeClaim(t.token, st.owner, st.claimedAt, true); err == nil {
			st.confirmed = true
		}
	case !delivered && !st.confirmed && st.inFlight == 0:
		err = g.deleteClaim(t.token)
	}
	if st.inFlight == 0 {
		delete(s.active, t.token)
	}
	return err
}

// ClaimOf returns the claim of token, durable fields from the store and
// the in-flight count of this process; ok false when the token is free.
func (g *PushGateway) ClaimOf(token Hash) (c PushClaim, ok bool, err error) {
	s := g.stripe(token)
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := g.loadClaim(token)
	if err != nil || st.owner == "" {
		return PushClaim{}, false, err
	}
	c = PushClaim{Owner: st.owner, ClaimedAt: time.UnixMilli(st.claimedAt).UTC(), Confirmed: st.confirmed}
	if a := s.active[token]; a != nil && a.owner == st.owner {
		c.InFlight = a.inFlight
	}
	return c, true, nil
}

// ---- daily budget ----

// BudgetDraw is one counted send, to be refunded with RefundBudget when
// the provider was provably never contacted.
type BudgetDraw struct {
	day int64
	ok  bool
}

// NewBudgetDraw is another backend's draw counted for day (PushBudgetDay).
func NewBudgetDraw(day int64) BudgetDraw { return BudgetDraw{day: day, ok: true} }

// Day is the UTC day the draw was counted for; ok false for the zero draw
// (nothing to refund).
func (d BudgetDraw) Day() (day int64, ok bool) { return d.day, d.ok }

// PushBudgetDay is the budget's day of now: days since the Unix epoch, UTC.
func PushBudgetDay(now time.Time) int64 { return utcDay(now) }

// utcDay is the number of days since the Unix epoch of now in UTC.
func utcDay(now time.Time) int64 {
	s := now.Unix()
	d := s / 86400
	if s < 0 && s%86400 != 0 {
		d--
	}
	return d
}

func (g *PushGateway) budgetKey(day int64) []byte {
	var d [8]byte
	binary.BigEndian.PutUint64(d[:], uint64(day))
	return g.key(kindGatewayBudget, d[:])
}

// budgetTo moves the counter to day, loading that day's durable count
// (a restart starts from it) and dropping earlier days. Caller holds mu.
func (g *PushGateway) budgetTo(day int64) error {
	b := &g.budget
	if b.loaded && b.day == day {
		return nil
	}
	if b.loaded && day < b.day {
		// The clock went backwards across midnight; keep counting the
		// later day rather than reopening a closed one.
		return nil
	}
	var n int64
	raw, err := g.db.Get(g.budgetKey(day))
	switch {
	case err == nil && len(raw) == 8:
		n = int64(binary.BigEndian.Uint64(raw))
	case err == nil:
		return fmt.Errorf("store: budget record of %d bytes", len(raw))
	case !errors.Is(err, ErrNotFound):
		return err
	}
	batch := g.db.NewBatch()
	if err := batch.DeleteRange(g.budgetKey(0), g.budgetKey(day)); err != nil {
		batch.Discard()
		return err
	}
	if err := g.db.Commit(batch); err != nil {
		return err
	}
	b.loaded, b.day, b.used, b.reserved = true, day, n, n
	return nil
}

func (g *PushGateway) writeBudget(day, n int64) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(n))
	b := g.db.NewBatch()
	if err := b.Set(g.budgetKey(day), v[:]); err != nil {
		b.Discard()
		return err
	}
	return g.db.Commit(b)
}

// DrawBudget counts one send against limit for now's UTC day. ok false
// means the day's budget is spent (limit 0: the gateway is closed). The
// count is durable: a restart never forgets a draw (it may, after a crash,
// count up to one reservation block too many for the rest of that day).
func (g *PushGateway) DrawBudget(limit int64, now time.Time) (BudgetDraw, bool, error) {
	b := &g.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := g.budgetTo(utcDay(now)); err != nil {
		return BudgetDraw{}, false, err
	}
	if b.used >= limit {
		return BudgetDraw{}, false, nil
	}
	if b.used >= b.reserved {
		block := int64(budgetBlock)
		if b.exact {
			block = 1
		}
		next := min(limit, b.used+block)
		if err := g.writeBudget(b.day, next); err != nil {
			return BudgetDraw{}, false, err
		}
		b.reserved = next
	}
	b.used++
	return BudgetDraw{day: b.day, ok: true}, true, nil
}

// RefundBudget gives back a draw whose send never reached the provider.
// A draw of a day that has ended is not refunded: that day is closed.
func (g *PushGateway) RefundBudget(d BudgetDraw) {
	if !d.ok {
		return
	}
	b := &g.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.loaded && b.day == d.day && b.used > 0 {
		b.used--
		// A failed write leaves the count one too high: early, never late.
		if b.exact && g.writeBudget(b.day, b.used) == nil {
			b.reserved = b.used
		}
	}
}

// BudgetUsed returns the draws counted for now's UTC day.
func (g *PushGateway) BudgetUsed(now time.Time) (int64, error) {
	b := &g.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := g.budgetTo(utcDay(now)); err != nil {
		return 0, err
	}
	return b.used, nil
}

// FlushBudget writes the exact count of the current day in place of its
// reservation, so that a clean stop forfeits nothing. A stopping gateway
// calls it while its last sends may still be running, so from then on
// every draw and refund writes the exact count instead of reserving a
// block: a draw made after the flush would otherwise reserve a block that
// no later flush gives back.
func (g *PushGateway) FlushBudget() error {
	b := &g.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	b.exact = true
	if !b.loaded || b.reserved == b.used {
		return nil
	}
	if err := g.writeBudget(b.day, b.used); err != nil {
		return err
	}
	b.reserved = b.used
	return nil
}

// ---- minute limits ----

// RateLimiter returns the family name of minute limits, held in this
// process: the only one that serves this store, so its buckets are exact
// (GCRA, lock-free and allocation-free for a known key). Asking again for
// a name returns the same family, as every node of a cluster gets the
// same one; with another rate it is an error.
func (g *PushGateway) RateLimiter(name string, perMinute int) (PushRateLimiter, error) {
	if perMinute < 1 {
		return nil, fmt.Errorf("store: rate limit %s: %d a minute: want at least 1", name, perMinute)
	}
	g.ratesMu.Lock()
	defer g.ratesMu.Unlock()
	if l, ok := g.rates[name]; ok {
		if l.perMinute != perMinute {
			return nil, fmt.Errorf("store: rate limit %s: %d a minute, already %d", name, perMinute, l.perMinute)
		}
		return l, nil
	}
	set, err := bucket.NewSet(bucket.Config{Burst: perMinute, Interval: time.Minute / time.Duration(perMinute)})
	if err != nil {
		return nil, fmt.Errorf("store: rate limit %s: %w", name, err)
	}
	l := localRate{set: set, perMinute: perMinute}
	if g.rates == nil {
		g.rates = make(map[string]localRate)
	}
	g.rates[name] = l
	return l, nil
}

// localRate keys its buckets by the first 8 bytes of the digest: uniform,
// and what the gateway's per-key buckets were keyed by before the limits
// moved behind the store.
type localRate struct {
	set       *bucket.Set
	perMinute int
}

func (l localRate) Take(key Hash, now time.Time) (bool, error) {
	ok, _ := l.set.Take(binary.LittleEndian.Uint64(key[:8]), now.UnixNano())
	return ok, nil
}

func (l localRate) Sweep(now time.Time) { l.set.Sweep(now.UnixNano()) }
