package cluster

import (
	"sync"
	"testing"
	"time"
)

// TestPeersSilenceRule: a peer is gone peerSilence after its last beat
// (not a moment before), once; a restarted peer's old incarnation is gone
// at its first new beat; a goodbye is gone at once; and a node that has
// not heard its own beat for peerSilence judges nobody.
func TestPeersSilenceRule(t *testing.T) {
	c := &Cluster{node: "a", incarnation: "a1", peers: &peers{seen: map[peer]time.Time{}, current: map[string]string{}, dead: map[string]string{}, started: time.Now().Add(-time.Hour)}}
	var mu sync.Mutex
	var gone []string
	c.OnPeerGone(func(node, inc string) {
		mu.Lock()
		gone = append(gone, node+"/"+inc)
		mu.Unlock()
	})
	took := func(want ...string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(gone) != len(want) {
			t.Fatalf("gone %v, want %v", gone, want)
		}
		for i := range want {
			if gone[i] != want[i] {
				t.Fatalf("gone %v, want %v", gone, want)
			}
		}
	}
	c.heard(false, "a a1") // our own beat, heard back
	c.heard(false, "b b1")
	c.heard(false, "c c1")
	t0 := c.peers.seen[peer{"b", "b1"}]
	c.peers.ownSeen = t0
	c.judge(t0.Add(peerSilence - time.Millisecond))
	took()
	if !c.PeerAlive("b", "b1") {
		t.Fatal("b is alive within peerSilence")
	}
	// Our own beats stopped too: nobody is judged.
	c.judge(t0.Add(peerSilence))
	took()
	c.peers.ownSeen = t0.Add(peerSilence)
	c.peers.seen[peer{"c", "c1"}] = t0.Add(peerSilence)
	c.judge(t0.Add(peerSilence))
	took("b/b1")
	c.judge(t0.Add(2*peerSilence - time.Millisecond))
	took("b/b1") // once
	if c.PeerAlive("b", "b1") || !c.PeerAlive("c", "c1") {
		t.Fatal("b should be gone and c alive")
	}
	// b was only cut off: it beats again and is alive again, and a second
	// silence makes it gone a second time.
	c.heard(false, "b b1")
	if !c.PeerAlive("b", "b1") {
		t.Fatal("a peer gone by silence that beats again is not alive again")
	}
	bt := c.peers.seen[peer{"b", "b1"}]
	c.peers.ownSeen = bt.Add(peerSilence)
	c.peers.seen[peer{"c", "c1"}] = bt.Add(peerSilence)
	c.judge(bt.Add(peerSilence))
	took("b/b1", "b/b1")
	c.heard(false, "c c2") // c restarted
	took("b/b1", "b/b1", "c/c1")
	if c.PeerAlive("c", "c1") || !c.PeerAlive("c", "c2") {
		t.Fatal("c's old incarnation should be gone, its new one alive")
	}
	c.heard(true, "c c2")
	took("b/b1", "b/b1", "c/c1", "c/c2")
	c.heard(false, "c c2") // a beat sent before the goodbye, arriving after it
	c.heard(true, "c c2")
	took("b/b1", "b/b1", "c/c1", "c/c2")
	if c.PeerAlive("c", "c2") {
		t.Fatal("a late beat brought a node that said goodbye back")
	}
	c.heard(true, "e e1") // never heard, leaves: someone may hold its state
	took("b/b1", "b/b1", "c/c1", "c/c2", "e/e1")
	if !c.PeerAlive("a", "a1") || c.PeerAlive("a", "a0") {
		t.Fatal("this node's own incarnation only is alive")
	}
	// A node never heard of, after the start's grace: not alive.
	if c.PeerAlive("d", "d1") {
		t.Fatal("a node never heard of counts as alive after the grace")
	}
	c.peers.started = time.Now().Add(-livenessTTL + time.Second)
	if !c.PeerAlive("d", "d1") {
		t.Fatal("within the start's grace every node counts as alive")
	}
}
