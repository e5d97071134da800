package pushgw_test

import (
	"crypto/sha256"
	"fmt"
	"sync"
	"testing"
	"time"

	"edgerelay/push/apns"
	"edgerelay/push/pushtest"
	"edgerelay/store"
)

const claimedBody = `{"error":"token is already bound to a different active api key","requestId":"{rid}"}`

func claimOf(t *testing.T, g *gateway, token string) (store.PushClaim, bool) {
	t.Helper()
	c, ok, err := g.store.ClaimOf(sha256.Sum256([]byte(token)))
	if err != nil {
		t.Fatal(err)
	}
	return c, ok
}

func budgetUsed(t *testing.T, g *gateway) int64 {
	t.Helper()
	n, err := g.store.BudgetUsed(g.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The first key to deliver to a token owns it; another key is refused at
// the claim, before the budget, so the refusal spends none.
func TestTokenPinningSpendsNoBudget(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, metered: true, budget: 10})
	aID, a := g.newKey("a")
	_, b := g.newKey("b")
	expect(t, "a claims", g.send(a, `{"token":"pinned"}`), 200, `{"ok":true}`)
	for range 3 {
		expect(t, "b refused", g.send(b, `{"token":" pinned "}`), 403, claimedBody)
	}
	if n := budgetUsed(t, g); n != 1 {
		t.Errorf("budget used %d, want 1: refused claims spent it", n)
	}
	if n := len(f.Requests()); n != 1 {
		t.Errorf("APNs saw %d pushes, want 1", n)
	}
	c, ok := claimOf(t, g, "pinned")
	if !ok || c.Owner != aID || !c.Confirmed || c.InFlight != 0 {
		t.Errorf("claim %+v %v", c, ok)
	}
	if d := g.logs.events(t, "send.denied"); len(d) != 3 || d[0]["reason"] != "token_claimed" {
		t.Errorf("send.denied lines %v", d)
	}
	// The owner keeps sending; a stale answer does not release a confirmed claim.
	f.AnswerOnce("pinned", 410, "Unregistered")
	expect(t, "owner stale", g.send(a, `{"token":"pinned"}`), 410, `{"stale":true,"requestId":"{rid}"}`)
	expect(t, "b still refused", g.send(b, `{"token":"pinned"}`), 403, claimedBody)
}

// A budget refusal settles the fresh claim as undelivered first, which
// releases it: the token is free for anyone once the budget allows.
func TestBudgetRefusalReleasesFreshClaim(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, metered: true, budget: 1})
	_, a := g.newKey("a")
	_, b := g.newKey("b")
	expect(t, "first", g.send(a, `{"token":"t1"}`), 200, `{"ok":true}`)
	r := g.send(a, `{"token":"t2"}`)
	// 12:00 UTC: twelve hours to midnight.
	expect(t, "exhausted", r, 429, `{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":1,"retryAfterSeconds":43200}`)
	if ra := r.header.Get("Retry-After"); ra != "43200" {
		t.Errorf("Retry-After %q", ra)
	}
	if _, ok := claimOf(t, g, "t2"); ok {
		t.Fatal("a budget refusal kept the fresh claim")
	}
	// Another key reaches the budget check, not the claim refusal.
	expect(t, "b exhausted", g.send(b, `{"token":"t2"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":1,"retryAfterSeconds":43200}`)
	// A confirmed claim survives a budget refusal.
	expect(t, "a on t1", g.send(a, `{"token":"t1"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":1,"retryAfterSeconds":43200}`)
	if c, ok := claimOf(t, g, "t1"); !ok || !c.Confirmed {
		t.Errorf("confirmed claim after a budget refusal: %+v %v", c, ok)
	}
	if len(g.logs.events(t, "budget.exhausted")) != 3 {
		t.Error("no budget.exhausted lines")
	}
	// A second before midnight, Retry-After is 1; at midnight the budget is new.
	g.clock.Set(time.Date(2026, 3, 1, 23, 59, 59, 500e6, time.UTC))
	expect(t, "last second", g.send(b, `{"token":"t3"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":1,"retryAfterSeconds":1}`)
	g.clock.Set(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC))
	expect(t, "new day", g.send(b, `{"token":"t2"}`), 200, `{"ok":true}`)
	if n := len(f.Requests()); n != 2 {
		t.Errorf("APNs saw %d pushes, want 2", n)
	}
}

func TestBudgetZeroClosesGateway(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, metered: true, budget: 0})
	_, a := g.newKey("a")
	expect(t, "closed", g.send(a, `{"token":"t"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":0,"retryAfterSeconds":43200}`)
	// Validation still comes first.
	expect(t, "bad body", g.send(a, `{"token":1}`), 400, errBody("invalid token"))
	if len(f.Requests()) != 0 {
		t.Error("a closed gateway delivered")
	}
}

