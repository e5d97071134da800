package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/store"
)

// pairingRetention mirrors the stores' retention of spent and expired
// pairing keys: a day after their expiry.
const pairingRetention = 24 * time.Hour

// Agent runs the contract of store.AgentRecords. handles are views of one
// shared state (for one node, the same store every time). Every subtest uses
// its own accounts and keys; the pruning subtest runs last, since it prunes
// every pairing key of the state.
func Agent(t *testing.T, handles []store.AgentRecords) {
	r := &rotor[store.AgentRecords]{hs: handles}
	now := time.Unix(1700000000, 0).UTC()
	account := func(t *testing.T, id, name string) {
		t.Helper()
		if err := r.next().AddAccount(id, name, hash("client-"+id), now); err != nil {
			t.Fatalf("add account %s: %v", name, err)
		}
	}
	pairing := func(t *testing.T, key, acct string, ttl time.Duration) {
		t.Helper()
		if err := r.next().AddPairingKey(hash(key), acct, now, now.Add(ttl)); err != nil {
			t.Fatalf("add pairing key: %v", err)
		}
	}

	t.Run("Lifecycle", func(t *testing.T) {
		account(t, "life-acc1", "life-alice")
		if err := r.next().AddAccount("life-acc2", "life-alice", hash("life-other"), now); !errors.Is(err, store.ErrAccountExists) {
			t.Fatalf("duplicate name: %v", err)
		}
		if err := r.next().AddAccount("life-acc2", "life-bob", hash("client-life-acc1"), now); err == nil {
			t.Fatal("a client token stored twice")
		}
		if err := r.next().AddAccount("life-acc1", "life-carol", hash("life-carol"), now); err == nil {
			t.Fatal("an account id stored twice")
		}
		// Refused adds left nothing behind: the names are free.
		account(t, "life-acc2", "life-bob")
		account(t, "life-acc3", "life-carol")
		for range len(handles) {
			a, err := r.next().AccountByName("life-alice")
			if err != nil || a.ID != "life-acc1" || a.ClientToken != hash("client-life-acc1") || !a.Created.Equal(now) {
				t.Fatalf("by name: %+v %v", a, err)
			}
			if a, err := r.next().Account("life-acc2"); err != nil || a.Name != "life-bob" {
				t.Fatalf("by id: %+v %v", a, err)
			}
			if a, err := r.next().AccountByClientToken(hash("client-life-acc1")); err != nil || a.ID != "life-acc1" {
				t.Fatalf("by client token: %+v %v", a, err)
			}
		}
		if _, err := r.next().AccountByName("life-nobody"); !errors.Is(err, store.ErrUnknownAccount) {
			t.Fatalf("unknown name: %v", err)
		}
		if _, err := r.next().Account("life-nobody"); !errors.Is(err, store.ErrUnknownAccount) {
			t.Fatalf("unknown id: %v", err)
		}
		if _, err := r.next().Account(""); !errors.Is(err, store.ErrUnknownAccount) {
			t.Fatalf("empty id: %v", err)
		}
		if _, err := r.next().AccountByClientToken(hash("life-other")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("refused account's token: %v", err)
		}
		if err := r.next().AddPairingKey(hash("life-pk1"), "life-nobody", now, now.Add(time.Minute)); !errors.Is(err, store.ErrUnknownAccount) {
			t.Fatalf("pairing key for unknown account: %v", err)
		}
		pairing(t, "life-pk1", "life-acc1", 15*time.Minute)
		if err := r.next().AddPairingKey(hash("life-pk1"), "life-acc1", now, now.Add(time.Minute)); err == nil {
			t.Fatal("a pairing key stored twice")
		}
		inst, err := r.next().RedeemPairingKey(hash("life-pk1"), "life-inst1", "host-1", hash("life-itok1"), now.Add(time.Minute))
		if err != nil || inst.Account != "life-acc1" || inst.Name != "host-1" || inst.ID != "life-inst1" || inst.Token != hash("life-itok1") || inst.Revoked {
			t.Fatalf("redeem: %+v %v", inst, err)
		}
		if _, err := r.next().RedeemPairingKey(hash("life-pk1"), "life-inst2", "host-2", hash("life-itok2"), now.Add(2*time.Minute)); !errors.Is(err, store.ErrPairingUsed) {
			t.Fatalf("second redeem: %v", err)
		}
		for range len(handles) {
			got, err := r.next().InstanceByToken(hash("life-itok1"))
			if err != nil || got.ID != "life-inst1" || got.Account != "life-acc1" || !got.Created.Equal(now.Add(time.Minute)) {
				t.Fatalf("instance by token: %+v %v", got, err)
			}
		}
		if _, err := r.next().InstanceByToken(hash("life-itok2")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("refused redemption's token: %v", err)
		}
		if _, err := r.next().InstanceByToken(hash("client-life-acc1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("client token as instance token: %v", err)
		}
		if _, err := r.next().AccountByClientToken(hash("life-itok1")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("instance token as client token: %v", err)
		}
		// Revocation forgets the token at once, on every node, and keeps
		// the record.
		if got, err := r.next().RevokeInstance("life-inst1"); err != nil || !got.Revoked || got.ID != "life-inst1" {
			t.Fatalf("revoke: %+v %v", got, err)
		}
		for range len(handles) {
			if _, err := r.next().InstanceByToken(hash("life-itok1")); !errors.Is(err, store.ErrUnknownToken) {
				t.Fatalf("revoked instance token: %v", err)
			}
			if got, err := r.next().Instance("life-inst1"); err != nil || !got.Revoked {
				t.Fatalf("revoked record: %+v %v", got, err)
			}
		}
		if got, err := r.next().RevokeInstance("life-inst1"); err != nil || !got.Revoked {
			t.Fatalf("second revoke: %+v %v", got, err)
		}
		if _, err := r.next().RevokeInstance("life-nope"); !errors.Is(err, store.ErrUnknownInstance) {
			t.Fatalf("revoke unknown: %v", err)
		}
		if _, err := r.next().Instance("life-nope"); !errors.Is(err, store.ErrUnknownInstance) {
			t.Fatalf("unknown instance: %v", err)
		}
		insts := instancesOf(t, r.next(), "life-acc1")
		if len(insts) != 1 || !insts[0].Revoked || insts[0].ID != "life-inst1" {
			t.Fatalf("instances: %+v", insts)
		}
	})

	t.Run("HostileIDsAreUnknown", func(t *testing.T) {
		// Operators' commands name ids: anything must read as unknown.
		for _, id := range []string{"", "a.b", "../x", "*", ">", "a b", strings.Repeat("x", 10000)} {
			if _, err := r.next().Instance(id); !errors.Is(err, store.ErrUnknownInstance) {
				t.Fatalf("instance %.20q: %v", id, err)
			}
			if _, err := r.next().RevokeInstance(id); !errors.Is(err, store.ErrUnknownInstance) {
				t.Fatalf("revoke %.20q: %v", id, err)
			}
			if _, err := r.next().Account(id); !errors.Is(err, store.ErrUnknownAccount) {
				t.Fatalf("account %.20q: %v", id, err)
			}
			if _, err := r.next().AccountByName(id); !errors.Is(err, store.ErrUnknownAccount) {
				t.Fatalf("account by name %.20q: %v", id, err)
			}
			if err := r.next().AddPairingKey(hash("hostile-pk"), id, now, now.Add(time.Hour)); !errors.Is(err, store.ErrUnknownAccount) {
				t.Fatalf("pairing key for account %.20q: %v", id, err)
			}
		}
	})

	t.Run("ListsOrdered", func(t *testing.T) {
		for _, n := range []string{"c", "a", "b"} {
			account(t, "ord-acc-"+n, "ord-"+n)
		}
		accounts, err := r.next().Accounts()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, a := range accounts {
			if i > 0 && accounts[i-1].Name > a.Name {
				t.Fatalf("accounts not ordered: %q before %q", accounts[i-1].Name, a.Name)
			}
			if strings.HasPrefix(a.Name, "ord-") {
				got = append(got, a.ID)
			}
		}
		if strings.Join(got, ",") != "ord-acc-a,ord-acc-b,ord-acc-c" {
			t.Fatalf("accounts %v", got)
		}
		// Instances by account, then name, then id.
		for i, p := range [][3]string{{"ord-acc-b", "n1", "i3"}, {"ord-acc-a", "n2", "i1"}, {"ord-acc-a", "n1", "i2"}, {"ord-acc-a", "n1", "i0"}} {
			key := fmt.Sprint("ord-pk", i)
			pairing(t, key, p[0], time.Hour)
			if _, err := r.next().RedeemPairingKey(hash(key), "ord-"+p[2], p[1], hash(key+"tok"), now); err != nil {
				t.Fatal(err)
			}
		}
		all, err := r.next().Instances()
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, in := range all {
			if strings.HasPrefix(in.ID, "ord-") {
				got = append(got, in.ID)
			}
		}
		if strings.Join(got, ",") != "ord-i0,ord-i2,ord-i1,ord-i3" {
			t.Fatalf("instances %v", got)
		}
	})

	t.Run("PairingKeyExpiry", func(t *testing.T) {
		account(t, "exp-acc", "exp-a")
		pairing(t, "exp-pk", "exp-acc", 15*time.Minute)
		// The limit: a key is valid strictly before its expiry.
		if _, err := r.next().RedeemPairingKey(hash("exp-pk"), "exp-i", "n", hash("exp-t"), now.Add(15*time.Minute)); !errors.Is(err, store.ErrPairingExpired) {
			t.Fatalf("redeem at expiry: %v", err)
		}
		if _, err := r.next().RedeemPairingKey(hash("exp-unknown"), "exp-i", "n", hash("exp-t"), now); !errors.Is(err, store.ErrPairingUnknown) {
			t.Fatalf("unknown key: %v", err)
		}
		if _, err := r.next().InstanceByToken(hash("exp-t")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("a failed redemption created an instance: %v", err)
		}
		if _, err := r.next().Instance("exp-i"); !errors.Is(err, store.ErrUnknownInstance) {
			t.Fatalf("a failed redemption created an instance: %v", err)
		}
		if _, err := r.next().RedeemPairingKey(hash("exp-pk"), "exp-i", "n", hash("exp-t"), now.Add(15*time.Minute-time.Nanosecond)); err != nil {
			t.Fatalf("redeem just before expiry: %v", err)
		}
		// An instance id is never reused.
		pairing(t, "exp-pk2", "exp-acc", time.Hour)
		if _, err := r.next().RedeemPairingKey(hash("exp-pk2"), "exp-i", "n", hash("exp-t2"), now); !errors.Is(err, store.ErrInstanceExists) {
			t.Fatalf("instance id reused: %v", err)
		}
		if _, err := r.next().RedeemPairingKey(hash("exp-pk2"), "exp-i2", "n", hash("exp-t2"), now); err != nil {
			t.Fatalf("key spent by a refused redemption: %v", err)
		}
	})

	t.Run("RacingRedemptionsOneInstance", func(t *testing.T) {
		account(t, "race-acc", "race-a")
		for round := range 4 {
			key := fmt.Sprint("race-pk", round)
			pairing(t, key, "race-acc", time.Hour)
			const racers = 12
			var wins, used atomic.Int32
			var wg sync.WaitGroup
			for i := range racers {
				c := r.next()
				wg.Go(func() {
					_, err := c.RedeemPairingKey(hash(key), fmt.Sprint(key, "-i", i), "n", hash(fmt.Sprint(key, "t", i)), now)
					switch {
					case err == nil:
						wins.Add(1)
					case errors.Is(err, store.ErrPairingUsed):
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
		}
		if insts := instancesOf(t, r.next(), "race-acc"); len(insts) != 4 {
			t.Fatalf("%d instances from 4 keys: %+v", len(insts), insts)
		}
	})

	t.Run("RacingAddsOneName", func(t *testing.T) {
		const racers = 6
		var wins, exists atomic.Int32
		var wg sync.WaitGroup
		for i := range racers {
			c := r.next()
			wg.Go(func() {
				err := c.AddAccount(fmt.Sprint("namerace-", i), "namerace", hash(fmt.Sprint("namerace-c", i)), now)
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, store.ErrAccountExists):
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
		accounts, err := r.next().Accounts()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, a := range accounts {
			if a.Name == "namerace" {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d accounts listed with the name", n)
		}
	})

	// Last: it prunes every pairing key of the state.
	t.Run("PruneAfterRetention", func(t *testing.T) {
		account(t, "prune-acc", "prune-a")
		pairing(t, "prune-old", "prune-acc", time.Minute)
		pairing(t, "prune-young", "prune-acc", 2*time.Hour)
		// Past the old key's retention, within the young one's.
		later := now.Add(time.Minute + pairingRetention + time.Second)
		if err := r.next().AddPairingKey(hash("prune-new"), "prune-acc", later, later.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.next().RedeemPairingKey(hash("prune-old"), "prune-i", "n", hash("prune-t"), later); !errors.Is(err, store.ErrPairingUnknown) {
			t.Fatalf("pruned key: %v", err)
		}
		if _, err := r.next().RedeemPairingKey(hash("prune-young"), "prune-i", "n", hash("prune-t"), later); !errors.Is(err, store.ErrPairingExpired) {
			t.Fatalf("expired key within retention: %v", err)
		}
		if _, err := r.next().RedeemPairingKey(hash("prune-new"), "prune-i", "n", hash("prune-t"), later); err != nil {
			t.Fatalf("new key: %v", err)
		}
	})
}

// instancesOf lists the instances of account.
func instancesOf(t *testing.T, c store.AgentRecords, account string) []store.AgentInstance {
	t.Helper()
	all, err := c.Instances()
	if err != nil {
		t.Fatal(err)
	}
	var out []store.AgentInstance
	for _, in := range all {
		if in.Account == account {
			out = append(out, in)
		}
	}
	return out
}
