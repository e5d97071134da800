package storetest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/store"
)

// PushOpen returns the handles of one push-gateway scope onto the shared
// state of a run: for Pebble the same store every time, for the cluster
// one per node. Asked again for a scope, it returns the same handles.
type PushOpen func(t *testing.T, scope store.PushScope) []store.PushGatewayStore

// PushSync is how long a key written through one handle may take to show
// on the others (the cluster's key watchers; Pebble: at once). The handle
// that wrote sees it when the call returns.
const PushSync = time.Second

// PushGateway runs the contract of store.PushGatewayStore. Calls of a
// sequence go through the handles in turn; every subtest uses its own key
// ids, tokens, addresses and days, so the state needs no reset.
func PushGateway(t *testing.T, open PushOpen) {
	hs := open(t, store.PushScopeShared)
	var turn atomic.Int64
	next := func() store.PushGatewayStore { return hs[int(turn.Add(1)-1)%len(hs)] }
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	add := func(t *testing.T, k store.PushKey) {
		t.Helper()
		if err := next().AddKey(k); err != nil {
			t.Fatalf("add %s: %v", k.ID, err)
		}
		waitKey(t, hs, k.ID, func(got store.PushKey, ok bool) bool { return ok })
	}

	t.Run("Keys", func(t *testing.T) {
		k := pushKey("keys-a", t0)
		k.ExpiresAt = t0.Add(time.Hour)
		w := next()
		if err := w.AddKey(k); err != nil {
			t.Fatal(err)
		}
		if got, ok := w.KeyByHash(k.Hash); !ok || got.ID != k.ID { // the writer, at once
			t.Fatalf("writer's read: %+v %v", got, ok)
		}
		// Another node finds a new key at once too: a server that gets its
		// key through one node may use it through the next.
		if got, ok := next().KeyByHash(k.Hash); !ok || got.ID != k.ID {
			t.Fatalf("read through another handle right after the write: %+v %v", got, ok)
		}
		if got, ok := next().KeyByID(k.ID); !ok || got.Hash != k.Hash {
			t.Fatalf("read by id through another handle right after the write: %+v %v", got, ok)
		}
		waitKey(t, hs, k.ID, func(got store.PushKey, ok bool) bool { return ok })
		for _, h := range hs {
			got, ok := h.KeyByHash(k.Hash)
			if !ok || got.ID != k.ID || got.Label != k.Label || !got.Enabled || !got.CreatedAt.Equal(t0) ||
				!got.ExpiresAt.Equal(k.ExpiresAt) || got.Source != store.PushSourceAdmin || got.RegisteredIP != "" {
				t.Fatalf("key read back %+v %v, want %+v", got, ok, k)
			}
		}
		for _, dup := range []store.PushKey{k, pushKey("keys-a", t0)} {
			if err := next().AddKey(dup); !errors.Is(err, store.ErrPushKeyExists) {
				t.Fatalf("duplicate: %v", err)
			}
		}
		if err := next().AddKey(store.PushKey{Hash: hash("keys-noid")}); err == nil {
			t.Fatal("key without id stored")
		}
		w = next()
		if err := w.SetKeyEnabled(k.ID, false); err != nil {
			t.Fatal(err)
		}
		if got, _ := w.KeyByID(k.ID); got.Enabled {
			t.Fatal("writer still sees the key enabled")
		}
		waitKey(t, hs, k.ID, func(got store.PushKey, ok bool) bool { return ok && !got.Enabled })
		if err := next().SetKeyEnabled(k.ID, false); err != nil { // no change
			t.Fatal(err)
		}
		if err := next().SetKeyEnabled(k.ID, true); err != nil {
			t.Fatal(err)
		}
		waitKey(t, hs, k.ID, func(got store.PushKey, ok bool) bool { return ok && got.Enabled })
		for _, op := range []func(store.PushGatewayStore) error{
			func(h store.PushGatewayStore) error { return h.SetKeyEnabled("keys-none", false) },
			func(h store.PushGatewayStore) error { return h.DeleteKey("keys-none") },
		} {
			if err := op(next()); !errors.Is(err, store.ErrUnknownPushKey) {
				t.Fatalf("unknown id: %v", err)
			}
		}
		b := pushKey("keys-b", t0.Add(-time.Minute)) // older: listed first
		add(t, b)
		for _, h := range hs {
			ids := map[string]int{}
			for i, k := range h.Keys() {
				ids[k.ID] = i
			}
			if ia, ok := ids["keys-a"]; !ok || ids["keys-b"] >= ia {
				t.Fatalf("keys in order: %v", ids)
			}
		}
		w = next()
		if err := w.DeleteKey(k.ID); err != nil {
			t.Fatal(err)
		}
		if _, ok := w.KeyByHash(k.Hash); ok {
			t.Fatal("writer still knows the revoked key")
		}
		waitKey(t, hs, k.ID, func(_ store.PushKey, ok bool) bool { return !ok })
		for _, h := range hs {
			if _, ok := h.KeyByHash(k.Hash); ok {
				t.Fatal("revoked key known by hash")
			}
		}
		if err := next().DeleteKey(k.ID); !errors.Is(err, store.ErrUnknownPushKey) {
			t.Fatalf("second revoke: %v", err)
		}
	})

	t.Run("ScopesApart", func(t *testing.T) {
		fcm := open(t, store.PushScopeFCM)
		add(t, pushKey("scope-s", t0))
		if err := fcm[0].AddKey(pushKey("scope-f", t0)); err != nil {
			t.Fatal(err)
		}
		waitKey(t, fcm, "scope-f", func(_ store.PushKey, ok bool) bool { return ok })
		for i := range hs {
			if _, ok := fcm[i].KeyByID("scope-s"); ok {
				t.Fatal("shared key in the FCM scope")
			}
			if _, ok := hs[i].KeyByID("scope-f"); ok {
				t.Fatal("FCM key in the shared scope")
			}
		}
		tok := hash("scope-token")
		if _, err := next().Claim(tok, "scope-s", t0); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := fcm[1%len(fcm)].ClaimOf(tok); ok || err != nil {
			t.Fatalf("a shared claim in the FCM scope: %v %v", ok, err)
		}
		if _, err := fcm[0].Claim(tok, "scope-f", t0); err != nil {
			t.Fatalf("FCM claim of a token claimed in the shared scope: %v", err)
		}
		day := t0.AddDate(0, 0, 14) // before the budget subtests' days: Pebble's counter only moves forward
		if _, ok, err := next().DrawBudget(1, day); !ok || err != nil {
			t.Fatalf("draw: %v %v", ok, err)
		}
		if _, ok, err := fcm[0].DrawBudget(1, day); !ok || err != nil {
			t.Fatalf("FCM draw after a shared one: %v %v", ok, err)
		}
		lim, err := next().RateLimiter("contract.scope", 1)
		if err != nil {
			t.Fatal(err)
		}
		flim, err := fcm[0].RateLimiter("contract.scope", 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []store.PushRateLimiter{lim, flim} {
			if ok, err := l.Take(hash("scope-rate"), t0); !ok || err != nil {
				t.Fatalf("take: %v %v", ok, err)
			}
		}
	})

	t.Run("RegistrationSlotPerMount", func(t *testing.T) {
		const ip = "203.0.113.7"
		reg := func(id, mount string) *store.PushKey {
			t.Helper()
			k := pushKey(id, t0)
			k.Source, k.RegisteredIP, k.Mount = store.PushSourceSelf, ip, mount
			old, err := next().RegisterKey(k)
			if err != nil {
				t.Fatalf("register %s: %v", id, err)
			}
			if got, ok := next().KeyByHash(k.Hash); !ok || !got.Enabled { // usable through another node at once
				t.Fatalf("registered key through another handle right after: %+v %v", got, ok)
			}
			waitKey(t, hs, id, func(got store.PushKey, ok bool) bool { return ok && got.Enabled })
			return old
		}
		if old := reg("slot-legacy", ""); old != nil { // as written before slots had a mount
			t.Fatalf("legacy registration superseded %+v", old)
		}
		if old := reg("slot-f1", "fcm"); old != nil {
			t.Fatalf("first FCM registration superseded %+v", old)
		}
		if old := reg("slot-a1", "apns"); old != nil {
			t.Fatalf("the APNs registration superseded %+v", old)
		}
		if got, _ := next().KeyByID("slot-a1"); got.Mount != "apns" || got.RegisteredIP != ip || got.Source != store.PushSourceSelf {
			t.Fatalf("registered key %+v", got)
		}
		if old := reg("slot-f2", "fcm"); old == nil || old.ID != "slot-f1" {
			t.Fatalf("FCM re-registration superseded %+v, want slot-f1", old)
		}
		waitKey(t, hs, "slot-f1", func(_ store.PushKey, ok bool) bool { return !ok })
		for _, id := range []string{"slot-legacy", "slot-f2", "slot-a1"} {
			waitKey(t, hs, id, func(_ store.PushKey, ok bool) bool { return ok })
		}
		if err := next().DeleteKey("slot-a1"); err != nil { // frees only its slot
			t.Fatal(err)
		}
		if old := reg("slot-a2", "apns"); old != nil {
			t.Fatalf("registration after revoke superseded %+v", old)
		}
		k := pushKey("slot-noip", t0)
		if _, err := next().RegisterKey(k); err == nil {
			t.Fatal("registration without an address bucket")
		}
	})

	t.Run("RacingRegistrationsLeaveOneKey", func(t *testing.T) {
		const bucket = "2001:db8:1:2::/64"
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Go(func() {
				k := pushKey(fmt.Sprint("race-", i), t0)
				k.Source, k.RegisteredIP, k.Mount = store.PushSourceSelf, bucket, "fcm"
				if _, err := next().RegisterKey(k); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		// The slot names the one survivor: the next registration
		// supersedes it, and then it alone is left.
		k := pushKey("race-after", t0)
		k.Source, k.RegisteredIP, k.Mount = store.PushSourceSelf, bucket, "fcm"
		old, err := next().RegisterKey(k)
		if err != nil || old == nil || !old.Enabled {
			t.Fatalf("registration after the race superseded %+v (%v), want the enabled survivor", old, err)
		}
		for _, h := range hs {
			if id := waitOne(t, h, func(k store.PushKey) bool { return k.RegisteredIP == bucket && k.Mount == "fcm" }); id != "race-after" {
				t.Fatalf("%s survives, want race-after", id)
			}
		}
	})

	t.Run("ClaimStateMachine", func(t *testing.T) {
		add(t, pushKey("sm-A", t0))
		add(t, pushKey("sm-B", t0))
		tok := hash("sm-device")
		claimOf := func() (store.PushClaim, bool) {
			t.Helper()
			c, ok, err := next().ClaimOf(tok)
			if err != nil {
				t.Fatal(err)
			}
			return c, ok
		}
		a1, err := next().Claim(tok, "sm-A", t0) // no owner: A takes it
		if err != nil {
			t.Fatal(err)
		}
		a2, err := next().Claim(tok, "sm-A", t0)
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := claimOf(); !ok || c.Owner != "sm-A" || c.InFlight != 2 || c.Confirmed || !c.ClaimedAt.Equal(t0) {
			t.Fatalf("claim %+v %v", c, ok)
		}
		// B: refused, A is active (however old the claim).
		if _, err := next().Claim(tok, "sm-B", t0.Add(2*store.ClaimHold)); !errors.Is(err, store.ErrTokenClaimed) {
			t.Fatalf("B on A's active claim: %v", err)
		}
		if err := next().Settle(a1, false); err != nil { // another send in flight: kept
			t.Fatal(err)
		}
		if c, ok := claimOf(); !ok || c.InFlight != 1 {
			t.Fatalf("after one failure: %+v %v", c, ok)
		}
		if err := next().Settle(a2, false); err != nil { // the last failure releases it
			t.Fatal(err)
		}
		if _, ok := claimOf(); ok {
			t.Fatal("unconfirmed claim not released")
		}
		if err := next().Settle(a2, true); err != nil { // twice: nothing
			t.Fatal(err)
		}
		if err := next().Settle(store.ClaimTicket{}, true); err != nil {
			t.Fatal(err)
		}
		if _, ok := claimOf(); ok {
			t.Fatal("a settled ticket confirmed a claim")
		}
		// B takes the free token; a success confirms it for good.
		b1, err := next().Claim(tok, "sm-B", t0)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := next().Claim(tok, "sm-B", t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := next().Settle(b1, true); err != nil {
			t.Fatal(err)
		}
		if err := next().Settle(b2, false); err != nil {
			t.Fatal(err)
		}
		b3, err := next().Claim(tok, "sm-B", t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := next().Settle(b3, false); err != nil {
			t.Fatal(err)
		}
		if c, ok := claimOf(); !ok || c.Owner != "sm-B" || !c.Confirmed || c.InFlight != 0 || !c.ClaimedAt.Equal(t0) {
			t.Fatalf("confirmed claim %+v %v", c, ok)
		}
		// B revoked: A is refused until ClaimHold after the claim, then
		// takes over (unconfirmed, one in flight).
		if err := next().DeleteKey("sm-B"); err != nil {
			t.Fatal(err)
		}
		waitKey(t, hs, "sm-B", func(_ store.PushKey, ok bool) bool { return !ok })
		if _, err := next().Claim(tok, "sm-A", t0.Add(store.ClaimHold-time.Millisecond)); !errors.Is(err, store.ErrTokenClaimed) {
			t.Fatalf("takeover inside the hold: %v", err)
		}
		a3, err := next().Claim(tok, "sm-A", t0.Add(store.ClaimHold))
		if err != nil {
			t.Fatalf("takeover after the hold: %v", err)
		}
		if c, _ := claimOf(); c.Owner != "sm-A" || c.Confirmed || c.InFlight != 1 {
			t.Fatalf("taken over %+v", c)
		}
		if err := next().Settle(a3, true); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ClaimTakeoverOfInactiveOwner", func(t *testing.T) {
		exp := pushKey("ti-E", t0)
		exp.ExpiresAt = t0.Add(time.Minute)
		for _, k := range []store.PushKey{pushKey("ti-D", t0), exp, pushKey("ti-N", t0)} {
			add(t, k)
		}
		later := t0.Add(2 * time.Minute)
		tokD := hash("ti-dev-d")
		d1, err := next().Claim(tokD, "ti-D", t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := next().SetKeyEnabled("ti-D", false); err != nil {
			t.Fatal(err)
		}
		waitKey(t, hs, "ti-D", func(k store.PushKey, ok bool) bool { return ok && !k.Enabled })
		n1, err := next().Claim(tokD, "ti-N", later)
		if err != nil {
			t.Fatalf("takeover from a disabled owner: %v", err)
		}
		if err := next().Settle(d1, false); err != nil { // the old owner's failure
			t.Fatal(err)
		}
		if c, ok, _ := next().ClaimOf(tokD); !ok || c.Owner != "ti-N" || c.InFlight != 1 {
			t.Fatalf("the old owner's settle touched the new claim: %+v %v", c, ok)
		}
		if err := next().Settle(n1, true); err != nil {
			t.Fatal(err)
		}
		tokE := hash("ti-dev-e")
		e1, err := next().Claim(tokE, "ti-E", t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := next().Settle(e1, true); err != nil {
			t.Fatal(err)
		}
		if _, err := next().Claim(tokE, "ti-N", t0.Add(59*time.Second)); !errors.Is(err, store.ErrTokenClaimed) {
			t.Fatalf("young claim of a live key: %v", err)
		}
		if _, err := next().Claim(tokE, "ti-N", later); err != nil {
			t.Fatalf("takeover from an expired owner: %v", err)
		}
	})

	t.Run("ConcurrentSettlesKeepConfirmedClaim", func(t *testing.T) {
		add(t, pushKey("cs-A", t0))
		for round := range 4 {
			tok := hash(fmt.Sprint("cs-tok", round))
			var wg sync.WaitGroup
			for i := range 6 {
				wg.Go(func() {
					h := next()
					tk, err := h.Claim(tok, "cs-A", t0)
					if err != nil {
						t.Error(err)
						return
					}
					if err := next().Settle(tk, i == 3); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			c, ok, err := next().ClaimOf(tok)
			if err != nil || !ok || !c.Confirmed || c.InFlight != 0 {
				t.Fatalf("round %d: %+v %v %v", round, c, ok, err)
			}
		}
	})

	t.Run("BudgetDrawRefundAndDays", func(t *testing.T) {
		day1 := time.Date(2026, 4, 1, 23, 0, 0, 0, time.UTC)
		for i := range 3 {
			if _, ok, err := next().DrawBudget(5, day1); !ok || err != nil {
				t.Fatalf("draw %d: %v %v", i, ok, err)
			}
		}
		d, ok, err := next().DrawBudget(5, day1)
		if !ok || err != nil {
			t.Fatalf("draw: %v %v", ok, err)
		}
		next().RefundBudget(d)
		next().RefundBudget(store.BudgetDraw{}) // nothing to refund
		if n, err := next().BudgetUsed(day1); n != 3 || err != nil {
			t.Fatalf("used %d (%v), want 3", n, err)
		}
		for i := range 2 {
			if _, ok, err := next().DrawBudget(5, day1); !ok || err != nil {
				t.Fatalf("draw %d: %v %v", 4+i, ok, err)
			}
		}
		if _, ok, err := next().DrawBudget(5, day1); ok || err != nil { // one past the limit
			t.Fatalf("sixth draw of five: %v %v", ok, err)
		}
		if n, _ := next().BudgetUsed(day1); n != 5 {
			t.Fatalf("used %d after a refused draw, want 5", n)
		}
		if err := next().FlushBudget(); err != nil {
			t.Fatal(err)
		}
		if n, _ := next().BudgetUsed(day1); n != 5 {
			t.Fatalf("used %d after a flush, want 5", n)
		}
		day2 := day1.Add(2 * time.Hour)
		if n, err := next().BudgetUsed(day2); n != 0 || err != nil {
			t.Fatalf("new day used %d (%v)", n, err)
		}
		next().RefundBudget(d) // yesterday's draw does not reopen today
		if n, _ := next().BudgetUsed(day2); n != 0 {
			t.Fatalf("refund crossed days: %d", n)
		}
		if _, ok, _ := next().DrawBudget(0, day2); ok {
			t.Fatal("budget 0 allowed a send")
		}
	})

	t.Run("BudgetConcurrentDrawsAreExact", func(t *testing.T) {
		day := time.Date(2026, 4, 3, 9, 0, 0, 0, time.UTC)
		const limit = 40
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 10 {
					_, ok, err := next().DrawBudget(limit, day)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := allowed.Load(); n != limit {
			t.Fatalf("%d of 80 draws allowed, want exactly %d", n, limit)
		}
		if n, err := next().BudgetUsed(day); n != limit || err != nil {
			t.Fatalf("used %d (%v), want %d", n, err, limit)
		}
	})

	t.Run("RateLimits", func(t *testing.T) {
		if _, err := next().RateLimiter("contract.zero", 0); err == nil {
			t.Fatal("a limit of 0 a minute accepted")
		}
		lims := make([]store.PushRateLimiter, len(hs))
		for i, h := range hs {
			l, err := h.RateLimiter("contract.send", 5)
			if err != nil {
				t.Fatal(err)
			}
			lims[i] = l
		}
		other, err := next().RateLimiter("contract.other", 5)
		if err != nil {
			t.Fatal(err)
		}
		key := hash("rate-key")
		take := func(i int, key store.Hash, now time.Time) bool {
			t.Helper()
			ok, err := lims[i%len(lims)].Take(key, now)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		for i := range 5 { // the limit, through every handle in turn
			if !take(i, key, t0) {
				t.Fatalf("take %d of 5 refused", i+1)
			}
		}
		if take(5, key, t0) { // one past it
			t.Fatal("sixth take of five allowed")
		}
		if !take(0, hash("rate-other-key"), t0) {
			t.Fatal("another key limited")
		}
		if ok, err := other.Take(key, t0); !ok || err != nil {
			t.Fatalf("another family limited: %v %v", ok, err)
		}
		// One token comes back every 12 s; a full minute refills all.
		if take(1, key, t0.Add(11*time.Second)) {
			t.Fatal("a token back before its interval")
		}
		if !take(2, key, t0.Add(12*time.Second)) || take(0, key, t0.Add(12*time.Second)) {
			t.Fatal("want exactly one token back after 12 s")
		}
		later := t0.Add(2 * time.Minute)
		for i := range 5 {
			if !take(i, key, later) {
				t.Fatalf("take %d after a refill refused", i+1)
			}
		}
		lims[0].Sweep(later.Add(time.Hour))
	})

	t.Run("RateConcurrentTakesAreExact", func(t *testing.T) {
		lims := make([]store.PushRateLimiter, len(hs))
		for i, h := range hs {
			l, err := h.RateLimiter("contract.conc", 10)
			if err != nil {
				t.Fatal(err)
			}
			lims[i] = l
		}
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				for range 5 {
					ok, err := lims[g%len(lims)].Take(hash("conc-key"), t0)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := allowed.Load(); n != 10 {
			t.Fatalf("%d of 30 concurrent takes allowed, want exactly 10", n)
		}
	})
}

func pushKey(id string, now time.Time) store.PushKey {
	return store.PushKey{
		ID: id, Hash: sha256.Sum256([]byte("push-key-" + id)), Label: "label " + id, Enabled: true,
		CreatedAt: now, Source: store.PushSourceAdmin,
	}
}

// waitKey waits until every handle's view of key id satisfies ok, for at
// most PushSync.
func waitKey(t *testing.T, hs []store.PushGatewayStore, id string, ok func(store.PushKey, bool) bool) {
	t.Helper()
	deadline := time.Now().Add(PushSync)
	for i := 0; i < len(hs); {
		if ok(hs[i].KeyByID(id)) {
			i++
			continue
		}
		if time.Now().After(deadline) {
			k, found := hs[i].KeyByID(id)
			t.Fatalf("handle %d: key %s is %+v (%v) after %v", i, id, k, found, PushSync)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitOne waits until h lists exactly one key that match selects, and
// returns its id.
func waitOne(t *testing.T, h store.PushGatewayStore, match func(store.PushKey) bool) string {
	t.Helper()
	deadline := time.Now().Add(PushSync)
	for {
		var ids []string
		for _, k := range h.Keys() {
			if match(k) {
				ids = append(ids, k.ID)
			}
		}
		if len(ids) == 1 {
			return ids[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys %v survive, want exactly one", ids)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
