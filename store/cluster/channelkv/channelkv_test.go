package channelkv

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/storetest"
)

// open returns one claim store per running node of nodes.
func open(t *testing.T, nodes *clustertest.Nodes) []*Claims {
	t.Helper()
	return clustertest.Open(t, nodes, New)
}

func asStores(cs []*Claims) []store.ChannelClaimStore {
	return clustertest.As[store.ChannelClaimStore](cs)
}

func hash(s string) store.Hash { return sha256.Sum256([]byte(s)) }

// TestClusterClaims runs the claim store contract across 3 nodes (each call
// through the next node), then the cluster's own cases on the same nodes:
// races through the three nodes at one instant, watches, and the leftovers
// of a node that crashed between two writes. (One cluster for both: every
// case uses its own names, and a start costs seconds under -race.)
func TestClusterClaims(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	cs := open(t, nodes)
	now := time.Unix(1700000000, 0).UTC()

	t.Run("Contract", func(t *testing.T) { storetest.Channel(t, asStores(cs)) })

	t.Run("SameKeyThroughThreeNodesManyRounds", func(t *testing.T) {
		for round := range 25 {
			key := fmt.Sprint("r", round)
			if err := cs[round%3].AddKey(hash(key), "host-"+key, now); err != nil {
				t.Fatal(err)
			}
			var wins, used atomic.Int32
			var winner atomic.Int32
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, c := range cs {
				wg.Go(func() {
					<-start
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
			close(start)
			wg.Wait()
			if wins.Load() != 1 || used.Load() != 2 {
				t.Fatalf("round %d: wins %d used %d", round, wins.Load(), used.Load())
			}
			w := winner.Load()
			for i := range cs {
				k, err := cs[(i+1)%3].ByOwner(hash(fmt.Sprint(key, "o", i)))
				if int32(i) == w && (err != nil || k.Hash != hash(key)) {
					t.Fatalf("round %d: winner's owner token: %v", round, err)
				}
				if int32(i) != w && !errors.Is(err, store.ErrUnknownToken) {
					t.Fatalf("round %d: loser's owner token: %v", round, err)
				}
			}
		}
	})

	t.Run("SameTokensTwoKeysThroughTwoNodes", func(t *testing.T) {
		// Two computers racing with one owner token: at most one holds
		// it, and the token reaches exactly the key whose claim won it.
		for round := range 10 {
			k1, k2 := fmt.Sprint("st1-", round), fmt.Sprint("st2-", round)
			for _, k := range []string{k1, k2} {
				if err := cs[0].AddKey(hash(k), "host-"+k, now); err != nil {
					t.Fatal(err)
				}
			}
			tok := hash(fmt.Sprint("st-o", round))
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i, k := range []string{k1, k2} {
				wg.Go(func() { _, errs[i] = cs[i+1].Claim(hash(k), tok, hash(k+"p"), now) })
			}
			wg.Wait()
			won := 0
			for i, err := range errs {
				switch {
				case err == nil:
					won++
					if k, err := cs[0].ByOwner(tok); err != nil || k.Hash != hash([]string{k1, k2}[i]) {
						t.Fatalf("round %d: token reaches %+v %v", round, k, err)
					}
				case !errors.Is(err, store.ErrTokenInUse):
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if won > 1 {
				t.Fatalf("round %d: one token claimed for two computers", round)
			}
		}
	})

	ctx := clustertest.Context(t)
	c := cs[1]

	t.Run("ReleaseAndRevokeReachEveryNodesWatch", func(t *testing.T) {
		got := make(chan store.Hash, 16)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		if err := cs[2].WatchForgotten(wctx, func(h store.Hash) { got <- h }); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"w-rel", "w-rev"} {
			if err := cs[0].AddKey(hash(k), k, now); err != nil {
				t.Fatal(err)
			}
			if _, err := cs[1].Claim(hash(k), hash(k+"o"), hash(k+"p"), now); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cs[0].Release(hash("w-relo")); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[1].Revoke("w-rev"); err != nil {
			t.Fatal(err)
		}
		// Adds and claims say nothing: the first two calls are the release
		// and the revocation, in order.
		for _, want := range []string{"w-rel", "w-rev"} {
			select {
			case h := <-got:
				if h != hash(want) {
					t.Fatalf("watch: got %x, want %s", h[:4], want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("watch: no call for %s", want)
			}
		}
	})

	t.Run("HintsWithoutClaimReachNothing", func(t *testing.T) {
		// A node wrote both hints, then crashed before the record's
		// compare-and-set.
		if err := c.AddKey(hash("crash-k"), "crash", now); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{ownerRole.key(hash("crash-o")), phoneRole.key(hash("crash-p"))} {
			if _, err := c.kv.Create(ctx, key, hexValue(hash("crash-k"))); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cs[2].ByOwner(hash("crash-o")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("owner token of an unfinished claim: %v", err)
		}
		if _, err := cs[2].ByPhone(hash("crash-p")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("phone token of an unfinished claim: %v", err)
		}
		// Until the claim settles, the token is in flight for others...
		if err := c.AddKey(hash("crash-k2"), "crash2", now); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[0].Claim(hash("crash-k2"), hash("crash-o"), hash("crash-x"), now); !errors.Is(err, store.ErrTokenInUse) {
			t.Fatalf("token of a claim in flight: %v", err)
		}
		// ...and the computer's retry of the same claim settles it.
		if _, err := cs[0].Claim(hash("crash-k"), hash("crash-o"), hash("crash-p"), now); err != nil {
			t.Fatalf("retry: %v", err)
		}
		if k, err := cs[2].ByOwner(hash("crash-o")); err != nil || k.Host != "crash" {
			t.Fatalf("owner after retry: %+v %v", k, err)
		}
		if k, err := cs[2].ByPhone(hash("crash-p")); err != nil || k.Host != "crash" {
			t.Fatalf("phone after retry: %+v %v", k, err)
		}
	})

	t.Run("StaleHintTakenOver", func(t *testing.T) {
		// A claim that lost its race could not drop its hint: the hint
		// names a key used with other tokens, so the token is free.
		if err := c.AddKey(hash("stale-k"), "stale", now); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Claim(hash("stale-k"), hash("stale-winner-o"), hash("stale-winner-p"), now); err != nil {
			t.Fatal(err)
		}
		if _, err := c.kv.Create(ctx, ownerRole.key(hash("stale-o")), hexValue(hash("stale-k"))); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[0].ByOwner(hash("stale-o")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("stale hint: %v", err)
		}
		if err := c.AddKey(hash("stale-k2"), "stale2", now); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[2].Claim(hash("stale-k2"), hash("stale-o"), hash("stale-p"), now); err != nil {
			t.Fatalf("claim over a stale hint: %v", err)
		}
		if k, err := cs[0].ByOwner(hash("stale-o")); err != nil || k.Host != "stale2" {
			t.Fatalf("owner: %+v %v", k, err)
		}
	})

	t.Run("WinnerPutsBackADroppedHint", func(t *testing.T) {
		// An identical claim racing this one wrote the owner hint (this
		// claim adopted it), lost for another reason and dropped it before
		// this claim's compare-and-set.
		if err := c.AddKey(hash("drop-k"), "drop", now); err != nil {
			t.Fatal(err)
		}
		hintKey := ownerRole.key(hash("drop-o"))
		if _, err := c.kv.Create(ctx, hintKey, hexValue(hash("drop-k"))); err != nil {
			t.Fatal(err)
		}
		c.afterHints = func() {
			if err := cluster.Delete(ctx, c.kv, hintKey, 0); err != nil {
				t.Error(err)
			}
		}
		defer func() { c.afterHints = nil }()
		if _, err := c.Claim(hash("drop-k"), hash("drop-o"), hash("drop-p"), now); err != nil {
			t.Fatal(err)
		}
		if k, err := cs[0].ByOwner(hash("drop-o")); err != nil || k.Host != "drop" {
			t.Fatalf("owner token of the winner: %+v %v", k, err)
		}
	})

	t.Run("HostReservationWithoutRecord", func(t *testing.T) {
		// A node reserved the host, then crashed before the key record.
		if _, err := c.kv.Create(ctx, hostKey("orphan"), hexValue(hash("orphan-k0"))); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[0].Revoke("orphan"); !errors.Is(err, store.ErrUnknownHost) {
			t.Fatalf("revoke of a host with no key: %v", err)
		}
		// Young, it is an add in flight.
		if err := cs[0].AddKey(hash("orphan-k1"), "orphan", now); !errors.Is(err, store.ErrHostExists) {
			t.Fatalf("add during a reservation in flight: %v", err)
		}
		// The crashed add's own retry finishes it.
		if err := cs[2].AddKey(hash("orphan-k0"), "orphan", now); err != nil {
			t.Fatalf("retry of the crashed add: %v", err)
		}
		if ok, err := cs[0].HasKey(hash("orphan-k0")); !ok || err != nil {
			t.Fatalf("has key: %v %v", ok, err)
		}
		// Old, it is stale and taken over.
		if _, err := c.kv.Create(ctx, hostKey("orphan2"), hexValue(hash("orphan2-k0"))); err != nil {
			t.Fatal(err)
		}
		cs[0].staleAfter = 0
		defer func() { cs[0].staleAfter = staleAfter }()
		if err := cs[0].AddKey(hash("orphan2-k1"), "orphan2", now); err != nil {
			t.Fatalf("add over a stale reservation: %v", err)
		}
		if k, ok := listed(t, cs[1], "orphan2"); !ok || k.Hash != hash("orphan2-k1") {
			t.Fatalf("listed %+v %v", k, ok)
		}
	})
}

// TestClusterRestartAndQuorumLoss: a restarted node serves everything
// committed before; with 2 of 3 nodes stopped every write fails with
// store.ErrUnavailable and no read of committed data says "not found".
func TestClusterRestartAndQuorumLoss(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	cs := open(t, nodes)
	now := time.Unix(1700000000, 0).UTC()
	if err := cs[0].AddKey(hash("k"), "alpha", now); err != nil {
		t.Fatal(err)
	}
	if err := cs[1].AddKey(hash("k2"), "beta", now); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[1].Claim(hash("k"), hash("o"), hash("p"), now); err != nil {
		t.Fatal(err)
	}

	nodes.Stop(0)
	nodes.Restart(0)
	c0, err := New(clustertest.Context(t), nodes.Node(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c0.Claim(hash("k"), hash("o2"), hash("p2"), now); !errors.Is(err, store.ErrKeyUsed) {
		t.Fatalf("claim after restart: %v", err)
	}
	if k, err := c0.ByOwner(hash("o")); err != nil || k.Host != "alpha" {
		t.Fatalf("owner after restart: %+v %v", k, err)
	}
	if k, err := c0.ByPhone(hash("p")); err != nil || k.Host != "alpha" {
		t.Fatalf("phone after restart: %+v %v", k, err)
	}
	if keys, err := c0.Keys(); err != nil || len(keys) != 2 {
		t.Fatalf("keys after restart: %+v %v", keys, err)
	}

	// Quorum lost: only node 0 left.
	nodes.Stop(1)
	nodes.Stop(2)
	checkWrites := func(t *testing.T) {
		t.Helper()
		var wg sync.WaitGroup
		for name, write := range map[string]func() error{
			"add":     func() error { return c0.AddKey(hash("k3"), "gamma", now) },
			"claim":   func() error { _, err := c0.Claim(hash("k2"), hash("o3"), hash("p3"), now); return err },
			"release": func() error { _, err := c0.Release(hash("o")); return err },
			"revoke":  func() error { _, err := c0.Revoke("alpha"); return err },
		} {
			wg.Go(func() {
				if err := write(); !errors.Is(err, store.ErrUnavailable) {
					t.Errorf("%s without quorum: %v", name, err)
				}
			})
		}
		wg.Wait()
	}
	// Reads of committed data: served, or ErrUnavailable once the
	// stream has no leader (never "not found"); each is seen unavailable.
	reads := map[string]func() error{
		"by owner": func() error { _, err := c0.ByOwner(hash("o")); return err },
		"by phone": func() error { _, err := c0.ByPhone(hash("p")); return err },
		"keys": func() error {
			keys, err := c0.Keys()
			if err == nil && len(keys) != 2 {
				return fmt.Errorf("%d of 2 committed keys listed", len(keys))
			}
			return err
		},
		"has key": func() error {
			ok, err := c0.HasKey(hash("k2"))
			if err == nil && !ok {
				return errors.New("committed key not found")
			}
			return err
		},
	}
	// At once (the node may not know yet: the writes time out, and the
	// stream leader steps down a few seconds later), side by side.
	var both sync.WaitGroup
	both.Go(func() { checkWrites(t) })
	both.Go(func() { checkReads(t, reads) })
	both.Wait()
	// ...and once its readiness says so (refused without a round trip).
	deadline := time.Now().Add(10 * time.Second)
	for nodes.Node(0).Unavailable() == nil {
		if time.Now().After(deadline) {
			t.Fatal("readiness still says available without quorum")
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkWrites(t)
}

func listed(t *testing.T, c *Claims, host string) (store.ChannelKey, bool) {
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

// checkReads calls every read, side by side, until each has answered
// store.ErrUnavailable once; any other error fails the test.
func checkReads(t *testing.T, reads map[string]func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for name, read := range reads {
		wg.Go(func() {
			for {
				err := read()
				if errors.Is(err, store.ErrUnavailable) {
					return
				}
				if err != nil {
					t.Errorf("%s without quorum: %v", name, err)
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("%s still served without quorum after 20 s", name)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// TestImportFromPebble: a single node's claim keys (unused, claimed,
// released) imported through one node read back the same through the
// others, work as they did, and a second import changes nothing.
func TestImportFromPebble(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	single := store.NewChannelClaims(db)
	now := time.Unix(1700000000, 0)
	for _, host := range []string{"unused", "claimed", "released"} {
		if err := single.AddKey(hash("k-"+host), host, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, host := range []string{"claimed", "released"} {
		if _, err := single.Claim(hash("k-"+host), hash("o-"+host), hash("p-"+host), now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := single.Release(hash("o-released")); err != nil {
		t.Fatal(err)
	}
	want, err := single.Keys()
	if err != nil {
		t.Fatal(err)
	}

	nodes := clustertest.Start(t, 3)
	cs := open(t, nodes)
	for range 2 { // the second import is a no-op
		for _, k := range want {
			if err := cs[0].Import(k); err != nil {
				t.Fatalf("import %s: %v", k.Host, err)
			}
		}
	}
	got, err := cs[1].Keys()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("imported:\n%v\nwant\n%v", got, want)
	}
	if k, err := cs[2].ByOwner(hash("o-claimed")); err != nil || k.Host != "claimed" {
		t.Fatalf("imported owner token: %+v %v", k, err)
	}
	if k, err := cs[2].ByPhone(hash("p-claimed")); err != nil || k.Host != "claimed" {
		t.Fatalf("imported phone token: %+v %v", k, err)
	}
	if _, err := cs[1].ByOwner(hash("o-released")); !errors.Is(err, store.ErrUnknownToken) {
		t.Fatalf("released owner token: %v", err)
	}
	if _, err := cs[1].Claim(hash("k-released"), hash("x"), hash("y"), now); !errors.Is(err, store.ErrKeyUsed) {
		t.Fatalf("claim of an imported used key: %v", err)
	}
	if err := cs[2].AddKey(hash("k-other"), "unused", now); !errors.Is(err, store.ErrHostExists) {
		t.Fatalf("imported host: %v", err)
	}
	if _, err := cs[1].Claim(hash("k-unused"), hash("o-unused"), hash("p-unused"), now); err != nil {
		t.Fatalf("claim of an imported unused key: %v", err)
	}
	// The cluster moved on: importing the old state again is refused.
	if err := cs[0].Import(want[len(want)-1]); !errors.Is(err, ErrImportConflict) || want[len(want)-1].Host != "unused" {
		t.Fatalf("import over a newer state: %v", err)
	}
}

// BenchmarkCluster measures a token lookup (what every control socket and
// phone channel pays) and a claim, each through another node than the one
// that wrote: go test -run X -bench Cluster -benchtime 300x ./store/cluster/channelkv/
func BenchmarkCluster(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	var cs []*Claims
	for i := range 3 {
		c, err := New(clustertest.Context(b), nodes.Node(i))
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	now := time.Now()
	if err := cs[0].AddKey(hash("bench-k"), "bench", now); err != nil {
		b.Fatal(err)
	}
	if _, err := cs[0].Claim(hash("bench-k"), hash("bench-o"), hash("bench-p"), now); err != nil {
		b.Fatal(err)
	}
	b.Run("ByOwner", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := cs[1+i%2].ByOwner(hash("bench-o")); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AddKeyAndClaim", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			key := fmt.Sprint("bench-k", i)
			if err := cs[i%3].AddKey(hash(key), "bench-"+key, now); err != nil {
				b.Fatal(err)
			}
			if _, err := cs[(i+1)%3].Claim(hash(key), hash(key+"o"), hash(key+"p"), now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
