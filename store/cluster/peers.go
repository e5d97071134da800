package cluster

import (
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Peers: fast knowledge of which nodes run, for live routing (a phone on
// B whose computer's node A died must hear 1001 within 2 s, and er_nodes'
// liveness records expire only after livenessTTL). Every node publishes a
// beat on core NATS every peerBeat naming itself and its incarnation, and
// hears everyone's. A peer is gone when no beat of it came for
// peerSilence, when it beats with another incarnation (it restarted), or
// when it says goodbye (Close). Core NATS carries the beats without
// JetStream, so a lost quorum does not make peers look dead.
//
// A node that hears nothing at all (its own connection is down, or its
// server is cut off from the others) cannot tell dead peers from a cut
// of its own, so it judges nobody while its own beats do not come back:
// it never closes every socket because its own link hiccuped. A peer
// judged gone by silence that beats again is alive again; the routers
// have acted on its going by then (closed, detached), and it is not told.
// Next step (issue 16): a node that did not hear itself for peerSilence
// knows the others may have judged it gone, and should fence itself
// (close its live sockets, which reconnect) when its beats come back.
const (
	peerBeat     = 250 * time.Millisecond
	peerSilence  = 1500 * time.Millisecond
	beatSubject  = "er.node.beat"
	byeSubject   = "er.node.bye"
	peerSubjects = "er.node.*"
)

// peer is one (node, incarnation) heard from.
type peer struct{ node, incarnation string }

// peers is the node's view of the others.
type peers struct {
	mu      sync.Mutex
	seen    map[peer]time.Time // last beat of each live peer
	current map[string]string  // node -> its latest incarnation
	dead    map[string]string  // node -> its latest incarnation, once it said goodbye
	ownSeen time.Time          // our own last beat heard back
	started time.Time
	gone    []func(node, incarnation string)
	sub     *nats.Subscription
}

// startPeers subscribes to the beats and starts this node's own (cluster
// nodes only; a command-line client beats nothing).
func (c *Cluster) startPeers() error {
	p := &peers{seen: make(map[peer]time.Time), current: make(map[string]string), dead: make(map[string]string), started: time.Now()}
	c.peers = p
	// One subscription for beats and goodbyes: NATS keeps one
	// publisher's messages in order within a subscription, so a beat sent
	// just before a goodbye never arrives after it (with two, it did, and
	// brought the leaving node back for a moment).
	sub, err := c.nc.Subscribe(peerSubjects, func(m *nats.Msg) { c.heard(m.Subject == byeSubject, string(m.Data)) })
	if err != nil {
		return Fail("subscribe "+peerSubjects, err)
	}
	p.sub = sub
	c.bg.Add(1)
	go c.beat()
	return nil
}

func (c *Cluster) beat() {
	defer c.bg.Done()
	t := time.NewTicker(peerBeat)
	defer t.Stop()
	me := []byte(c.node + " " + c.incarnation)
	for {
		select {
		case <-c.stop:
			_ = c.nc.Publish(byeSubject, me)
			_ = c.nc.Flush()
			return
		case <-t.C:
		}
		_ = c.nc.Publish(beatSubject, me) // a lost beat is what the silence rule is for
		c.judge(time.Now())
	}
}

// heard notes a beat (or a goodbye) "<node> <incarnation>".
func (c *Cluster) heard(bye bool, data string) {
	node, inc, ok := strings.Cut(data, " ")
	if !ok || node == "" || inc == "" {
		return
	}
	p := c.peers
	now := time.Now()
	var goneNow []peer
	p.mu.Lock()
	if node == c.node && inc == c.incarnation {
		p.ownSeen = now
		p.mu.Unlock()
		return
	}
	me := peer{node, inc}
	switch prev, known := p.current[node]; {
	case known && prev == inc && p.dead[node] == inc:
		// It said goodbye: a late beat does not bring it back.
	case bye:
		delete(p.seen, me)
		p.current[node], p.dead[node] = inc, inc
		goneNow = append(goneNow, me) // also when never heard: someone may hold its state
	default:
		if known && prev != inc && p.dead[node] != prev {
			delete(p.seen, peer{node, prev}) // it restarted
			goneNow = append(goneNow, peer{node, prev})
		}
		p.current[node] = inc
		delete(p.dead, node)
		p.seen[me] = now
	}
	fns := p.gone
	p.mu.Unlock()
	notifyGone(fns, goneNow)
}

// judge declares gone the peers silent for peerSilence, unless this node
// has not heard itself for that long either.
func (c *Cluster) judge(now time.Time) {
	p := c.peers
	var goneNow []peer
	p.mu.Lock()
	if now.Sub(p.ownSeen) < peerSilence {
		for k, at := range p.seen {
			if now.Sub(at) >= peerSilence {
				// Gone, but not for good: a node cut off for a while
				// (its link, a stall) that beats again is alive again.
				// What the others did meanwhile (phones closed, clients
				// detached) stands; it is not told (see the package's
				// notes for the next step: fencing itself).
				delete(p.seen, k)
				goneNow = append(goneNow, k)
			}
		}
	}
	fns := p.gone
	p.mu.Unlock()
	notifyGone(fns, goneNow)
}

func notifyGone(fns []func(node, incarnation string), gone []peer) {
	for _, g := range gone {
		for _, fn := range fns {
			fn(g.node, g.incarnation)
		}
	}
}

// PeerAlive reports whether node runs incarnation as far as the beats
// tell: true for this node's own, and for a peer heard within
// peerSilence (or while this node hears nothing at all, itself
// included: see above). A node that started less than livenessTTL ago
// may not have heard every peer yet (a busy box delays the first beats
// past peerSilence: seen in CI) and takes a node it never heard for
// alive; after that a node never heard is gone. It costs no I/O.
func (c *Cluster) PeerAlive(node, incarnation string) bool {
	if node == c.node {
		return incarnation == c.incarnation
	}
	p := c.peers
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, live := p.seen[peer{node, incarnation}]; live {
		return true
	}
	if cur, ok := p.current[node]; ok && (cur != incarnation || p.dead[node] == incarnation) {
		return false // it restarted, or left
	}
	return time.Since(p.started) < livenessTTL
}

// OnPeerGone registers fn, called once for each (node, incarnation) that
// stops beating, restarts or leaves, from the beat goroutine or NATS's
// (fn must not block).
func (c *Cluster) OnPeerGone(fn func(node, incarnation string)) {
	p := c.peers
	if p == nil {
		return
	}
	p.mu.Lock()
	p.gone = append(p.gone, fn)
	p.mu.Unlock()
}
