package agentkv

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/storetest"
)

// open returns one agent store per running node of nodes.
func open(t *testing.T, nodes *clustertest.Nodes) []*Store {
	t.Helper()
	return clustertest.Open(t, nodes, New)
}

func asRecords(ss []*Store) []store.AgentRecords { return clustertest.As[store.AgentRecords](ss) }

func hash(s string) store.Hash { return sha256.Sum256([]byte(s)) }

// TestClusterAgent: redemptions racing through the three nodes at one
// instant, revocation seen by every node at once, and the leftovers of a
// node that crashed between two writes.
//
// It first runs the agent records' contract across the 3 nodes (each call
// through the next node) on the same cluster: every case uses its own
// names, and a start costs seconds under -race.
func TestClusterAgent(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ss := open(t, nodes)
	now := time.Unix(1700000000, 0).UTC()

	t.Run("Contract", func(t *testing.T) { storetest.Agent(t, asRecords(ss)) })
	if err := ss[0].AddAccount("acc", "alice", hash("client"), now); err != nil {
		t.Fatal(err)
	}

	t.Run("PairingKeyThroughThreeNodesManyRounds", func(t *testing.T) {
		const rounds = 25
		for round := range rounds {
			key := fmt.Sprint("pk", round)
			if err := ss[round%3].AddPairingKey(hash(key), "acc", now, now.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			var wins, used atomic.Int32
			var winner atomic.Int32
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, s := range ss {
				wg.Go(func() {
					<-start
					_, err := s.RedeemPairingKey(hash(key), fmt.Sprint(key, "-i", i), "n", hash(fmt.Sprint(key, "t", i)), now)
					switch {
					case err == nil:
						wins.Add(1)
						winner.Store(int32(i))
					case errors.Is(err, store.ErrPairingUsed):
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
			for i := range ss {
				_, err := ss[(i+1)%3].InstanceByToken(hash(fmt.Sprint(key, "t", i)))
				if (int32(i) == winner.Load()) != (err == nil) {
					t.Fatalf("round %d: instance token %d: %v", round, i, err)
				}
			}
		}
		insts, err := ss[1].Instances()
		n := 0
		for _, in := range insts {
			if in.Account == "acc" {
				n++
			}
		}
		if err != nil || n != rounds {
			t.Fatalf("%d instances from %d keys: %v", n, rounds, err)
		}
	})

	t.Run("RevocationReachesEveryNodesWatch", func(t *testing.T) {
		got := make(chan string, 16)
		wctx, stop := context.WithCancel(t.Context())
		defer stop()
		if err := ss[2].WatchRevoked(wctx, func(id string) { got <- id }); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"w-1", "w-2"} {
			if err := ss[0].AddPairingKey(hash(k), "acc", now, now.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			if _, err := ss[1].RedeemPairingKey(hash(k), "inst-"+k, "n", hash(k+"t"), now); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{"inst-w-2", "inst-w-1", "inst-w-1"} { // the second revoke changes nothing
			if _, err := ss[0].RevokeInstance(id); err != nil {
				t.Fatal(err)
			}
		}
		// Pairings say nothing: the calls are the two revocations, in order.
		for _, want := range []string{"inst-w-2", "inst-w-1"} {
			select {
			case id := <-got:
				if id != want {
					t.Fatalf("watch: got %s, want %s", id, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("watch: no call for %s", want)
			}
		}
		select {
		case id := <-got:
			t.Fatalf("watch: a call for %s after the revocations", id)
		case <-time.After(100 * time.Millisecond):
		}
	})

	t.Run("RevocationSeenByEveryNodeAtOnce", func(t *testing.T) {
		if err := ss[0].AddPairingKey(hash("rev-pk"), "acc", now, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[1].RedeemPairingKey(hash("rev-pk"), "rev-i", "n", hash("rev-t"), now); err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			if _, err := s.InstanceByToken(hash("rev-t")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := ss[2].RevokeInstance("rev-i"); err != nil {
			t.Fatal(err)
		}
		// No wait: the very next read on each node refuses the token.
		for i, s := range ss {
			if _, err := s.InstanceByToken(hash("rev-t")); !errors.Is(err, store.ErrUnknownToken) {
				t.Fatalf("node %d after revoke: %v", i, err)
			}
		}
	})

	ctx := clustertest.Context(t)
	s := ss[1]

	t.Run("FailedInstanceGivesTheKeyBack", func(t *testing.T) {
		if err := s.AddPairingKey(hash("back-pk"), "acc", now, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		// The instance's writes fail after the spend (here: its token hint
		// is taken).
		if _, err := s.kv.Create(ctx, instTokenKey(hash("back-t")), []byte("other")); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[0].RedeemPairingKey(hash("back-pk"), "back-i", "n", hash("back-t"), now); err == nil {
			t.Fatal("redeemed with a taken token hint")
		}
		if _, err := ss[2].Instance("back-i"); !errors.Is(err, store.ErrUnknownInstance) {
			t.Fatalf("instance of a failed redemption: %v", err)
		}
		if _, err := ss[2].RedeemPairingKey(hash("back-pk"), "back-i2", "n", hash("back-t2"), now); err != nil {
			t.Fatalf("retry after the key was given back: %v", err)
		}
	})

	t.Run("SpentKeyWithoutInstance", func(t *testing.T) {
		// A node spent the key, then crashed before the instance: the key
		// stays spent (never two instances), and nothing answers for it.
		raw, _ := marshal(pairingRecord{Account: "acc", Created: now, Expires: now.Add(time.Hour), Used: true, Instance: "lost-i"})
		if _, err := s.kv.Create(ctx, pairingKey(hash("lost-pk")), raw); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[0].RedeemPairingKey(hash("lost-pk"), "lost-i2", "n", hash("lost-t2"), now); !errors.Is(err, store.ErrPairingUsed) {
			t.Fatalf("redeem of a spent key: %v", err)
		}
		if _, err := ss[2].Instance("lost-i"); !errors.Is(err, store.ErrUnknownInstance) {
			t.Fatalf("instance: %v", err)
		}
	})

	t.Run("HintsWithoutRecordsReachNothing", func(t *testing.T) {
		// Token hints written, records never: a crash between the writes.
		if _, err := s.kv.Create(ctx, instTokenKey(hash("orphan-t")), []byte("orphan-i")); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[0].InstanceByToken(hash("orphan-t")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("instance token without instance: %v", err)
		}
		if _, err := s.kv.Create(ctx, clientKey(hash("orphan-c")), []byte("orphan-acc")); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[0].AccountByClientToken(hash("orphan-c")); !errors.Is(err, store.ErrUnknownToken) {
			t.Fatalf("client token without account: %v", err)
		}
		// The stale client hint is taken over by the next account.
		if err := ss[2].AddAccount("orphan-acc2", "orphan-bob", hash("orphan-c"), now); err != nil {
			t.Fatalf("add over a stale client hint: %v", err)
		}
		if a, err := ss[0].AccountByClientToken(hash("orphan-c")); err != nil || a.ID != "orphan-acc2" {
			t.Fatalf("client token: %+v %v", a, err)
		}
	})

	t.Run("NameReservationWithoutRecord", func(t *testing.T) {
		if _, err := s.kv.Create(ctx, nameKey("carol"), []byte("carol-0")); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[0].AccountByName("carol"); !errors.Is(err, store.ErrUnknownAccount) {
			t.Fatalf("by name: %v", err)
		}
		// Young, it is an add in flight.
		if err := ss[0].AddAccount("carol-1", "carol", hash("carol-c1"), now); !errors.Is(err, store.ErrAccountExists) {
			t.Fatalf("add during a reservation in flight: %v", err)
		}
		// The crashed add's own retry finishes it.
		if err := ss[2].AddAccount("carol-0", "carol", hash("carol-c0"), now); err != nil {
			t.Fatalf("retry of the crashed add: %v", err)
		}
		if a, err := ss[0].AccountByName("carol"); err != nil || a.ID != "carol-0" {
			t.Fatalf("by name: %+v %v", a, err)
		}
		// Old, it is stale and taken over.
		if _, err := s.kv.Create(ctx, nameKey("dave"), []byte("dave-0")); err != nil {
			t.Fatal(err)
		}
		ss[0].staleAfter = 0
		defer func() { ss[0].staleAfter = staleAfter }()
		if err := ss[0].AddAccount("dave-1", "dave", hash("dave-c1"), now); err != nil {
			t.Fatalf("add over a stale reservation: %v", err)
		}
		if a, err := ss[1].AccountByName("dave"); err != nil || a.ID != "dave-1" {
			t.Fatalf("by name: %+v %v", a, err)
		}
	})

	t.Run("ListsManyRecords", func(t *testing.T) {
		const n = 150
		for i := range n {
			if err := ss[i%3].AddAccount(fmt.Sprint("many-", i), fmt.Sprint("many-", i), hash(fmt.Sprint("many-c", i)), now); err != nil {
				t.Fatal(err)
			}
		}
		accounts, err := ss[2].Accounts()
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for i, a := range accounts {
			if i > 0 && accounts[i-1].Name > a.Name {
				t.Fatalf("not ordered: %q before %q", accounts[i-1].Name, a.Name)
			}
			if len(a.Name) > 5 && a.Name[:5] == "many-" {
				seen++
			}
		}
		if seen != n {
			t.Fatalf("%d of %d accounts listed", seen, n)
		}
	})

	// Last: it prunes every pairing key above.
	t.Run("PruneLeavesNoMarker", func(t *testing.T) {
		if err := ss[0].AddPairingKey(hash("old-pk"), "acc", now, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		later := now.Add(time.Minute + pairingRetention + time.Second)
		ss[1].lastPrune.Store(0) // the contract's pruning ran on some node
		if err := ss[1].AddPairingKey(hash("new-pk"), "acc", later, later.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter("$KV."+Bucket+"."+pairingKey(hash("old-pk"))))
		if err != nil {
			t.Fatal(err)
		}
		if len(info.State.Subjects) != 0 {
			t.Fatalf("pruned key left %v in the stream", info.State.Subjects)
		}
		if _, err := ss[2].RedeemPairingKey(hash("old-pk"), "old-i", "n", hash("old-t"), later); !errors.Is(err, store.ErrPairingUnknown) {
			t.Fatalf("pruned key: %v", err)
		}
	})
}

// TestClusterAgentRestartAndQuorumLoss: a restarted node serves everything
// committed before; with 2 of 3 nodes stopped every write fails with
// store.ErrUnavailable and no read of committed data says "not found".
func TestClusterAgentRestartAndQuorumLoss(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ss := open(t, nodes)
	now := time.Unix(1700000000, 0).UTC()
	if err := ss[0].AddAccount("acc", "alice", hash("client"), now); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pk1", "pk2"} {
		if err := ss[1].AddPairingKey(hash(k), "acc", now, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ss[2].RedeemPairingKey(hash("pk1"), "inst", "n", hash("itok"), now); err != nil {
		t.Fatal(err)
	}

	nodes.Stop(0)
	nodes.Restart(0)
	s0 := open(t, nodes)[0]
	if _, err := s0.RedeemPairingKey(hash("pk1"), "inst2", "n", hash("itok2"), now); !errors.Is(err, store.ErrPairingUsed) {
		t.Fatalf("redeem after restart: %v", err)
	}
	if a, err := s0.AccountByClientToken(hash("client")); err != nil || a.Name != "alice" {
		t.Fatalf("client token after restart: %+v %v", a, err)
	}
	if in, err := s0.InstanceByToken(hash("itok")); err != nil || in.ID != "inst" {
		t.Fatalf("instance token after restart: %+v %v", in, err)
	}

	nodes.Stop(1)
	nodes.Stop(2)
	checkWrites := func(t *testing.T) {
		t.Helper()
		var wg sync.WaitGroup
		for name, write := range map[string]func() error{
			"add account": func() error { return s0.AddAccount("acc2", "bob", hash("client2"), now) },
			"add pairing": func() error { return s0.AddPairingKey(hash("pk3"), "acc", now, now.Add(time.Hour)) },
			"redeem": func() error {
				_, err := s0.RedeemPairingKey(hash("pk2"), "inst3", "n", hash("itok3"), now)
				return err
			},
			"revoke": func() error { _, err := s0.RevokeInstance("inst"); return err },
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
		"account":         func() error { _, err := s0.Account("acc"); return err },
		"by name":         func() error { _, err := s0.AccountByName("alice"); return err },
		"by client token": func() error { _, err := s0.AccountByClientToken(hash("client")); return err },
		"instance":        func() error { _, err := s0.Instance("inst"); return err },
		"by token":        func() error { _, err := s0.InstanceByToken(hash("itok")); return err },
		"accounts": func() error {
			as, err := s0.Accounts()
			if err == nil && len(as) != 1 {
				return fmt.Errorf("%d of 1 committed accounts listed", len(as))
			}
			return err
		},
		"instances": func() error {
			is, err := s0.Instances()
			if err == nil && len(is) != 1 {
				return fmt.Errorf("%d of 1 committed instances listed", len(is))
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
	deadline := time.Now().Add(10 * time.Second)
	for nodes.Node(0).Unavailable() == nil {
		if time.Now().After(deadline) {
			t.Fatal("readiness still says available without quorum")
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkWrites(t) // refused without a round trip
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

// TestImportFromPebble: a single node's agent records imported through one
// node read back the same through the others and work as they did; a
// second import changes nothing.
func TestImportFromPebble(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	single := store.NewAgentStore(db)
	now := time.Unix(1700000000, 0)
	for _, n := range []string{"alice", "bob"} {
		if err := single.AddAccount("acct-"+n, n, hash("client-"+n), now); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"pk-live", "pk-revoked", "pk-unused"} {
		if err := single.AddPairingKey(hash(k), "acct-alice", now, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"live", "revoked"} {
		if _, err := single.RedeemPairingKey(hash("pk-"+k), "inst-"+k, "host-"+k, hash("tok-"+k), now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := single.RevokeInstance("inst-revoked"); err != nil {
		t.Fatal(err)
	}
	accounts, err := single.Accounts()
	if err != nil {
		t.Fatal(err)
	}
	insts, err := single.Instances()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := single.PairingKeys()
	if err != nil {
		t.Fatal(err)
	}

	nodes := clustertest.Start(t, 3)
	ss := open(t, nodes)
	for range 2 { // the second import is a no-op
		for _, a := range accounts {
			if err := ss[0].ImportAccount(a); err != nil {
				t.Fatal(err)
			}
		}
		for _, in := range insts {
			if err := ss[0].ImportInstance(in); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys {
			if err := ss[0].ImportPairingKey(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, err := ss[1].Accounts(); err != nil || fmt.Sprint(got) != fmt.Sprint(accounts) {
		t.Fatalf("accounts:\n%v %v\nwant\n%v", got, err, accounts)
	}
	if got, err := ss[2].Instances(); err != nil || fmt.Sprint(got) != fmt.Sprint(insts) {
		t.Fatalf("instances:\n%v %v\nwant\n%v", got, err, insts)
	}
	if a, err := ss[1].AccountByClientToken(hash("client-bob")); err != nil || a.ID != "acct-bob" {
		t.Fatalf("client token: %+v %v", a, err)
	}
	if in, err := ss[2].InstanceByToken(hash("tok-live")); err != nil || in.ID != "inst-live" {
		t.Fatalf("live instance token: %+v %v", in, err)
	}
	if _, err := ss[2].InstanceByToken(hash("tok-revoked")); !errors.Is(err, store.ErrUnknownToken) {
		t.Fatalf("revoked instance token: %v", err)
	}
	if _, err := ss[1].RedeemPairingKey(hash("pk-live"), "inst-x", "n", hash("tok-x"), now); !errors.Is(err, store.ErrPairingUsed) {
		t.Fatalf("imported used key: %v", err)
	}
	if err := ss[1].AddAccount("acct-other", "alice", hash("client-other"), now); !errors.Is(err, store.ErrAccountExists) {
		t.Fatalf("imported name: %v", err)
	}
	if _, err := ss[2].RedeemPairingKey(hash("pk-unused"), "inst-new", "n", hash("tok-new"), now); err != nil {
		t.Fatalf("imported unused key: %v", err)
	}
	// The cluster moved on: importing the old state again is refused.
	for _, k := range keys {
		if k.Hash == hash("pk-unused") {
			if err := ss[0].ImportPairingKey(k); !errors.Is(err, ErrImportConflict) {
				t.Fatalf("import over a newer state: %v", err)
			}
		}
	}
}

// BenchmarkCluster measures an instance token lookup (what every link
// handshake pays) and a pairing (add a key, redeem it), each through another
// node than the one that wrote: go test -run X -bench Cluster -benchtime 300x ./store/cluster/agentkv/
func BenchmarkCluster(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	var ss []*Store
	for i := range 3 {
		s, err := New(clustertest.Context(b), nodes.Node(i))
		if err != nil {
			b.Fatal(err)
		}
		ss = append(ss, s)
	}
	now := time.Now()
	if err := ss[0].AddAccount("acc", "alice", hash("client"), now); err != nil {
		b.Fatal(err)
	}
	if err := ss[0].AddPairingKey(hash("pk"), "acc", now, now.Add(time.Hour)); err != nil {
		b.Fatal(err)
	}
	if _, err := ss[0].RedeemPairingKey(hash("pk"), "inst", "n", hash("itok"), now); err != nil {
		b.Fatal(err)
	}
	b.Run("InstanceByToken", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := ss[1+i%2].InstanceByToken(hash("itok")); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Redeem", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			key := fmt.Sprint("pk", i)
			if err := ss[i%3].AddPairingKey(hash(key), "acc", now, now.Add(time.Hour)); err != nil {
				b.Fatal(err)
			}
			if _, err := ss[(i+1)%3].RedeemPairingKey(hash(key), "inst-"+key, "n", hash(key+"t"), now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
