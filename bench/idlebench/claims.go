package idlebench

import (
	"fmt"
	"sync"
	"time"

	"edgerelay/store"
)

// memClaims is the channel relay's claim store for these benchmarks: the
// computers' claims in a map. Pebble's store (store.ChannelClaims) keeps
// host names unique by scanning every stored key on each AddKey, which is
// quadratic in the computers: 10,000 control sockets would take minutes
// of claims before the first socket. The store holds nothing per socket,
// so what a socket costs is the same with either.
type memClaims struct {
	mu      sync.Mutex
	byOwner map[store.Hash]store.ChannelKey
	byPhone map[store.Hash]store.ChannelKey
}

var _ store.ChannelClaimStore = (*memClaims)(nil)

// newMemClaims holds n claimed computers: computer i's tokens are
// OwnerToken(i) and PhoneToken(i).
func newMemClaims(n int) *memClaims {
	c := &memClaims{byOwner: make(map[store.Hash]store.ChannelKey, n), byPhone: make(map[store.Hash]store.ChannelKey, n)}
	now := time.Now()
	for i := range n {
		k := store.ChannelKey{
			Hash: hashOf(fmt.Sprintf("claimkey%056d", i)), Host: fmt.Sprintf("bench-%d", i),
			Created: now, Used: true, ClaimedAt: now, Claimed: true,
			Owner: hashOf(OwnerToken(i)), Phone: hashOf(PhoneToken(i)),
		}
		c.byOwner[k.Owner], c.byPhone[k.Phone] = k, k
	}
	return c
}

func (c *memClaims) ByOwner(owner store.Hash) (store.ChannelKey, error) {
	return c.lookup(c.byOwner, owner)
}

func (c *memClaims) ByPhone(phone store.Hash) (store.ChannelKey, error) {
	return c.lookup(c.byPhone, phone)
}

func (c *memClaims) lookup(m map[store.Hash]store.ChannelKey, h store.Hash) (store.ChannelKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := m[h]
	if !ok {
		return store.ChannelKey{}, store.ErrUnknownToken
	}
	return k, nil
}

// The benchmark never adds, claims, releases or revokes computers while
// it runs: every computer is claimed at start-up.
var errFixedClaims = fmt.Errorf("idlebench: the benchmark's computers are fixed at start-up")

func (c *memClaims) AddKey(store.Hash, string, time.Time) error { return errFixedClaims }
func (c *memClaims) HasKey(store.Hash) (bool, error)            { return false, nil }
func (c *memClaims) Keys() ([]store.ChannelKey, error)          { return nil, nil }
func (c *memClaims) Claim(_, _, _ store.Hash, _ time.Time) (string, error) {
	return "", errFixedClaims
}
func (c *memClaims) Release(store.Hash) (store.ChannelKey, error) {
	return store.ChannelKey{}, errFixedClaims
}
func (c *memClaims) Revoke(string) (store.ChannelKey, error) {
	return store.ChannelKey{}, errFixedClaims
}
