package store

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAgentLifecycleSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	s := NewAgentStore(db)
	now := time.Unix(1700000000, 0)

	if err := s.AddAccount("acc1", "alice", h("client-a"), now); err != nil {
		t.Fatal(err)
	}
	if err := s.AddAccount("acc2", "alice", h("client-b"), now); !errors.Is(err, ErrAccountExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if err := s.AddAccount("acc2", "bob", h("client-a"), now); err == nil {
		t.Fatal("a client token stored twice")
	}
	if err := s.AddPairingKey(h("pk1"), "nobody", now, now.Add(time.Minute)); !errors.Is(err, ErrUnknownAccount) {
		t.Fatalf("pairing key for unknown account: %v", err)
	}
	if err := s.AddPairingKey(h("pk1"), "acc1", now, now.Add(15*time.Minute)); err != nil {
		t.Fatal(err)
	}
	inst, err := s.RedeemPairingKey(h("pk1"), "inst1", "host-1", h("itok1"), now.Add(time.Minute))
	if err != nil || inst.Account != "acc1" || inst.Name != "host-1" || inst.ID != "inst1" {
		t.Fatalf("redeem: %+v %v", inst, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openTemp(t, dir)
	defer db.Close()
	s = NewAgentStore(db)
	if _, err := s.RedeemPairingKey(h("pk1"), "inst2", "host-2", h("itok2"), now.Add(2*time.Minute)); !errors.Is(err, ErrPairingUsed) {
		t.Fatalf("second redeem after reopen: %v", err)
	}
	a, err := s.AccountByClientToken(h("client-a"))
	if err != nil || a.ID != "acc1" || a.Name != "alice" {
		t.Fatalf("account by client token: %+v %v", a, err)
	}
	if _, err := s.AccountByClientToken(h("itok1")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("instance token as client token: %v", err)
	}
	got, err := s.InstanceByToken(h("itok1"))
	if err != nil || got.ID != "inst1" || got.Account != "acc1" {
		t.Fatalf("instance by token: %+v %v", got, err)
	}
	if _, err := s.InstanceByToken(h("client-a")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("client token as instance token: %v", err)
	}
	keys, err := s.PairingKeys()
	if err != nil || len(keys) != 1 || !keys[0].Used || keys[0].Instance != "inst1" {
		t.Fatalf("pairing keys: %+v %v", keys, err)
	}

	// Revocation forgets the token at once and keeps the record.
	if _, err := s.RevokeInstance("inst1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.InstanceByToken(h("itok1")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("revoked instance token: %v", err)
	}
	if got, err := s.Instance("inst1"); err != nil || !got.Revoked {
		t.Fatalf("revoked record: %+v %v", got, err)
	}
	if _, err := s.RevokeInstance("inst1"); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	if _, err := s.RevokeInstance("nope"); !errors.Is(err, ErrUnknownInstance) {
		t.Fatalf("revoke unknown: %v", err)
	}
	list, err := s.Instances()
	if err != nil || len(list) != 1 || !list[0].Revoked {
		t.Fatalf("instances: %+v %v", list, err)
	}
}

func TestAgentPairingKeyExpiry(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	s := NewAgentStore(db)
	now := time.Unix(1700000000, 0)
	if err := s.AddAccount("acc", "a", h("c"), now); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPairingKey(h("pk"), "acc", now, now.Add(15*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// The limit: a key is valid strictly before its expiry.
	if _, err := s.RedeemPairingKey(h("pk"), "i", "n", h("t"), now.Add(15*time.Minute)); !errors.Is(err, ErrPairingExpired) {
		t.Fatalf("redeem at expiry: %v", err)
	}
	if _, err := s.RedeemPairingKey(h("unknown"), "i", "n", h("t"), now); !errors.Is(err, ErrPairingUnknown) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := s.InstanceByToken(h("t")); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("a failed redemption created an instance: %v", err)
	}
	if _, err := s.RedeemPairingKey(h("pk"), "i", "n", h("t"), now.Add(15*time.Minute-time.Nanosecond)); err != nil {
		t.Fatalf("redeem just before expiry: %v", err)
	}

	// Records more than a day past their expiry are pruned by the next
	// PairKey; younger ones stay so that a retry still says why.
	if err := s.AddPairingKey(h("pk2"), "acc", now, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	later := now.Add(15*time.Minute + pairingRetention + time.Second)
	if err := s.AddPairingKey(h("pk3"), "acc", later, later.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	keys, err := s.PairingKeys()
	if err != nil || len(keys) != 1 || keys[0].Hash != h("pk3") {
		t.Fatalf("after pruning: %+v %v", keys, err)
	}
}

// TestAgentRedeemRace: of many concurrent redemptions of one key exactly
// one wins.
func TestAgentRedeemRace(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	s := NewAgentStore(db)
	now := time.Unix(1700000000, 0)
	if err := s.AddAccount("acc", "a", h("c"), now); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPairingKey(h("pk"), "acc", now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var wins, used atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			_, err := s.RedeemPairingKey(h("pk"), fmt.Sprint("i", i), "n", h(fmt.Sprint("t", i)), now)
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, ErrPairingUsed):
				used.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || used.Load() != 15 {
		t.Fatalf("wins %d used %d", wins.Load(), used.Load())
	}
	list, _ := s.Instances()
	if len(list) != 1 {
		t.Fatalf("%d instances", len(list))
	}
}

// TestAgentStoresNoSecret: no key or value of the agent keyspace holds a
// secret in the clear.
func TestAgentStoresNoSecret(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	s := NewAgentStore(db)
	now := time.Unix(1700000000, 0)
	secrets := []string{"client-secret-xyz", "pairing-secret-xyz", "instance-secret-xyz"}
	if err := s.AddAccount("acc", "a", h(secrets[0]), now); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPairingKey(h(secrets[1]), "acc", now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RedeemPairingKey(h(secrets[1]), "inst", "host", h(secrets[2]), now); err != nil {
		t.Fatal(err)
	}
	n := 0
	err := db.Scan([]byte{serviceAgent}, func(k, v []byte) error {
		n++
		for _, sec := range secrets {
			if bytes.Contains(k, []byte(sec)) || bytes.Contains(v, []byte(sec)) {
				t.Errorf("secret %q stored under %q", sec, k)
			}
		}
		return nil
	})
	if err != nil || n != 5 {
		t.Fatalf("%d records, %v", n, err)
	}
}
