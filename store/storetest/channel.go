// Package storetest holds the behaviour contracts of the store interfaces,
// written once and run against every backend: the Pebble store (from
// package store's tests, one handle used as every node) and the cluster
// backends (from their packages' tests, one handle per node, each call of a
// sequence going through the next node).
package storetest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/store"
)

func hash(s string) store.Hash { return sha256.Sum256([]byte(s)) }

// rotor hands out the handles in turn, so that consecutive calls go
// through different nodes.
type rotor[T any] struct {
	hs []T
	n  atomic.Int64
}

func (r *rotor[T]) next() T { return r.hs[int(r.n.Add(1)-1)%len(r.hs)] }

// Channel runs the contract of store.ChannelClaimStore. handles are views of
// one shared state (for one node, the same store every time). Every subtest
// uses its own hosts and keys, so the suite needs no fresh state.
func Channel(t *testing.T, handles []store.ChannelClaimStore) {
	r := &rotor[store.ChannelClaimStore]{hs: handles}
	now := time.Unix(1700000000, 0).UTC()
	add := func(t *testing.T, key, host string) {
		t.Helper()
		if err := r.next().AddKey(hash(key), host, now); err != nil {
			t.Fatalf("add %s: %v", host, err)
		}
	}

	t.Run("Lifecycle", func(t *testing.T) {
		add(t, "life-k1", "life-alpha")
		if err := r.next().AddKey(hash("life-k2"), "life-alpha", now); !errors.Is(err, store.ErrHostExists) {
			t.Fatalf("second key for a host: %v", err)
		}
		if err := r.next().AddKey(hash("life-k1"), "life-beta", now); err == nil {
			t.Fatal("one key hash stored for a second host")
		}
		if ok, err := r.next().HasKey(hash("life-k1")); !ok || err != nil {
			t.Fatalf("has key: %v %v", ok, err)
		}
		if ok, err := r.next().HasKey(hash("life-k2")); ok || err != nil {
			t.Fatalf("has refused key: %v %v", ok, err)
		}
		if _, err := r.next().Claim(hash("life-nope"), hash("life-o"), hash("life-p"), now); !errors.Is(err, store.ErrUnknownKey) {
			t.Fatalf("unknown key: %v", err)
		}
		host, err := r.next().Claim(hash("life-k1"), hash("life-o1"), hash("life-p1"), now)
		if err != nil || host != "life-alpha" {
			t.Fatalf("claim: %q %v", host, err)
		}
		if _, err := r.next().Claim(hash("life-k1"), hash("life-o2"), hash("life-p2"), now); !errors.Is(err, store.ErrKeyUsed) {
			t.Fatalf("second claim: %v", err)
		}
		for range len(handles) { // read back through every node
			k, err := r.next().ByOwner(hash("life-o1"))
			if err != nil || k.Host != "life-alpha" || !k.Claimed || !k.Used || k.Owner != hash("life-o1") || k.Phone != hash("life-p1") || !k.ClaimedAt.Equal(now) {
				t.Fatalf("by owner: %+v %v", k, err)
			}
			if k, err := r.next().ByPhone(hash("life-p1")); err != nil || k.Hash != hash("life-k1") {
				t.Fatalf("by phone: %+v %v", k, err)
			}
		}
		if _, err := r.next().ByPhone(hash("life-o1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("owner token as phone: %v", err)
		}
		if _, err := r.next().ByOwner(hash("life-p1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("phone token as owner: %v", err)
		}
		k, err := r.next().Release(hash("life-o1"))
		if err != nil || !k.Claimed || k.Host != "life-alpha" {
			t.Fatalf("release: %+v %v", k, err)
		}
		if _, err := r.next().Release(hash("life-o1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("second release: %v", err)
		}
		if _, err := r.next().ByOwner(hash("life-o1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("owner after release: %v", err)
		}
		if _, err := r.next().ByPhone(hash("life-p1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("phone after release: %v", err)
		}
		if _, err := r.next().Claim(hash("life-k1"), hash("life-o3"), hash("life-p3"), now); !errors.Is(err, store.ErrKeyUsed) {
			t.Fatalf("claim after release: %v", err)
		}
		k, ok := find(t, r.next(), "life-alpha")
		if !ok || !k.Used || k.Claimed || k.Hash != hash("life-k1") || !k.Created.Equal(now) {
			t.Fatalf("listed: %+v %v", k, ok)
		}
	})

	t.Run("TokensUniqueAcrossKeysAndRoles", func(t *testing.T) {
		add(t, "tok-k1", "tok-1")
		add(t, "tok-k2", "tok-2")
		if _, err := r.next().Claim(hash("tok-k1"), hash("tok-a"), hash("tok-b"), now); err != nil {
			t.Fatal(err)
		}
		for _, pair := range [][2]string{{"tok-a", "tok-x"}, {"tok-x", "tok-a"}, {"tok-b", "tok-x"}, {"tok-x", "tok-b"}} {
			if _, err := r.next().Claim(hash("tok-k2"), hash(pair[0]), hash(pair[1]), now); !errors.Is(err, store.ErrTokenInUse) {
				t.Fatalf("%v: %v", pair, err)
			}
		}
		// Refused claims spent neither the key nor their fresh token.
		if _, err := r.next().Claim(hash("tok-k2"), hash("tok-x"), hash("tok-y"), now); err != nil {
			t.Fatalf("k2 after refusals: %v", err)
		}
		// A released token is free for another computer.
		add(t, "tok-k3", "tok-3")
		if _, err := r.next().Release(hash("tok-a")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.next().Claim(hash("tok-k3"), hash("tok-a"), hash("tok-b"), now); err != nil {
			t.Fatalf("released tokens reused: %v", err)
		}
		if k, err := r.next().ByOwner(hash("tok-a")); err != nil || k.Host != "tok-3" {
			t.Fatalf("reused owner token: %+v %v", k, err)
		}
	})

	t.Run("RacingClaimsExactlyOneWins", func(t *testing.T) {
		for round := range 4 {
			key := fmt.Sprint("race-k", round)
			add(t, key, fmt.Sprint("race-", round))
			const racers = 12
			var wins, used atomic.Int32
			var winner atomic.Int32
			var wg sync.WaitGroup
			for i := range racers {
				c := r.next()
				wg.Go(func() {
					_, err := c.Claim(hash(key), hash(fmt.Sprint(key, "o", i)), hash(fmt.Sprint(key, "p", i)), now)
					switch {
					case err == nil:
						wins.Add(1)
						winner.Store(int32(i))
					case errors.Is(err, store.ErrKeyUsed):
						used.Add(1)
					default:
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if wins.Load() != 1 || used.Load() != racers-1 {
				t.Fatalf("round %d: wins %d used %d", round, wins.Load(), used.Load())
			}
			// Only the winner's tokens work, through every node.
			w := winner.Load()
			for i := range racers {
				for range len(handles) {
					_, err := r.next().ByOwner(hash(fmt.Sprint(key, "o", i)))
					_, perr := r.next().ByPhone(hash(fmt.Sprint(key, "p", i)))
					if int32(i) == w && (err != nil || perr != nil) {
						t.Fatalf("round %d: winner's tokens: %v %v", round, err, perr)
					}
					if int32(i) != w && (!errors.Is(err, store.ErrUnknownToken) || !errors.Is(perr, store.ErrUnknownToken)) {
						t.Fatalf("round %d: loser %d's tokens: %v %v", round, i, err, perr)
					}
				}
			}
		}
	})

	t.Run("Revoke", func(t *testing.T) {
		add(t, "rev-k", "rev-alpha")
		if _, err := r.next().Claim(hash("rev-k"), hash("rev-o"), hash("rev-p"), now); err != nil {
			t.Fatal(err)
		}
		if _, err := r.next().Revoke("rev-beta"); !errors.Is(err, store.ErrUnknownHost) {
			t.Fatalf("revoke unknown: %v", err)
		}
		k, err := r.next().Revoke("rev-alpha")
		if err != nil || k.Hash != hash("rev-k") || !k.Claimed {
			t.Fatalf("revoke: %+v %v", k, err)
		}
		if _, err := r.next().Revoke("rev-alpha"); !errors.Is(err, store.ErrUnknownHost) {
			t.Fatalf("second revoke: %v", err)
		}
		for range len(handles) {
			if _, err := r.next().ByOwner(hash("rev-o")); !errors.Is(err, store.ErrUnknownToken) {
				t.Fatalf("owner after revoke: %v", err)
			}
			if _, err := r.next().ByPhone(hash("rev-p")); !errors.Is(err, store.ErrUnknownToken) {
				t.Fatalf("phone after revoke: %v", err)
			}
		}
		if _, err := r.next().Claim(hash("rev-k"), hash("rev-o2"), hash("rev-p2"), now); !errors.Is(err, store.ErrUnknownKey) {
			t.Fatalf("claim revoked key: %v", err)
		}
		if ok, err := r.next().HasKey(hash("rev-k")); ok || err != nil {
			t.Fatalf("has revoked key: %v %v", ok, err)
		}
		if _, ok := find(t, r.next(), "rev-alpha"); ok {
			t.Fatal("revoked key listed")
		}
		// The host name and the computer's tokens are free again.
		add(t, "rev-k3", "rev-alpha")
		if _, err := r.next().Claim(hash("rev-k3"), hash("rev-o"), hash("rev-p"), now); err != nil {
			t.Fatalf("claim with the revoked computer's tokens: %v", err)
		}
		if k, err := r.next().ByOwner(hash("rev-o")); err != nil || k.Hash != hash("rev-k3") {
			t.Fatalf("by owner after re-add: %+v %v", k, err)
		}
		// An unclaimed key revokes too.
		add(t, "rev-k4", "rev-gamma")
		if _, err := r.next().Revoke("rev-gamma"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.next().Claim(hash("rev-k4"), hash("rev-o4"), hash("rev-p4"), now); !errors.Is(err, store.ErrUnknownKey) {
			t.Fatalf("claim revoked unclaimed key: %v", err)
		}
	})

	t.Run("RacingAddsOneHost", func(t *testing.T) {
		const racers = 6
		var wins, exists atomic.Int32
		var wg sync.WaitGroup
		for i := range racers {
			c := r.next()
			wg.Go(func() {
				err := c.AddKey(hash(fmt.Sprint("addrace-k", i)), "addrace", now)
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, store.ErrHostExists):
					exists.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 || exists.Load() != racers-1 {
			t.Fatalf("wins %d exists %d", wins.Load(), exists.Load())
		}
		n := 0
		keys, err := r.next().Keys()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if k.Host == "addrace" {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d keys listed for the host", n)
		}
	})

	t.Run("KeysOrderedByHost", func(t *testing.T) {
		for _, host := range []string{"ord-c", "ord-a", "ord-b"} {
			add(t, "ord-key-"+host, host)
		}
		keys, err := r.next().Keys()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, k := range keys {
			if i > 0 && keys[i-1].Host > k.Host {
				t.Fatalf("not ordered: %q before %q", keys[i-1].Host, k.Host)
			}
			if strings.HasPrefix(k.Host, "ord-") {
				got = append(got, k.Host)
				if k.Hash != hash("ord-key-"+k.Host) || k.Used {
					t.Fatalf("listed: %+v", k)
				}
			}
		}
		if strings.Join(got, ",") != "ord-a,ord-b,ord-c" {
			t.Fatalf("listed %v", got)
		}
	})
}

// find returns the listed key of host.
func find(t *testing.T, c store.ChannelClaimStore, host string) (store.ChannelKey, bool) {
	t.Helper()
	keys, err := c.Keys()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Host == host {
			return k, true
		}
	}
	return store.ChannelKey{}, false
}
