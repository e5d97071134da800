package pushkv

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
)

// twoNodes opens the shared scope's key store on each node of a new
// two-node cluster.
func twoNodes(t *testing.T) []*Gateway {
	t.Helper()
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
	return gs
}

// A registration that takes the slot after another one pointed it at its
// key, but before that key exists, finds nothing to delete: the earlier
// key must then delete itself, or two keys would hold one address.
func TestRegistrationOvertakenBeforeItsKeyExists(t *testing.T) {
	gs := twoNodes(t)
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

// A node whose key watch lags (a loaded node's has lagged more than a
// second) still finds a key created through another node a moment ago:
// the lookup's catch-up reads the revisions the watch has not delivered
// from the stream's leader, including a revision since replaced (read as
// gone) and a delete; a revocation, which no lookup misses, reaches it by
// the watch supervisor's next check. The watch's own progress is not
// advanced by those reads, so its supervisor still sees it stalled.
func TestCatchUpReadsWhatAStalledWatchLacks(t *testing.T) {
	gs := twoNodes(t)
	writer, lagging := gs[0], gs[1]
	lagging.watchHold.Lock()
	held := true
	release := func() {
		if held {
			held = false
			lagging.watchHold.Unlock()
		}
	}
	t.Cleanup(release) // before the gateways close: cleanups run last first

	now := time.Now()
	newKey := func(id string) store.PushKey {
		return store.PushKey{ID: id, Hash: sha256.Sum256([]byte(id)), Enabled: true, CreatedAt: now, Source: store.PushSourceAdmin}
	}
	fresh, disabled, revoked := newKey("fresh"), newKey("disabled"), newKey("revoked")
	for _, k := range []store.PushKey{fresh, disabled, revoked} {
		if err := writer.AddKey(k); err != nil {
			t.Fatal(err)
		}
	}
	// disabled's first revision is replaced: the leader no longer has it.
	if err := writer.SetKeyEnabled(disabled.ID, false); err != nil {
		t.Fatal(err)
	}
	if err := writer.DeleteKey(revoked.ID); err != nil {
		t.Fatal(err)
	}

	if k, ok := lagging.KeyByHash(fresh.Hash); !ok || k.ID != fresh.ID || !k.Enabled {
		t.Fatalf("a key created through another node, looked up while this node's watch lags: %+v %v", k, ok)
	}
	if k, ok := lagging.byIDLocal(disabled.ID); !ok || k.Enabled {
		t.Fatalf("a key disabled after its creation, read by the same catch-up: %+v %v, want it disabled", k, ok)
	}
	if _, ok := lagging.byIDLocal(revoked.ID); ok {
		t.Fatal("a key created and revoked, read by the same catch-up, is in the mirror")
	}
	lagging.mu.RLock()
	known, watchAt := lagging.known, lagging.watchAt
	lagging.mu.RUnlock()
	if watchAt >= known {
		t.Fatalf("the catch-up's reads moved the watch's own progress (%d, known %d): a stalled watch would go unnoticed", watchAt, known)
	}

	// A revocation is not a miss (the mirror holds the key), so no lookup
	// reads it: the watch supervisor's check reads what the mirror lacks,
	// while the watch is still held.
	if err := writer.DeleteKey(fresh.ID); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	for {
		if _, ok := lagging.byIDLocal(fresh.ID); !ok {
			t.Logf("a revocation reached the node with a stalled watch after %v", time.Since(revokedAt))
			break
		}
		if time.Since(revokedAt) > 10*watchCheck {
			t.Fatalf("a revocation has not reached the node with a stalled watch after %v", time.Since(revokedAt))
		}
		time.Sleep(time.Millisecond)
	}
	lagging.mu.RLock()
	known = lagging.known
	lagging.mu.RUnlock()

	// Released, the watch delivers the same records again, to no effect.
	release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lagging.mu.RLock()
		watchAt = lagging.watchAt
		lagging.mu.RUnlock()
		if watchAt >= known {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the released watch reached %d, want %d", watchAt, known)
		}
		time.Sleep(time.Millisecond)
	}
	if k, ok := lagging.byIDLocal(disabled.ID); !ok || k.Enabled {
		t.Fatalf("after the watch's replay: %+v %v", k, ok)
	}
	for _, id := range []string{revoked.ID, fresh.ID} {
		if _, ok := lagging.byIDLocal(id); ok {
			t.Fatalf("after the watch's replay the revoked key %s is back", id)
		}
	}
}

// A catch-up reads a gap of maxDirect revisions itself, the most it
// takes on. (One revision more is left to the watch, but that cannot be
// shown without a race: the watch's health check, every watchCheck, reads
// whatever part of a gap is in the bucket when it looks, so a gap of
// maxDirect+1 written over more than an instant is read in parts.)
func TestCatchUpReadsAGapOfMaxDirect(t *testing.T) {
	gs := twoNodes(t)
	writer, lagging := gs[0], gs[1]
	lagging.watchHold.Lock()
	t.Cleanup(lagging.watchHold.Unlock) // before the gateways close
	now := time.Now()
	var k store.PushKey
	for i := range maxDirect {
		id := fmt.Sprintf("gap-%d", i)
		k = store.PushKey{ID: id, Hash: sha256.Sum256([]byte(id)), Enabled: true, CreatedAt: now, Source: store.PushSourceAdmin}
		if err := writer.AddKey(k); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := lagging.KeyByHash(k.Hash); !ok || got.ID != k.ID {
		t.Fatalf("the last of %d keys written behind a held watch: %+v %v", maxDirect, got, ok)
	}
	for i := range maxDirect {
		if _, ok := lagging.byIDLocal(fmt.Sprintf("gap-%d", i)); !ok {
			t.Fatalf("key %d of the gap is not in the mirror", i)
		}
	}
}
