package pushkv_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/cluster/pushkv"
	"edgerelay/store/storetest"
)

func hash(s string) store.Hash { return sha256.Sum256([]byte(s)) }

// gateways opens scope's key store on every node of c.
func gateways(t *testing.T, c *clustertest.Nodes, scope store.PushScope) []*pushkv.Gateway {
	t.Helper()
	gs := make([]*pushkv.Gateway, c.Len())
	for i := range gs {
		g, err := pushkv.New(clustertest.Context(t), c.Node(i), scope)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		gs[i] = g
	}
	return gs
}

func key(id string, now time.Time) store.PushKey {
	return store.PushKey{ID: id, Hash: hash("k-" + id), Label: id, Enabled: true, CreatedAt: now, Source: store.PushSourceAdmin}
}

// addEverywhere adds k through gs[0] and waits until every node knows it.
func addEverywhere(t *testing.T, gs []*pushkv.Gateway, k store.PushKey) {
	t.Helper()
	if err := gs[0].AddKey(k); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(storetest.PushSync)
	for _, g := range gs {
		for {
			if _, ok := g.KeyByID(k.ID); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %s not on every node after %v", k.ID, storetest.PushSync)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestAcrossNodes runs, on one three-node cluster, the contract of
// store.PushGatewayStore (each call of a sequence through the next node)
// and the cross-node races; every part uses its own keys, tokens and days.
func TestAcrossNodes(t *testing.T) {
	c := clustertest.Start(t, 3)
	scopes := map[store.PushScope][]*pushkv.Gateway{}
	open := func(t *testing.T, scope store.PushScope) []*pushkv.Gateway {
		if gs, ok := scopes[scope]; ok {
			return gs
		}
		scopes[scope] = gateways(t, c, scope)
		return scopes[scope]
	}
	shared := open(t, store.PushScopeShared)
	t.Run("Contract", func(t *testing.T) {
		storetest.PushGateway(t, func(t *testing.T, scope store.PushScope) []store.PushGatewayStore {
			var hs []store.PushGatewayStore
			for _, g := range open(t, scope) {
				hs = append(hs, g)
			}
			return hs
		})
	})
	t.Run("RateLimitExact", func(t *testing.T) { rateLimitExact(t, c, shared) })
	t.Run("BudgetExact", func(t *testing.T) { budgetExact(t, c, shared) })
	t.Run("ClaimRace", func(t *testing.T) { claimRace(t, c, shared) })
	t.Run("RevokeReachesOtherNodes", func(t *testing.T) { revokeReachesOtherNodes(t, c, shared) })
	t.Run("KeyByHashAllocationFree", func(t *testing.T) {
		k := key("alloc", time.Now())
		addEverywhere(t, shared, k)
		if n := testing.AllocsPerRun(100, func() { _, _ = shared[1].KeyByHash(k.Hash) }); n != 0 {
			t.Fatalf("%.0f allocations per key lookup on the send path, want 0", n)
		}
	})
}

// The per-key minute limit through three nodes at once admits exactly the
// limit, and not one more.
func rateLimitExact(t *testing.T, c *clustertest.Nodes, gs []*pushkv.Gateway) {
	const limit = 20
	lims := make([]store.PushRateLimiter, len(gs))
	for i, g := range gs {
		l, err := g.RateLimiter("send.fcm", limit)
		if err != nil {
			t.Fatal(err)
		}
		lims[i] = l
	}
	now := time.Now()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 { // 4 senders per node, 60 takes in all
		wg.Go(func() {
			for range 5 {
				ok, err := lims[w%len(lims)].Take(hash("rate-key"), now)
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
		t.Fatalf("%d of 60 takes through 3 nodes allowed, want exactly %d", n, limit)
	}
}

// The daily budget through three nodes at once never over-admits: exactly
// the limit is admitted, and the counter reads the limit afterwards.
func budgetExact(t *testing.T, c *clustertest.Nodes, gs []*pushkv.Gateway) {
	const limit = 50
	now := time.Now()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 { // 4 senders per node, 120 draws in all
		wg.Go(func() {
			for range 10 {
				_, ok, err := gs[w%len(gs)].DrawBudget(limit, now)
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
		t.Fatalf("%d of 120 draws through 3 nodes allowed, want exactly %d", n, limit)
	}
	for i, g := range gs {
		if n, err := g.BudgetUsed(now); n != limit || err != nil {
			t.Fatalf("node %d reads %d used (%v), want %d", i, n, err, limit)
		}
	}
}

// Two keys racing for one fresh token through three nodes: the claims are
// serialized, so exactly one key gets it and every claim of the other is
// refused.
func claimRace(t *testing.T, c *clustertest.Nodes, gs []*pushkv.Gateway) {
	now := time.Now()
	addEverywhere(t, gs, key("X", now))
	addEverywhere(t, gs, key("Y", now))
	for round := range 3 {
		tok := hash(fmt.Sprint("race-token-", round))
		var mu sync.Mutex
		won := map[string]int{}
		var wg sync.WaitGroup
		for w := range 12 {
			wg.Go(func() {
				owner := []string{"X", "Y"}[w%2]
				_, err := gs[w%len(gs)].Claim(tok, owner, now)
				switch {
				case errors.Is(err, store.ErrTokenClaimed):
				case err != nil:
					t.Error(err)
				default:
					mu.Lock()
					won[owner]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(won) != 1 {
			t.Fatalf("round %d: winners %v, want one key", round, won)
		}
		for owner, n := range won {
			if n != 6 {
				t.Fatalf("round %d: %s won %d of its 6 claims", round, owner, n)
			}
			cl, ok, err := gs[2].ClaimOf(tok)
			if err != nil || !ok || cl.Owner != owner || cl.InFlight != 6 {
				t.Fatalf("round %d: claim %+v %v %v", round, cl, ok, err)
			}
		}
	}
}

// A revoke or disable through node 0 is refused on node 2 within a second
// (the key watcher); the measured times are logged.
func revokeReachesOtherNodes(t *testing.T, c *clustertest.Nodes, gs []*pushkv.Gateway) {
	now := time.Now()
	wait := func(what string, done func() bool) {
		t.Helper()
		start := time.Now()
		for !done() {
			if time.Since(start) > time.Second {
				t.Fatalf("%s: not on node 2 after 1 s", what)
			}
			time.Sleep(100 * time.Microsecond)
		}
		t.Logf("%s reached node 2 in %v", what, time.Since(start))
	}
	d := key("disable-me", now)
	addEverywhere(t, gs, d)
	if err := gs[0].SetKeyEnabled(d.ID, false); err != nil {
		t.Fatal(err)
	}
	wait("disable", func() bool { k, ok := gs[2].KeyByHash(d.Hash); return ok && !k.Enabled })

	r := key("revoke-me", now)
	addEverywhere(t, gs, r)
	if err := gs[0].DeleteKey(r.ID); err != nil {
		t.Fatal(err)
	}
	wait("revoke", func() bool { _, ok := gs[2].KeyByHash(r.Hash); return !ok })

	// A node opened later loads every key, and not the revoked ones.
	late, err := pushkv.New(clustertest.Context(t), c.Node(1), store.PushScopeShared)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if k, ok := late.KeyByHash(d.Hash); !ok || k.Enabled {
		t.Fatalf("late node: disabled key %+v %v", k, ok)
	}
	if _, ok := late.KeyByHash(r.Hash); ok {
		t.Fatal("late node knows the revoked key")
	}
}

// A send in flight on a node that stops pins nothing: once the node's
// liveness lapses (about 10 s), an unconfirmed claim it held is released
// for another key, and a confirmed one keeps its owner with nothing in
// flight.
func TestStoppedNodesClaimReleased(t *testing.T) {
	c := clustertest.Start(t, 3)
	gs := gateways(t, c, store.PushScopeShared)
	now := time.Now()
	addEverywhere(t, gs, key("X", now))
	addEverywhere(t, gs, key("Y", now))
	fresh, confirmed := hash("dead-fresh"), hash("dead-confirmed")
	if _, err := gs[1].Claim(fresh, "X", now); err != nil {
		t.Fatal(err)
	}
	tk, err := gs[1].Claim(confirmed, "X", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := gs[1].Settle(tk, true); err != nil {
		t.Fatal(err)
	}
	if _, err := gs[1].Claim(confirmed, "X", now); err != nil {
		t.Fatal(err)
	}
	_ = gs[1].Close()
	c.Stop(1)
	stopped := time.Now()
	// Until the stop is seen, the node's send holds the token. Streams led
	// by the stopped node elect a new leader first: meanwhile the store
	// answers ErrUnavailable (a 503 at the handler), and the poll retries.
	refused := false
	for {
		tk, err := gs[0].Claim(fresh, "Y", now)
		switch {
		case err == nil:
			if !refused {
				t.Fatal("another key took the token while its owner's send was in flight")
			}
			t.Logf("released %v after the stop", time.Since(stopped))
			if err := gs[2].Settle(tk, true); err != nil {
				t.Fatal(err)
			}
		case errors.Is(err, store.ErrTokenClaimed):
			refused = true
		case !errors.Is(err, store.ErrUnavailable):
			t.Fatal(err)
		}
		if err == nil {
			break
		}
		if time.Since(stopped) > 20*time.Second {
			t.Fatalf("the stopped node's claim still pins the token after 20 s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if cl, ok, err := gs[2].ClaimOf(fresh); err != nil || !ok || cl.Owner != "Y" || !cl.Confirmed || cl.InFlight != 0 {
		t.Fatalf("taken claim %+v %v %v", cl, ok, err)
	}
	if cl, ok, err := gs[2].ClaimOf(confirmed); err != nil || !ok || cl.Owner != "X" || !cl.Confirmed || cl.InFlight != 0 {
		t.Fatalf("confirmed claim of the stopped node %+v %v %v", cl, ok, err)
	}
	if _, err := gs[0].Claim(confirmed, "Y", now); !errors.Is(err, store.ErrTokenClaimed) {
		t.Fatalf("a confirmed claim of an active key taken over: %v", err)
	}
	// The key watches outlive the stop (a watch whose consumer was on the
	// stopped server is replaced): a revoke still reaches node 2.
	if err := gs[0].DeleteKey("X"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for {
		if _, ok := gs[2].KeyByID("X"); !ok {
			t.Logf("revoke after the stop reached node 2 in %v", time.Since(revoked))
			break
		}
		if time.Since(revoked) > storetest.PushSync {
			t.Fatalf("node 2 still knows the key %v after a revoke", storetest.PushSync)
		}
		time.Sleep(time.Millisecond)
	}
}

// Without a quorum every operation that needs the shared store fails with
// store.ErrUnavailable (503 at the handler) instead of answering wrongly;
// the key lookups of the send path still answer from the mirror.
func TestNoQuorumIsUnavailable(t *testing.T) {
	c := clustertest.Start(t, 3)
	gs := gateways(t, c, store.PushScopeShared)
	now := time.Now()
	k := key("Q", now)
	addEverywhere(t, gs, k)
	lim, err := gs[0].RateLimiter("send.apns", 10)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := gs[0].Claim(hash("q-token"), "Q", now)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 2} {
		_ = gs[i].Close()
		c.Stop(i)
	}
	deadline := time.Now().Add(15 * time.Second)
	for c.Node(0).Unavailable() == nil {
		if time.Now().After(deadline) {
			t.Fatal("node 0 still reports the store available with 2 of 3 servers down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	self := key("Q-self", now)
	self.Source, self.RegisteredIP = store.PushSourceSelf, "198.51.100.1"
	g := gs[0]
	for name, op := range map[string]func() error{
		"AddKey":        func() error { return g.AddKey(key("Q2", now)) },
		"RegisterKey":   func() error { _, err := g.RegisterKey(self); return err },
		"SetKeyEnabled": func() error { return g.SetKeyEnabled("Q", false) },
		"DeleteKey":     func() error { return g.DeleteKey("Q") },
		"Claim":         func() error { _, err := g.Claim(hash("q-other"), "Q", now); return err },
		"Settle":        func() error { return g.Settle(tk, true) },
		"ClaimOf":       func() error { _, _, err := g.ClaimOf(hash("q-token")); return err },
		"DrawBudget":    func() error { _, _, err := g.DrawBudget(10, now); return err },
		"BudgetUsed":    func() error { _, err := g.BudgetUsed(now); return err },
		"Take":          func() error { _, err := lim.Take(k.Hash, now); return err },
	} {
		if err := op(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s without quorum: %v, want store.ErrUnavailable", name, err)
		}
	}
	if got, ok := g.KeyByHash(k.Hash); !ok || !got.Enabled {
		t.Fatalf("key lookup without quorum: %+v %v", got, ok)
	}

	// Quorum back: node 0's key watcher, which lived through the outage,
	// still delivers a revoke written through another node.
	n1 := c.Restart(1)
	for n1.Unavailable() != nil || c.Node(0).Unavailable() != nil {
		if time.Now().After(deadline.Add(15 * time.Second)) {
			t.Fatal("quorum not back after a restart")
		}
		time.Sleep(50 * time.Millisecond)
	}
	g1, err := pushkv.New(clustertest.Context(t), n1, store.PushScopeShared)
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	for {
		err := g1.DeleteKey("Q")
		if err == nil {
			break
		}
		if !errors.Is(err, store.ErrUnavailable) || time.Now().After(deadline.Add(25*time.Second)) {
			t.Fatalf("revoke after the outage: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	revoked := time.Now()
	for {
		if _, ok := g.KeyByHash(k.Hash); !ok {
			t.Logf("revoke after the outage reached node 0 in %v", time.Since(revoked))
			break
		}
		if time.Since(revoked) > storetest.PushSync {
			t.Fatalf("node 0 still knows the key %v after a revoke written once quorum was back", storetest.PushSync)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkSendPath is the store's share of one accepted /send in cluster
// mode: the key's minute limit, the claim, the budget draw and the settle,
// spread over three nodes (each op a leader round trip).
func BenchmarkSendPath(b *testing.B) {
	c := clustertest.Start(b, 3)
	gs := make([]*pushkv.Gateway, c.Len())
	for i := range gs {
		g, err := pushkv.New(clustertest.Context(b), c.Node(i), store.PushScopeShared)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = g.Close() })
		gs[i] = g
	}
	now := time.Now()
	if err := gs[0].AddKey(key("bench", now)); err != nil {
		b.Fatal(err)
	}
	lims := make([]store.PushRateLimiter, len(gs))
	for i, g := range gs {
		l, err := g.RateLimiter("send.bench", 1<<30)
		if err != nil {
			b.Fatal(err)
		}
		lims[i] = l
	}
	b.ResetTimer()
	for i := range b.N {
		g := gs[i%len(gs)]
		tok := hash(fmt.Sprint("bench-token-", i%64))
		if ok, err := lims[i%len(gs)].Take(hash("bench"), now); !ok || err != nil {
			b.Fatal(ok, err)
		}
		tk, err := g.Claim(tok, "bench", now)
		if err != nil {
			b.Fatal(err)
		}
		if _, ok, err := g.DrawBudget(1<<40, now); !ok || err != nil {
			b.Fatal(ok, err)
		}
		if err := g.Settle(tk, true); err != nil {
			b.Fatal(err)
		}
	}
}
