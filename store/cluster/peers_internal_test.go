package cluster

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPeersSilenceRule: a peer is gone peerSilence after its last beat
// (not a moment before), once; a restarted peer's old incarnation is gone
// at its first new beat; a goodbye is gone at once; and a node that has
// not heard its own beat for peerSilence judges nobody.
func TestPeersSilenceRule(t *testing.T) {
	c := &Cluster{node: "a", incarnation: "a1", log: slog.New(slog.DiscardHandler), peers: newPeers(time.Now().Add(-time.Hour), discard)}
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

func discard(string, []byte) error { return nil }

// fencing is a node "a" whose fences and notices are counted.
type fencing struct {
	c       *Cluster
	fences  atomic.Int32
	notices []string
}

func newFencing() *fencing {
	f := &fencing{}
	tell := func(subject string, data []byte) error {
		f.notices = append(f.notices, subject+" "+string(data))
		return nil
	}
	f.c = &Cluster{node: "a", incarnation: "a1", log: slog.New(slog.DiscardHandler), peers: newPeers(time.Now().Add(-time.Hour), tell)}
	f.c.OnFenced(func() { f.fences.Add(1) })
	return f
}

func (f *fencing) fenced(t *testing.T, want int32) {
	t.Helper()
	if got := f.fences.Load(); got != want {
		t.Fatalf("fenced %d times, want %d", got, want)
	}
}

// TestPeersFenceOnOwnSilence: a node whose own beats were lost for
// peerSilence (its link was down, or it stalled) fences itself once when
// they come back, not for a shorter loss, and once for one cut.
func TestPeersFenceOnOwnSilence(t *testing.T) {
	f := newFencing()
	p := f.c.peers
	f.c.heard(false, "a a1") // the first beat heard back is no return
	f.fenced(t, 0)
	p.ownSeen = time.Now().Add(-peerSilence + 100*time.Millisecond)
	f.c.heard(false, "a a1")
	f.fenced(t, 0)
	p.ownSeen = time.Now().Add(-peerSilence)
	f.c.heard(false, "a a1")
	f.fenced(t, 1)
	// The peer's notice for the same cut does not fence it twice.
	f.c.toldJudged("a a1 b b1", time.Now())
	f.fenced(t, 1)
	// A later cut fences again.
	p.fenced = time.Now().Add(-peerSilence)
	p.ownSeen = time.Now().Add(-2 * peerSilence)
	f.c.heard(false, "a a1")
	f.fenced(t, 2)
}

// TestPeersFenceWhenTold: a peer that judged this node gone tells it when
// it hears it again, and this node fences, unless it judged that peer
// gone too (both sides of the cut acted); notices for another node or
// incarnation are ignored.
func TestPeersFenceWhenTold(t *testing.T) {
	f := newFencing()
	p := f.c.peers
	now := time.Now()
	f.c.toldJudged("a a0 b b1", now) // an old incarnation of ours
	f.c.toldJudged("c c1 b b1", now)
	f.c.toldJudged("a a1 b", now) // malformed
	f.fenced(t, 0)
	f.c.toldJudged("a a1 b b1", now)
	f.fenced(t, 1)

	// A cut between a and c: a judges c gone, and hears it again.
	f.c.heard(false, "c c1")
	p.ownSeen = now
	p.seen[peer{"c", "c1"}] = now.Add(-peerSilence)
	f.c.judge(now)
	p.fenced = time.Time{}
	f.c.toldJudged("a a1 c c1", now) // c's notice before its beat
	f.fenced(t, 1)
	if len(f.notices) != 0 {
		t.Fatalf("notices %v before c beat again", f.notices)
	}
	f.c.heard(false, "c c1")
	if want := "er.node.judged c c1 a a1"; len(f.notices) != 1 || f.notices[0] != want {
		t.Fatalf("notices %v, want [%s]", f.notices, want)
	}
	f.c.heard(false, "c c1") // told once per return
	if len(f.notices) != 1 {
		t.Fatalf("notices %v, want one", f.notices)
	}
	f.c.toldJudged("a a1 c c1", time.Now()) // c's notice after its beat
	f.fenced(t, 1)
	// Long after c's return, a notice from c is a new cut that only c saw.
	f.c.toldJudged("a a1 c c1", time.Now().Add(2*peerSilence))
	f.fenced(t, 2)
}

// TestPeersSeededNodeGoesAtGrace: a node found in er_nodes at start but
// never heard is reported gone livenessTTL after the start, not before; a
// node heard before seeding keeps its beats' clock.
func TestPeersSeededNodeGoesAtGrace(t *testing.T) {
	start := time.Now()
	c := &Cluster{node: "a", incarnation: "a1", log: slog.New(slog.DiscardHandler), peers: newPeers(start, discard)}
	var gone []string
	c.OnPeerGone(func(node, inc string) { gone = append(gone, node+"/"+inc) })
	c.heard(false, "c c1")
	c.peers.seed("b", "b1")
	c.peers.seed("c", "c0") // its beat came first: c1 stands
	c.peers.ownSeen = start.Add(livenessTTL)
	if !c.PeerAlive("b", "b1") {
		t.Fatal("a seeded node is not alive at start")
	}
	// The peers metric counts the node heard, not the one only seeded
	// (an operator, and a test, read it as "this node hears them").
	if n := c.livePeers(); n != 1 {
		t.Fatalf("%v peers counted with one heard and one seeded", n)
	}
	c.heard(false, "b b1")
	if n := c.livePeers(); n != 2 {
		t.Fatalf("%v peers counted once the seeded one beat", n)
	}
	c.peers.seen[peer{"b", "b1"}] = start.Add(livenessTTL - peerSilence) // b's beat is as old as its seed
	c.peers.seen[peer{"c", "c1"}] = start.Add(livenessTTL)               // c beats on
	c.judge(start.Add(livenessTTL - time.Millisecond))
	if len(gone) != 0 {
		t.Fatalf("gone %v before the grace ended", gone)
	}
	c.judge(start.Add(livenessTTL))
	if len(gone) != 1 || gone[0] != "b/b1" {
		t.Fatalf("gone %v, want [b/b1]", gone)
	}
}

// TestPeersStalledNodeFencesOnWaking: a node that stalled (its own beats
// and everyone's unheard) wakes with every peer's last beat old; it must
// not judge them by its own silence, so that their notice (they judged it
// gone) fences it, even when its own beats' gap fell just short of
// peerSilence.
func TestPeersStalledNodeFencesOnWaking(t *testing.T) {
	f := newFencing()
	p := f.c.peers
	f.c.heard(false, "b b1")
	woke := time.Now()
	p.ownSeen = woke.Add(-peerSilence + 50*time.Millisecond) // just short of the own-gap rule
	p.seen[peer{"b", "b1"}] = woke.Add(-peerSilence)
	f.c.judge(woke)
	if !f.c.PeerAlive("b", "b1") {
		t.Fatal("a node waking from a stall judged its peer by its own silence")
	}
	f.c.heard(false, "a a1")
	f.fenced(t, 0)
	f.c.heard(false, "b b1")
	f.c.toldJudged("a a1 b b1", time.Now())
	f.fenced(t, 1)
}
