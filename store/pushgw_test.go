package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func openGateway(t *testing.T, db *DB, scope PushScope) *PushGateway {
	t.Helper()
	g, err := NewPushGateway(db, scope)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func pushKey(id string, now time.Time) PushKey {
	return PushKey{ID: id, Hash: h("key-" + id), Label: "label " + id, Enabled: true, CreatedAt: now, Source: PushSourceAdmin}
}

func TestPushKeysSurviveReopenAndScopesAreApart(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	shared := openGateway(t, db, PushScopeShared)
	fcm := openGateway(t, db, PushScopeFCM)

	a := pushKey("a", now)
	a.ExpiresAt = now.Add(time.Hour)
	if err := shared.AddKey(a); err != nil {
		t.Fatal(err)
	}
	if err := shared.AddKey(a); !errors.Is(err, ErrPushKeyExists) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := fcm.AddKey(pushKey("f", now)); err != nil {
		t.Fatal(err)
	}
	self := pushKey("s", now.Add(time.Second))
	self.Source, self.RegisteredIP = PushSourceSelf, "203.0.113.7"
	if old, err := shared.RegisterKey(self); err != nil || old != nil {
		t.Fatalf("register: %v %v", old, err)
	}
	if err := shared.SetKeyEnabled("a", false); err != nil {
		t.Fatal(err)
	}
	if err := shared.SetKeyEnabled("zzz", false); !errors.Is(err, ErrUnknownPushKey) {
		t.Fatalf("unknown id: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openTemp(t, dir)
	defer db.Close()
	shared = openGateway(t, db, PushScopeShared)
	fcm = openGateway(t, db, PushScopeFCM)
	apns := openGateway(t, db, PushScopeAPNs)
	keys := shared.Keys()
	if len(keys) != 2 || keys[0].ID != "a" || keys[1].ID != "s" {
		t.Fatalf("shared keys after reopen: %+v", keys)
	}
	got, ok := shared.KeyByHash(h("key-a"))
	if !ok || got.Enabled || !got.ExpiresAt.Equal(a.ExpiresAt) || got.Label != "label a" || got.Source != PushSourceAdmin {
		t.Fatalf("key a after reopen: %+v %v", got, ok)
	}
	if got, ok := shared.KeyByID("s"); !ok || got.RegisteredIP != "203.0.113.7" || got.Source != PushSourceSelf {
		t.Fatalf("key s after reopen: %+v", got)
	}
	if _, ok := fcm.KeyByID("a"); ok {
		t.Fatal("the FCM store sees a shared key")
	}
	if len(fcm.Keys()) != 1 || len(apns.Keys()) != 0 {
		t.Fatalf("fcm %d keys, apns %d", len(fcm.Keys()), len(apns.Keys()))
	}

	// Registering again from the bucket supersedes its key, also after a
	// restart (the bucket index is durable).
	next := pushKey("s2", now.Add(2*time.Second))
	next.Source, next.RegisteredIP = PushSourceSelf, "203.0.113.7"
	old, err := shared.RegisterKey(next)
	if err != nil || old == nil || old.ID != "s" {
		t.Fatalf("re-register: %+v %v", old, err)
	}
	if _, ok := shared.KeyByHash(h("key-s")); ok {
		t.Fatal("superseded key still known")
	}
	if err := shared.DeleteKey("s2"); err != nil {
		t.Fatal(err)
	}
	third := pushKey("s3", now.Add(3*time.Second))
	third.Source, third.RegisteredIP = PushSourceSelf, "203.0.113.7"
	if old, err := shared.RegisterKey(third); err != nil || old != nil {
		t.Fatalf("register after revoke: %+v %v", old, err)
	}
}

// In the shared store the one-key-per-address slot is per mount: a server
// that registers on the FCM mount and then on the APNs mount from one
// address keeps both keys; registering again on one mount supersedes only
// that mount's key, also after a restart. A key registered before slots
// had a mount keeps the legacy slot: no new registration revokes it.
func TestRegistrationSlotPerMount(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	g := openGateway(t, db, PushScopeShared)
	now := time.Now()
	reg := func(g *PushGateway, id, mount string) *PushKey {
		t.Helper()
		k := pushKey(id, now)
		k.Source, k.RegisteredIP, k.Mount = PushSourceSelf, "203.0.113.7", mount
		old, err := g.RegisterKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return old
	}
	legacy := reg(g, "legacy", "") // as written before slots had a mount
	if legacy != nil {
		t.Fatal(legacy)
	}
	if old := reg(g, "f1", "fcm"); old != nil {
		t.Fatalf("first FCM registration superseded %+v", old)
	}
	if old := reg(g, "a1", "apns"); old != nil {
		t.Fatalf("the APNs registration superseded the FCM key %+v", old)
	}
	for _, id := range []string{"legacy", "f1", "a1"} {
		if _, ok := g.KeyByHash(h("key-" + id)); !ok {
			t.Fatalf("key %s lost", id)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTemp(t, dir)
	defer db.Close()
	g = openGateway(t, db, PushScopeShared)
	if got, ok := g.KeyByID("a1"); !ok || got.Mount != "apns" || got.RegisteredIP != "203.0.113.7" {
		t.Fatalf("a1 after reopen: %+v %v", got, ok)
	}
	if old := reg(g, "f2", "fcm"); old == nil || old.ID != "f1" {
		t.Fatalf("FCM re-registration superseded %+v, want f1", old)
	}
	if _, ok := g.KeyByHash(h("key-f1")); ok {
		t.Fatal("superseded FCM key still known")
	}
	for _, id := range []string{"legacy", "f2", "a1"} {
		if _, ok := g.KeyByHash(h("key-" + id)); !ok {
			t.Fatalf("key %s lost by the FCM re-registration", id)
		}
	}
	// Revoking the APNs key frees only its slot.
	if err := g.DeleteKey("a1"); err != nil {
		t.Fatal(err)
	}
	if old := reg(g, "a2", "apns"); old != nil {
		t.Fatalf("registration after revoke superseded %+v", old)
	}
	if n := len(g.Keys()); n != 3 {
		t.Fatalf("%d keys, want legacy, f2 and a2", n)
	}
}

func TestRacingRegistrationsLeaveOneKey(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	g := openGateway(t, db, PushScopeShared)
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := pushKey(fmt.Sprint("r", i), now)
			k.Source, k.RegisteredIP = PushSourceSelf, "2001:db8:1:2::/64"
			if _, err := g.RegisterKey(k); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := len(g.Keys()); n != 1 {
		t.Fatalf("%d keys survive, want 1", n)
	}
	// And the durable state agrees with memory.
	again := openGateway(t, db, PushScopeShared)
	if keys := again.Keys(); len(keys) != 1 || keys[0].ID != g.Keys()[0].ID {
		t.Fatalf("reloaded %+v", keys)
	}
}

func TestClaimStateMachine(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	g := openGateway(t, db, PushScopeShared)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, id := range []string{"A", "B"} {
		if err := g.AddKey(pushKey(id, t0)); err != nil {
			t.Fatal(err)
		}
	}
	tok := h("device")

	// No owner: A takes it.
	a1, err := g.Claim(tok, "A", t0)
	if err != nil {
		t.Fatal(err)
	}
	// A again: in flight 2, nothing written.
	a2, err := g.Claim(tok, "A", t0)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok, _ := g.ClaimOf(tok); !ok || c.Owner != "A" || c.InFlight != 2 || c.Confirmed {
		t.Fatalf("claim %+v", c)
	}
	// B: refused (young, and A active).
	if _, err := g.Claim(tok, "B", t0.Add(2*ClaimHold)); !errors.Is(err, ErrTokenClaimed) {
		t.Fatalf("B on A's active claim: %v", err)
	}
	// One failure while another send is in flight keeps the claim.
	if err := g.Settle(a1, false); err != nil {
		t.Fatal(err)
	}
	if c, ok, _ := g.ClaimOf(tok); !ok || c.InFlight != 1 {
		t.Fatalf("after one failure: %+v %v", c, ok)
	}
	// The last failure of a never-confirmed claim releases it.
	if err := g.Settle(a2, false); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := g.ClaimOf(tok); ok {
		t.Fatal("unconfirmed claim not released")
	}
	// Settling twice, or a zero ticket, changes nothing.
	if err := g.Settle(a2, true); err != nil {
		t.Fatal(err)
	}
	if err := g.Settle(ClaimTicket{}, true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := g.ClaimOf(tok); ok {
		t.Fatal("a settled ticket confirmed a claim")
	}

	// B takes the free token; a success confirms it, and a later failure
	// no longer releases it.
	b1, err := g.Claim(tok, "B", t0)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := g.Claim(tok, "B", t0)
	if err := g.Settle(b1, true); err != nil {
		t.Fatal(err)
	}
	if err := g.Settle(b2, false); err != nil {
		t.Fatal(err)
	}
	b3, _ := g.Claim(tok, "B", t0)
	if err := g.Settle(b3, false); err != nil {
		t.Fatal(err)
	}
	c, ok, _ := g.ClaimOf(tok)
	if !ok || c.Owner != "B" || !c.Confirmed || c.InFlight != 0 {
		t.Fatalf("confirmed claim %+v %v", c, ok)
	}

	// Survives a restart.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTemp(t, dir)
	defer db.Close()
	g = openGateway(t, db, PushScopeShared)
	if c, ok, _ := g.ClaimOf(tok); !ok || c.Owner != "B" || !c.Confirmed || !c.ClaimedAt.Equal(t0) {
		t.Fatalf("claim after reopen %+v %v", c, ok)
	}

	// B revoked: A is refused for 60 s after the claim, then takes over.
	if err := g.DeleteKey("B"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(tok, "A", t0.Add(ClaimHold-time.Millisecond)); !errors.Is(err, ErrTokenClaimed) {
		t.Fatalf("takeover inside the hold: %v", err)
	}
	a3, err := g.Claim(tok, "A", t0.Add(ClaimHold))
	if err != nil {
		t.Fatalf("takeover after the hold: %v", err)
	}
	if c, _, _ := g.ClaimOf(tok); c.Owner != "A" || c.Confirmed || c.InFlight != 1 {
		t.Fatalf("taken over %+v", c)
	}
	if err := g.Settle(a3, true); err != nil {
		t.Fatal(err)
	}
}

// A claim whose owner is disabled or expired is taken over after the
// hold; a send still in flight under the old owner then settles to
// nothing.
func TestClaimTakeoverOfInactiveOwner(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	g := openGateway(t, db, PushScopeShared)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	exp := pushKey("E", t0)
	exp.ExpiresAt = t0.Add(time.Minute)
	for _, k := range []PushKey{pushKey("D", t0), exp, pushKey("N", t0)} {
		if err := g.AddKey(k); err != nil {
			t.Fatal(err)
		}
	}
	later := t0.Add(2 * time.Minute)

	// Disabled owner, with a send in flight.
	tokD := h("dev-d")
	d1, err := g.Claim(tokD, "D", t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetKeyEnabled("D", false); err != nil {
		t.Fatal(err)
	}
	n1, err := g.Claim(tokD, "N", later)
	if err != nil {
		t.Fatalf("takeover from disabled: %v", err)
	}
	if err := g.Settle(d1, false); err != nil { // the old owner's failure
		t.Fatal(err)
	}
	if c, ok, _ := g.ClaimOf(tokD); !ok || c.Owner != "N" || c.InFlight != 1 {
		t.Fatalf("old owner's settle touched the new claim: %+v %v", c, ok)
	}
	if err := g.Settle(n1, true); err != nil {
		t.Fatal(err)
	}

	// Expired owner, confirmed claim: still taken over after the hold.
	tokE := h("dev-e")
	e1, _ := g.Claim(tokE, "E", t0)
	if err := g.Settle(e1, true); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(tokE, "N", t0.Add(59*time.Second)); !errors.Is(err, ErrTokenClaimed) {
		t.Fatalf("young claim of a live key: %v", err)
	}
	if _, err := g.Claim(tokE, "N", later); err != nil {
		t.Fatalf("takeover from expired: %v", err)
	}
}

// Concurrent sends under one fresh claim: whatever the interleaving, a
// failure never releases a claim that a success confirmed.
func TestConcurrentSettlesKeepConfirmedClaim(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	g := openGateway(t, db, PushScopeShared)
	now := time.Now()
	if err := g.AddKey(pushKey("A", now)); err != nil {
		t.Fatal(err)
	}
	for round := range 30 {
		tok := h(fmt.Sprint("tok", round))
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk, err := g.Claim(tok, "A", now)
				if err != nil {
					t.Error(err)
					return
				}
				if err := g.Settle(tk, i == 3); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		c, ok, err := g.ClaimOf(tok)
		if err != nil || !ok || !c.Confirmed || c.InFlight != 0 {
			t.Fatalf("round %d: %+v %v %v", round, c, ok, err)
		}
	}
}

func TestBudgetDrawRefundFlushAndDays(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	g := openGateway(t, db, PushScopeShared)
	day1 := time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC)
	for i := range 3 {
		if _, ok, err := g.DrawBudget(5, day1); !ok || err != nil {
			t.Fatalf("draw %d: %v %v", i, ok, err)
		}
	}
	d, _, _ := g.DrawBudget(5, day1)
	g.RefundBudget(d)
	if n, _ := g.BudgetUsed(day1); n != 3 {
		t.Fatalf("used %d, want 3", n)
	}
	if err := g.FlushBudget(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// A clean restart keeps the exact count.
	db = openTemp(t, dir)
	g = openGateway(t, db, PushScopeShared)
	if n, _ := g.BudgetUsed(day1); n != 3 {
		t.Fatalf("used after clean reopen %d, want 3", n)
	}
	for i := range 2 {
		if _, ok, _ := g.DrawBudget(5, day1); !ok {
			t.Fatalf("draw %d refused", i)
		}
	}
	if _, ok, _ := g.DrawBudget(5, day1); ok {
		t.Fatal("sixth draw of five allowed")
	}
	// The next UTC day starts from zero.
	day2 := day1.Add(2 * time.Hour)
	if n, _ := g.BudgetUsed(day2); n != 0 {
		t.Fatalf("new day used %d", n)
	}
	// A refund of yesterday's draw does not reopen today.
	g.RefundBudget(d)
	if n, _ := g.BudgetUsed(day2); n != 0 {
		t.Fatalf("refund crossed days: %d", n)
	}
	// Budget 0 is closed.
	if _, ok, _ := g.DrawBudget(0, day2); ok {
		t.Fatal("budget 0 allowed a send")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// After a crash (no flush), the reopened count is never below what was
// drawn: the gateway may refuse early, never late.
func TestBudgetAfterCrashIsConservative(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	g := openGateway(t, db, PushScopeShared)
	now := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	const limit = 1000
	for range 70 {
		if _, ok, err := g.DrawBudget(limit, now); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if err := db.Close(); err != nil { // no FlushBudget: as after SIGKILL
		t.Fatal(err)
	}
	db = openTemp(t, dir)
	defer db.Close()
	g = openGateway(t, db, PushScopeShared)
	n, err := g.BudgetUsed(now)
	if err != nil || n < 70 || n > 70+budgetBlock {
		t.Fatalf("used after crash %d (%v), want 70..%d", n, err, 70+budgetBlock)
	}
}

func TestBudgetConcurrentDrawsAreExact(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	g := openGateway(t, db, PushScopeShared)
	now := time.Now()
	const limit = 300
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				_, ok, err := g.DrawBudget(limit, now)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if allowed != limit {
		t.Fatalf("%d draws allowed, want %d", allowed, limit)
	}
}

// A gateway flushes its budget when it starts to stop, while sends may
// still be running: draws and refunds after the flush must leave the exact
// count on disk, not a fresh reservation that no later flush gives back.
func TestBudgetDrawsAfterFlushAreExact(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	g := openGateway(t, db, PushScopeShared)
	now := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var last BudgetDraw
	for i := range 5 {
		if i == 3 { // the drain starts; two sends are still finishing
			if err := g.FlushBudget(); err != nil {
				t.Fatal(err)
			}
		}
		var ok bool
		var err error
		if last, ok, err = g.DrawBudget(1000, now); !ok || err != nil {
			t.Fatalf("draw %d: %v %v", i, ok, err)
		}
	}
	g.RefundBudget(last)
	if err := db.Close(); err != nil { // no second flush: the process ends
		t.Fatal(err)
	}
	db = openTemp(t, dir)
	defer db.Close()
	g = openGateway(t, db, PushScopeShared)
	if n, err := g.BudgetUsed(now); err != nil || n != 4 {
		t.Fatalf("used after the stop %d (%v), want exactly 4", n, err)
	}
}
