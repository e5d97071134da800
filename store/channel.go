package store

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Errors of the channel claim state machine.
var (
	ErrUnknownKey   = errors.New("store: unknown claim key")
	ErrKeyUsed      = errors.New("store: claim key already used")
	ErrTokenInUse   = errors.New("store: token already in use")
	ErrUnknownToken = errors.New("store: unknown token")
	ErrHostExists   = errors.New("store: host already has a claim key")
	ErrUnknownHost  = errors.New("store: unknown host")
)

// ChannelKey is what the store knows of one computer's claim key.
type ChannelKey struct {
	Hash    Hash
	Host    string
	Created time.Time
	// Used is true once the key has been claimed; it never goes back.
	Used      bool
	ClaimedAt time.Time
	// Claimed is true while the computer holds its tokens (used and not
	// yet released or revoked).
	Claimed bool
	Owner   Hash
	Phone   Hash
}

// channelKeyRecord is the JSON stored under 'c' 'k' <hash>. Records are
// small and written rarely (claims, releases), so JSON keeps them readable
// in a debugger at no cost that matters.
type channelKeyRecord struct {
	Host      string    `json:"host"`
	Created   time.Time `json:"created"`
	Used      bool      `json:"used"`
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
	Claimed   bool      `json:"claimed"`
	Owner     []byte    `json:"owner,omitempty"`
	Phone     []byte    `json:"phone,omitempty"`
}

// ChannelClaimStore is the durable claim state of the private channel
// relay as the channel handler, its key management and the admin listener
// use it. *ChannelClaims (Pebble, one node) and store/cluster/channelkv
// (shared by every node of a cluster) implement it with the same
// behaviour; store/storetest.Channel is the contract both pass.
type ChannelClaimStore interface {
	// AddKey stores a new claim key hash for host; ErrHostExists when the
	// host already has one.
	AddKey(h Hash, host string, now time.Time) error
	// HasKey reports whether a claim key with hash h is stored.
	HasKey(h Hash) (bool, error)
	// Keys lists every stored claim key, ordered by host name.
	Keys() ([]ChannelKey, error)
	// Claim binds owner and phone token hashes to the unused key h and
	// returns its host: ErrUnknownKey, ErrKeyUsed or ErrTokenInUse change
	// nothing. Of two racing claims with one key exactly one wins.
	Claim(h, owner, phone Hash, now time.Time) (string, error)
	// ByOwner and ByPhone find the claimed key a token hash belongs to, or
	// ErrUnknownToken.
	ByOwner(owner Hash) (ChannelKey, error)
	ByPhone(phone Hash) (ChannelKey, error)
	// Release forgets the tokens of the owner's computer; the key stays used.
	Release(owner Hash) (ChannelKey, error)
	// Revoke removes host's claim key and its tokens; ErrUnknownHost.
	Revoke(host string) (ChannelKey, error)
}

var _ ChannelClaimStore = (*ChannelClaims)(nil)

// ChannelClaims is the durable claim state of the private channel relay.
// One mutex serializes every state change so that check-then-write is
// atomic: of two racing claims with one key exactly one wins. Claims are
// rare (once per computer), so a single lock costs nothing that matters.
type ChannelClaims struct {
	db *DB
	mu sync.Mutex
}

// NewChannelClaims returns the channel claim state kept in db.
func NewChannelClaims(db *DB) *ChannelClaims { return &ChannelClaims{db: db} }

func channelKeyKey(h Hash) []byte   { return key2(serviceChannel, kindChannelKey, h[:]) }
func channelOwnerKey(h Hash) []byte { return key2(serviceChannel, kindChannelOwner, h[:]) }
func channelPhoneKey(h Hash) []byte { return key2(serviceChannel, kindChannelPhone, h[:]) }

func (c *ChannelClaims) load(h Hash) (channelKeyRecord, error) {
	var rec channelKeyRecord
	raw, err := c.db.Get(channelKeyKey(h))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return rec, fmt.Errorf("store: channel key record: %w", err)
	}
	return rec, nil
}

func toChannelKey(h Hash, rec channelKeyRecord) ChannelKey {
	k := ChannelKey{Hash: h, Host: rec.Host, Created: rec.Created, Used: rec.Used, ClaimedAt: rec.ClaimedAt, Claimed: rec.Claimed}
	copy(k.Owner[:], rec.Owner)
	copy(k.Phone[:], rec.Phone)
	return k
}

// AddKey stores a new claim key hash for host. Host names are unique among
// the keys the store holds, so that an operator can revoke by name.
func (c *ChannelClaims) AddKey(h Hash, host string, now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, err := c.keysLocked()
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.Host == host {
			return fmt.Errorf("%w: %q", ErrHostExists, host)
		}
		if k.Hash == h {
			return fmt.Errorf("store: claim key already stored for host %q", k.Host)
		}
	}
	raw, err := json.Marshal(channelKeyRecord{Host: host, Created: now.UTC()})
	if err != nil {
		return fmt.Errorf("store: encode channel key: %w", err)
	}
	b := c.db.NewBatch()
	if err := b.Set(channelKeyKey(h), raw); err != nil {
		b.Discard()
		return err
	}
	return c.db.Commit(b)
}

