package pushkv

import (
	"crypto/sha256"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
)

// A registration that takes the slot after another one pointed it at its
// key, but before that key exists, finds nothing to delete: the earlier
// key must then delete itself, or two keys would hold one address.
func TestRegistrationOvertakenBeforeItsKeyExists(t *testing.T) {
	c := clustertest.Start(t, 2)
	gs := make([]*Gateway, 2)
	for i := range gs {
		g, err := New(clustertest.Context(t), c.Node(i), store.PushScopeShared)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		gs[i] = g
	}
	now := time.Now()
	reg := func(id string) store.PushKey {
		return store.PushKey{
			ID: id, Hash: sha256.Sum256([]byte(id)), Enabled: true, CreatedAt: now,
			Source: store.PushSourceSelf, RegisteredIP: "192.0.2.9", Mount: "fcm",
		}
	}
	late := reg("overtaken")
	gs[0].afterSlot = func() {
		gs[0].afterSlot = nil
		if old, err := gs[1].RegisterKey(reg("overtaker")); err != nil || old != nil {
			t.Errorf("overtaking registration: %+v %v (its predecessor's key did not exist yet)", old, err)
		}
	}
	if _, err := gs[0].RegisterKey(late); err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		// Node 1 learns of the deletion through its watch: a revocation
		// reaches every node within a second, not at once; catching the
		// mirror up to the bucket is what a list does.
		g.catchUp()
		if _, ok := g.KeyByID("overtaken"); ok {
			t.Fatalf("node %d: the overtaken registration's key survives next to the overtaker's", i)
		}
		if k, ok := g.KeyByID("overtaker"); !ok || !k.Enabled {
			t.Fatalf("node %d: the overtaker's key %+v %v", i, k, ok)
		}
	}
}
