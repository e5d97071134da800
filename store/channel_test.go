package store

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func h(s string) Hash { return sha256.Sum256([]byte(s)) }

func openTemp(t *testing.T, dir string) *DB {
	t.Helper()
	db, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestClaimLifecycleSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	c := NewChannelClaims(db)
	now := time.Unix(1700000000, 0)
	if err := c.AddKey(h("k1"), "alpha", now); err != nil {
		t.Fatal(err)
	}
	if err := c.AddKey(h("k2"), "alpha", now); !errors.Is(err, ErrHostExists) {
		t.Fatalf("duplicate host: %v", err)
	}
	if _, err := c.Claim(h("nope"), h("o"), h("p"), now); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	host, err := c.Claim(h("k1"), h("o1"), h("p1"), now)
	if err != nil || host != "alpha" {
		t.Fatalf("claim: %q %v", host, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openTemp(t, dir)
	defer db.Close()
	c = NewChannelClaims(db)
	if _, err := c.Claim(h("k1"), h("o2"), h("p2"), now); !errors.Is(err, ErrKeyUsed) {
		t.Fatalf("reclaim after reopen: %v", err)
	}
	k, err := c.ByOwner(h("o1"))
	if err != nil || k.Host != "alpha" || !k.Claimed {
		t.Fatalf("by owner: %+v %v", k, err)
	}
	if _, err := c.ByPhone(h("o1")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("owner token as phone: %v", err)
	}
	if k, err := c.ByPhone(h("p1")); err != nil || k.Host != "alpha" {
		t.Fatalf("by phone: %+v %v", k, err)
	}
	if _, err := c.Release(h("o1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ByOwner(h("o1")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("owner after release: %v", err)
	}
	if _, err := c.ByPhone(h("p1")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("phone after release: %v", err)
	}
	if _, err := c.Claim(h("k1"), h("o3"), h("p3"), now); !errors.Is(err, ErrKeyUsed) {
		t.Fatalf("reclaim after release: %v", err)
	}
	keys, err := c.Keys()
	if err != nil || len(keys) != 1 || !keys[0].Used || keys[0].Claimed {
		t.Fatalf("keys: %+v %v", keys, err)
	}
}

func TestTokensUniqueAcrossKeysAndRoles(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	c := NewChannelClaims(db)
	now := time.Now()
	for _, k := range []string{"k1", "k2"} {
		if err := c.AddKey(h(k), "host-"+k, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Claim(h("k1"), h("a"), h("b"), now); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]string{{"a", "x"}, {"x", "a"}, {"b", "x"}, {"x", "b"}} {
		if _, err := c.Claim(h("k2"), h(pair[0]), h(pair[1]), now); !errors.Is(err, ErrTokenInUse) {
			t.Fatalf("%v: %v", pair, err)
		}
	}
	if _, err := c.Claim(h("k2"), h("x"), h("y"), now); err != nil {
		t.Fatalf("k2 unspent by refusals: %v", err)
	}
}

func TestRacingClaimsExactlyOneWins(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	c := NewChannelClaims(db)
	if err := c.AddKey(h("k"), "alpha", time.Now()); err != nil {
		t.Fatal(err)
	}
	var wins, used atomic.Int32
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Claim(h("k"), h(fmt.Sprint("o", i)), h(fmt.Sprint("p", i)), time.Now())
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, ErrKeyUsed):
				used.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || used.Load() != 31 {
		t.Fatalf("wins %d used %d", wins.Load(), used.Load())
	}
}

func TestRevoke(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	c := NewChannelClaims(db)
	now := time.Now()
	if err := c.AddKey(h("k"), "alpha", now); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(h("k"), h("o"), h("p"), now); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Revoke("beta"); !errors.Is(err, ErrUnknownHost) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if _, err := c.Revoke("alpha"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ByOwner(h("o")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("owner after revoke: %v", err)
	}
	if _, err := c.Claim(h("k"), h("o2"), h("p2"), now); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("claim revoked key: %v", err)
	}
	// The host name is free again.
	if err := c.AddKey(h("k3"), "alpha", now); err != nil {
		t.Fatal(err)
	}
}

func TestSecondOpenFailsWhileLocked(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	defer db.Close()
	if db2, err := Open(dir, nil); err == nil {
		db2.Close()
		t.Fatal("second open of a locked store succeeded")
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct{ in, want []byte }{
		{[]byte{1, 2}, []byte{1, 3}},
		{[]byte{1, 0xff}, []byte{2}},
		{[]byte{0xff, 0xff}, nil},
	} {
		if got := PrefixEnd(c.in); string(got) != string(c.want) {
			t.Fatalf("PrefixEnd(%v) = %v", c.in, got)
		}
	}
}