// HasKey reports whether a claim key with hash h is stored.
func (c *ChannelClaims) HasKey(h Hash) (bool, error) {
	_, err := c.load(h)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Keys lists every stored claim key, ordered by host name.
func (c *ChannelClaims) Keys() ([]ChannelKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keysLocked()
}

func (c *ChannelClaims) keysLocked() ([]ChannelKey, error) {
	var out []ChannelKey
	err := c.db.Scan([]byte{serviceChannel, kindChannelKey}, func(k, v []byte) error {
		var rec channelKeyRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("store: channel key record: %w", err)
		}
		var h Hash
		copy(h[:], k[2:])
		out = append(out, toChannelKey(h, rec))
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, err
}

// Claim binds owner and phone token hashes to the unused key h and returns
// the key's host. It is durable when it returns nil.
func (c *ChannelClaims) Claim(h, owner, phone Hash, now time.Time) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, err := c.load(h)
	if errors.Is(err, ErrNotFound) {
		return "", ErrUnknownKey
	}
	if err != nil {
		return "", err
	}
	if rec.Used {
		return "", ErrKeyUsed
	}
	for _, k := range [][]byte{channelOwnerKey(owner), channelPhoneKey(owner), channelOwnerKey(phone), channelPhoneKey(phone)} {
		if _, err := c.db.Get(k); err == nil {
			return "", ErrTokenInUse
		} else if !errors.Is(err, ErrNotFound) {
			return "", err
		}
	}
	rec.Used, rec.Claimed, rec.ClaimedAt = true, true, now.UTC()
	rec.Owner, rec.Phone = owner[:], phone[:]
	raw, err := json.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("store: encode channel key: %w", err)
	}
	b := c.db.NewBatch()
	for _, kv := range [][2][]byte{{channelKeyKey(h), raw}, {channelOwnerKey(owner), h[:]}, {channelPhoneKey(phone), h[:]}} {
		if err := b.Set(kv[0], kv[1]); err != nil {
			b.Discard()
			return "", err
		}
	}
	if err := c.db.Commit(b); err != nil {
		return "", err
	}
	return rec.Host, nil
}

// ByOwner finds the claimed key whose owner token hashes to owner.
func (c *ChannelClaims) ByOwner(owner Hash) (ChannelKey, error) {
	return c.byToken(channelOwnerKey(owner), owner, func(k ChannelKey) Hash { return k.Owner })
}

// ByPhone finds the claimed key whose phone token hashes to phone.
func (c *ChannelClaims) ByPhone(phone Hash) (ChannelKey, error) {
	return c.byToken(channelPhoneKey(phone), phone, func(k ChannelKey) Hash { return k.Phone })
}

func (c *ChannelClaims) byToken(indexKey []byte, tok Hash, field func(ChannelKey) Hash) (ChannelKey, error) {
	raw, err := c.db.Get(indexKey)
	if errors.Is(err, ErrNotFound) || (err == nil && len(raw) != HashLen) {
		return ChannelKey{}, ErrUnknownToken
	}
	if err != nil {
		return ChannelKey{}, err
	}
	var h Hash
	copy(h[:], raw)
	rec, err := c.load(h)
	if errors.Is(err, ErrNotFound) {
		return ChannelKey{}, ErrUnknownToken
	}
	if err != nil {
		return ChannelKey{}, err
	}
	k := toChannelKey(h, rec)
	stored := field(k)
	if !k.Claimed || subtle.ConstantTimeCompare(stored[:], tok[:]) != 1 {
		return ChannelKey{}, ErrUnknownToken
	}
	return k, nil
}

// Release forgets the tokens of the computer whose owner token hashes to
// owner. The claim key stays used.
func (c *ChannelClaims) Release(owner Hash) (ChannelKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, err := c.ByOwner(owner)
	if err != nil {
		return ChannelKey{}, err
	}
	return k, c.forgetLocked(k, false)
}

// Revoke removes host's claim key: a claimed computer loses its tokens and
// the key can never be claimed again (a later claim with it is unknown).
func (c *ChannelClaims) Revoke(host string) (ChannelKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, err := c.keysLocked()
	if err != nil {
		return ChannelKey{}, err
	}
	for _, k := range keys {
		if k.Host == host {
			return k, c.forgetLocked(k, true)
		}
	}
	return ChannelKey{}, fmt.Errorf("%w: %q", ErrUnknownHost, host)
}

func (c *ChannelClaims) forgetLocked(k ChannelKey, removeKey bool) error {
	b := c.db.NewBatch()
	ops := []func() error{}
	if k.Claimed {
		ops = append(ops,
			func() error { return b.Delete(channelOwnerKey(k.Owner)) },
			func() error { return b.Delete(channelPhoneKey(k.Phone)) })
	}
	if removeKey {
		ops = append(ops, func() error { return b.Delete(channelKeyKey(k.Hash)) })
	} else {
		rec := channelKeyRecord{Host: k.Host, Created: k.Created, Used: true, ClaimedAt: k.ClaimedAt}
		raw, err := json.Marshal(rec)
		if err != nil {
			b.Discard()
			return fmt.Errorf("store: encode channel key: %w", err)
		}
		ops = append(ops, func() error { return b.Set(channelKeyKey(k.Hash), raw) })
	}
	for _, op := range ops {
		if err := op(); err != nil {
			b.Discard()
			return err
		}
	}
	return c.db.Commit(b)
}