// A draw is refunded only when the provider was provably never contacted.
func TestBudgetRefunds(t *testing.T) {
	f := newAPNsFake(t)
	dataDir := t.TempDir()
	g := startGateway(t, gwOpts{apns: f.client, metered: true, budget: 2, dataDir: dataDir})
	_, a := g.newKey("a")

	// A second mount on the same store whose APNs cannot be reached.
	p8, _ := pushtest.NewAPNsKey(t)
	dead, err := apns.New(apns.Config{KeyFile: pushtest.WriteFile(t, "k.p8", p8), KeyID: keyID, TeamID: teamID,
		BaseURL: "https://127.0.0.1:1", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	unreachable := startGateway(t, gwOpts{apns: dead, metered: true, budget: 2, db: g.db, store: g.store, clock: g.clock})
	for i := range 3 {
		expect(t, fmt.Sprint("unreachable ", i), unreachable.send(a, `{"token":"r1"}`), 502, errBody("push delivery failed"))
	}
	if n := budgetUsed(t, g); n != 0 {
		t.Fatalf("budget used %d after sends that never left, want 0", n)
	}
	if ev := unreachable.logs.events(t, "send.error"); len(ev) != 3 || ev[0]["refunded"] != true {
		t.Errorf("send.error lines %v", ev)
	}
	// The fresh claim was released each time (never confirmed).
	if _, ok := claimOf(t, g, "r1"); ok {
		t.Error("claim kept after undelivered sends")
	}

	// A provider that answered (500) was contacted: no refund.
	f.AnswerOnce("r2", 500, "InternalServerError")
	expect(t, "provider 500", g.send(a, `{"token":"r2"}`), 502, errBody("push delivery failed"))
	if n := budgetUsed(t, g); n != 1 {
		t.Fatalf("budget used %d after a contacted failure, want 1", n)
	}
	expect(t, "last", g.send(a, `{"token":"r2"}`), 200, `{"ok":true}`)
	expect(t, "over", g.send(a, `{"token":"r2"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":2,"retryAfterSeconds":43200}`)
}

// The 60 s rule and takeover of a revoked, disabled or expired key's claim.
func TestClaimTakeover(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100})
	aID, a := g.newKey("a")
	bID, b := g.newKey("b")
	expect(t, "a claims", g.send(a, `{"token":"dev"}`), 200, `{"ok":true}`)
	if err := g.keys.Revoke(aID); err != nil {
		t.Fatal(err)
	}
	expect(t, "revoked owner", g.send(a, `{"token":"dev"}`), 401, errBody("invalid api key"))
	g.clock.Advance(59 * time.Second)
	expect(t, "b inside 60 s", g.send(b, `{"token":"dev"}`), 403, claimedBody)
	g.clock.Advance(time.Second)
	expect(t, "b at 60 s", g.send(b, `{"token":"dev"}`), 200, `{"ok":true}`)
	if c, ok := claimOf(t, g, "dev"); !ok || c.Owner != bID || !c.Confirmed {
		t.Fatalf("claim after takeover %+v", c)
	}

	// Disabled owner: refused while young, taken after.
	cID, c := g.newKey("c")
	if err := g.keys.Disable(bID); err != nil {
		t.Fatal(err)
	}
	expect(t, "c vs disabled b, young", g.send(c, `{"token":"dev"}`), 403, claimedBody)
	g.clock.Advance(time.Minute)
	expect(t, "c vs disabled b", g.send(c, `{"token":"dev"}`), 200, `{"ok":true}`)
	// Re-enabling b does not win the token back while c is active.
	if err := g.keys.Enable(bID); err != nil {
		t.Fatal(err)
	}
	g.clock.Advance(time.Hour)
	expect(t, "b vs active c", g.send(b, `{"token":"dev"}`), 403, claimedBody)

	// Expired owner.
	nk, err := g.keys.Create("expiring", g.clock.Now().Add(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "e claims", g.send(nk.Key, `{"token":"dev2"}`), 200, `{"ok":true}`)
	expect(t, "c vs live e", g.send(c, `{"token":"dev2"}`), 403, claimedBody)
	g.clock.Advance(2 * time.Minute)
	expect(t, "c vs expired e", g.send(c, `{"token":"dev2"}`), 200, `{"ok":true}`)
	if cl, _ := claimOf(t, g, "dev2"); cl.Owner != cID {
		t.Errorf("owner %s, want %s", cl.Owner, cID)
	}
}

// Concurrent sends under one fresh claim, ordered with a gated APNs: a
// failed send never releases a claim that a concurrent send still holds
// or that a successful one confirmed.
func TestConcurrentSettles(t *testing.T) {
	gate := newGatedAPNs(t)
	g := startGateway(t, gwOpts{apns: gate.client(t), rate: 100})
	aID, a := g.newKey("a")

	start := func(token string) <-chan answer {
		ch := make(chan answer, 1)
		go func() { ch <- g.send(a, `{"token":"`+token+`"}`) }()
		return ch
	}

	// Failure while a success is in flight, then the success.
	s1 := start("x")
	gate.waitHit(t)
	s2 := start("x")
	gate.waitHit(t)
	if c, ok := claimOf(t, g, "x"); !ok || c.InFlight != 2 {
		t.Fatalf("two in flight: %+v %v", c, ok)
	}
	gate.release("x", 500)
	expect(t, "first fails", <-s1, 502, errBody("push delivery failed"))
	if c, ok := claimOf(t, g, "x"); !ok || c.Owner != aID || c.InFlight != 1 {
		t.Fatalf("a failure released a claim still in flight: %+v %v", c, ok)
	}
	gate.release("x", 200)
	expect(t, "second delivers", <-s2, 200, `{"ok":true}`)
	if c, ok := claimOf(t, g, "x"); !ok || !c.Confirmed {
		t.Fatalf("not confirmed: %+v %v", c, ok)
	}

	// Success first, then the failure of a send that started before it.
	s1 = start("y")
	gate.waitHit(t)
	s2 = start("y")
	gate.waitHit(t)
	gate.release("y", 200)
	expect(t, "first delivers", <-s1, 200, `{"ok":true}`)
	gate.release("y", 500)
	expect(t, "second fails", <-s2, 502, errBody("push delivery failed"))
	if c, ok := claimOf(t, g, "y"); !ok || !c.Confirmed || c.InFlight != 0 {
		t.Fatalf("a failure released a confirmed claim: %+v %v", c, ok)
	}

	// Both fail: the claim goes.
	s1 = start("z")
	gate.waitHit(t)
	s2 = start("z")
	gate.waitHit(t)
	gate.release("z", 500)
	gate.release("z", 500)
	<-s1
	<-s2
	if c, ok := claimOf(t, g, "z"); ok {
		t.Fatalf("unconfirmed claim kept after every send failed: %+v", c)
	}
}

// Many concurrent sends from two keys to one fresh token: exactly one key
// ends up owning it, and every send of the other was refused.
func TestRacingClaims(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 1000})
	_, a := g.newKey("a")
	_, b := g.newKey("b")
	var wg sync.WaitGroup
	var mu sync.Mutex
	okBy := map[string]int{}
	for i := range 40 {
		key := a
		if i%2 == 1 {
			key = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := g.send(key, `{"token":"race"}`)
			mu.Lock()
			defer mu.Unlock()
			switch r.status {
			case 200:
				okBy[key]++
			case 403:
			default:
				t.Errorf("status %d %s", r.status, r.body)
			}
		}()
	}
	wg.Wait()
	if len(okBy) != 1 {
		t.Fatalf("deliveries by %d keys, want 1: %v", len(okBy), okBy)
	}
}

// Keys, claims and the budget survive a restart of the gateway.
func TestStateSurvivesRestart(t *testing.T) {
	f := newAPNsFake(t)
	dir := t.TempDir()
	clk := newClock()
	g := startGateway(t, gwOpts{apns: f.client, metered: true, budget: 3, dataDir: dir, clock: clk})
	_, a := g.newKey("a")
	_, b := g.newKey("b")
	expect(t, "a claims", g.send(a, `{"token":"keep"}`), 200, `{"ok":true}`)
	expect(t, "a again", g.send(a, `{"token":"keep"}`), 200, `{"ok":true}`)
	g.stop() // drains (flushes the budget) and closes the store

	g = startGateway(t, gwOpts{apns: f.client, metered: true, budget: 3, dataDir: dir, clock: clk})
	expect(t, "b after restart", g.send(b, `{"token":"keep"}`), 403, claimedBody)
	expect(t, "a after restart", g.send(a, `{"token":"keep"}`), 200, `{"ok":true}`)
	expect(t, "budget after restart", g.send(a, `{"token":"keep"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":3,"retryAfterSeconds":43200}`)
}
