package cluster_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store/cluster/clustertest"
)

var errNotYet = errors.New("not yet")

// TestPeersSeeANodeLeaveAndReturn: the other nodes hear a node that stops
// within peerSilence (a stop says goodbye; a kill -9 is the silence rule,
// tested in peers_internal_test.go and through the binary), and its
// restart as a new incarnation.
func TestPeersSeeANodeLeaveAndReturn(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	a, b := nodes.Node(0), nodes.Node(2)
	node, inc := b.Node(), b.Incarnation()
	// Until node 2's beats reach node 0 (the routes carry node 0's
	// interest to node 2's server first), node 0 knows nothing of it.
	clustertest.WaitBeat(t, a.Conn(), node+" "+inc, 5*time.Second)
	if !a.PeerAlive(node, inc) {
		t.Fatal("node 0 does not count node 2 alive")
	}
	var mu sync.Mutex
	var gone []string
	a.OnPeerGone(func(n, i string) {
		mu.Lock()
		gone = append(gone, n+"/"+i)
		mu.Unlock()
	})
	stopped := time.Now()
	nodes.Stop(2)
	waitFor(t, 2*time.Second, "node 0 hears node 2 leave", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(gone) != 1 || gone[0] != node+"/"+inc {
			return errNotYet
		}
		return nil
	})
	t.Logf("gone after %v", time.Since(stopped))
	if a.PeerAlive(node, inc) {
		t.Fatal("a stopped node is alive")
	}
	b = nodes.Restart(2)
	waitFor(t, 10*time.Second, "node 0 hears node 2's new incarnation", func() error {
		if !a.PeerAlive(node, b.Incarnation()) {
			return errNotYet
		}
		return nil
	})
	if a.PeerAlive(node, inc) {
		t.Fatal("the old incarnation is alive again")
	}
}

// TestPeersReportANodeNeverHeard: a node that starts while another's
// record is in er_nodes, and never hears that node beat (it died before
// its beats reached the new node), reports it gone at the end of the
// start's grace, as it would a node it heard (before, it never did).
func TestPeersReportANodeNeverHeard(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	ctx := clustertest.Context(t)
	js, err := jetstream.New(nodes.Node(0).Conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "er_nodes")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "ghost", []byte("g1")); err != nil {
		t.Fatal(err)
	}
	nodes.Stop(1)
	before := time.Now()
	b := nodes.Restart(1)
	started := time.Now() // its grace began between before and now
	gone := make(chan string, 8)
	b.OnPeerGone(func(n, i string) { gone <- n + "/" + i })
	if !b.PeerAlive("ghost", "g1") {
		t.Fatal("a node in er_nodes is not alive in the start's grace")
	}
	select {
	case g := <-gone:
		if g != "ghost/g1" {
			t.Fatalf("gone %s, want ghost/g1", g)
		}
		// Gone at the end of the start's grace (livenessTTL, 10 s),
		// not before and not much later.
		if early, late := time.Since(before), time.Since(started); early < 10*time.Second || late > 13*time.Second {
			t.Fatalf("reported %v after the restart began and %v after it returned, want 10 s after the node's start", early, late)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the node never heard is never reported gone")
	}
	if b.PeerAlive("ghost", "g1") {
		t.Fatal("a node reported gone is alive")
	}
}
