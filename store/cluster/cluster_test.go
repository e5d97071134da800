package cluster_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/clustertest"
)

// waitFor polls f until it returns nil or d passes.
func waitFor(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClusterSharedState(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ctx := clustertest.Context(t)

	t.Run("a write through one node reads back through every other at once", func(t *testing.T) {
		kv0, _ := nodes.Node(0).Bucket(ctx, cluster.BucketConfig{Name: "t_raw"})
		kv2, _ := nodes.Node(2).Bucket(ctx, cluster.BucketConfig{Name: "t_raw"})
		for i := range 200 {
			want := []byte{byte(i)}
			if _, err := kv0.Put(ctx, "k", want); err != nil {
				t.Fatal(err)
			}
			e, err := kv2.Get(ctx, "k")
			if err != nil || !bytes.Equal(e.Value(), want) {
				t.Fatalf("write %d through node 0, read through node 2: %v %v", i, e, err)
			}
		}
	})

	t.Run("compare-and-set updates from three nodes lose nothing", func(t *testing.T) {
		var wg sync.WaitGroup
		const each = 30
		for i := range 3 {
			kv, err := nodes.Node(i).Bucket(ctx, cluster.BucketConfig{Name: "t_cas"})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for range each {
					if _, err := cluster.Update(ctx, kv, "n", func(cur []byte, _ uint64) ([]byte, error) {
						return append(cur, 'x'), nil
					}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		kv, _ := nodes.Node(1).Bucket(ctx, cluster.BucketConfig{Name: "t_cas"})
		e, err := kv.Get(ctx, "n")
		if err != nil || len(e.Value()) != 3*each {
			t.Fatalf("after %d increments: %d (%v)", 3*each, len(e.Value()), err)
		}
	})

	t.Run("settings agree or the node refuses naming the setting", func(t *testing.T) {
		s := []cluster.Setting{{Name: "RELAY_TURN_SECRET", Value: "s3cret"}, {Name: "RELAY_MAX_STORED", Value: "4096"}}
		for i := range 3 {
			if err := nodes.Node(i).Agree(ctx, s); err != nil {
				t.Fatalf("node %d with the same settings: %v", i, err)
			}
		}
		err := nodes.Node(1).Agree(ctx, []cluster.Setting{{Name: "RELAY_TURN_SECRET", Value: "s3cret"}, {Name: "RELAY_MAX_STORED", Value: "4097"}})
		if err == nil || !strings.Contains(err.Error(), "RELAY_MAX_STORED differs") {
			t.Fatalf("differing RELAY_MAX_STORED: %v", err)
		}
		if strings.Contains(err.Error(), "4096") || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("error reveals a value: %v", err)
		}
		if err := nodes.Node(2).ForgetSetting(ctx, "RELAY_MAX_STORED"); err != nil {
			t.Fatal(err)
		}
		if err := nodes.Node(1).Agree(ctx, []cluster.Setting{{Name: "RELAY_MAX_STORED", Value: "4097"}}); err != nil {
			t.Fatalf("after forget-setting the new value is recorded: %v", err)
		}
	})

	t.Run("a shared secret is the first node's; a differing local one is refused", func(t *testing.T) {
		var made atomic.Int32
		gen := func() ([]byte, error) { made.Add(1); return []byte("generated"), nil }
		v0, err := nodes.Node(0).SharedSecret(ctx, "agent_key", nil, gen)
		if err != nil || string(v0) != "generated" {
			t.Fatalf("first node: %q %v", v0, err)
		}
		v1, err := nodes.Node(1).SharedSecret(ctx, "agent_key", nil, gen)
		if err != nil || string(v1) != "generated" || made.Load() != 1 {
			t.Fatalf("second node adopts: %q %v (generated %d times)", v1, err, made.Load())
		}
		if _, err := nodes.Node(2).SharedSecret(ctx, "agent_key", []byte("mine"), gen); !errors.Is(err, cluster.ErrSecretDiffers) {
			t.Fatalf("a node with its own key: %v", err)
		}
		if v, err := nodes.Node(2).SharedSecret(ctx, "agent_key", []byte("generated"), gen); err != nil || string(v) != "generated" {
			t.Fatalf("a node with the same key: %q %v", v, err)
		}
	})

	t.Run("quorum lost: unavailable, and back by itself", func(t *testing.T) {
		if err := nodes.Node(0).Unavailable(); err != nil {
			t.Fatalf("healthy: %v", err)
		}
		nodes.Stop(1)
		nodes.Stop(2)
		waitFor(t, 10*time.Second, "node 0 unavailable without quorum", func() error {
			if err := nodes.Node(0).Unavailable(); !errors.Is(err, store.ErrUnavailable) {
				return errors.New("still available")
			}
			return nil
		})
		nodes.Restart(1)
		waitFor(t, 15*time.Second, "node 0 available again", nodes.Node(0).Unavailable)
	})
}

func TestClusterNodeLiveness(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ctx := clustertest.Context(t)
	n0 := nodes.Node(0)
	inc2 := nodes.Node(2).Incarnation()
	if ok, err := n0.Alive(ctx, "n2", inc2); err != nil || !ok {
		t.Fatalf("running node 2: alive %v, %v", ok, err)
	}
	if ok, _ := n0.Alive(ctx, "n2", "0000"); ok {
		t.Fatal("another incarnation of node 2 counts as alive")
	}
	if ok, _ := n0.Alive(ctx, "n9", "0000"); ok {
		t.Fatal("a node that never ran counts as alive")
	}
	start := time.Now()
	nodes.Stop(2)
	waitFor(t, 20*time.Second, "node 2 dead after it stopped", func() error {
		ok, err := n0.Alive(clustertest.Context(t), "n2", inc2)
		if err != nil || ok {
			return fmt.Errorf("alive %v, %v", ok, err)
		}
		return nil
	})
	t.Logf("node 2 counted dead %s after it stopped", time.Since(start).Round(100*time.Millisecond))
	n2 := nodes.Restart(2)
	if n2.Incarnation() == inc2 {
		t.Fatal("a restart kept its incarnation")
	}
	if ok, err := n0.Alive(clustertest.Context(t), "n2", n2.Incarnation()); err != nil || !ok {
		t.Fatalf("restarted node 2: alive %v, %v", ok, err)
	}
}

// A command-line client of the cluster is no node: it works on the shared
// state but leaves no liveness record.
func TestClusterClientKeepsNoLivenessRecord(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ctx := clustertest.Context(t)
	addr := "nats://" + nodes.Node(0).EmbeddedAddr()
	cli, err := cluster.Open(clustertest.OpenContext(t), cluster.Config{NodeName: "edgerelay-cli-test", URLs: []string{addr}, Replicas: 3, Client: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.Agree(ctx, []cluster.Setting{{Name: "RELAY_APPS", Value: "notes"}}); err != nil {
		t.Fatalf("a client writes the shared state: %v", err)
	}
	kv, err := nodes.Node(0).Bucket(ctx, cluster.BucketConfig{Name: "er_nodes", MaxAge: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "edgerelay-cli-test"); !cluster.Absent(err) {
		t.Fatalf("the client left a liveness record: %v", err)
	}
	if _, err := kv.Get(ctx, "n0"); err != nil {
		t.Fatalf("the node's own liveness record: %v", err)
	}
}
