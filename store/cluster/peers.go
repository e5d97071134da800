package cluster

import (
	"context"
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
// judged gone by silence that beats again is alive again.
//
// Fencing. The routers act on a peer's going (phones closed, clients
// detached, leases taken over), so a node the others judged gone while it
// ran on holds sockets whose other ends were told it died. It fences
// itself when it learns so: the routers close its live sockets (which
// reconnect, and meet a consistent cluster). It learns in one of two
// ways, whichever comes first:
//   - its own beats did not come back for peerSilence and then do (its
//     link was down, or the process stalled): the others heard nothing
//     either;
//   - a peer that judged it gone hears it again and says so
//     (er.node.judged). A node that judged that peer gone as well (a cut
//     between them, both sides acted) does not fence for it: both sides
//     already closed what crossed the cut.
//
// A node that never heard a peer it finds in er_nodes at start takes it
// for heard at start with livenessTTL to beat: a node that dies before its
// first beat arrives (the servers' routes form after the node starts) is
// reported gone like any other instead of never.
const (
	peerBeat      = 250 * time.Millisecond
	peerSilence   = 1500 * time.Millisecond
	beatSubject   = "er.node.beat"
	byeSubject    = "er.node.bye"
	judgedSubject = "er.node.judged"
	peerSubjects  = "er.node.*"
	// judgedKept bounds how long a peer judged gone is remembered (a
	// node that never comes back); a cut that heals later is told no more.
	judgedKept = 10 * time.Minute
	// ownFresh: a node judges others only while its own beats come back
	// within it. A node that stalled (SIGSTOP, a long pause) has heard
	// nobody meanwhile, itself included: on waking it must not judge the
	// others by a silence that was its own, or it would take their notice
	// that they judged it gone for a cut both sides acted on, and not
	// fence (seen in CI: woken 1.5 s after its last own beat, it judged
	// them before hearing their queued beats).
	ownFresh = peerSilence / 2
)

// peer is one (node, incarnation) heard from.
type peer struct{ node, incarnation string }

// peers is the node's view of the others.
type peers struct {
	mu      sync.Mutex
	seen    map[peer]time.Time // last beat of each live peer
	seeded  map[peer]struct{}  // peers in seen from er_nodes at start, no beat heard yet
	current map[string]string  // node -> its latest incarnation
	dead    map[string]string  // node -> its latest incarnation, once it said goodbye
	ownSeen time.Time          // our own last beat heard back
	started time.Time
	gone    []func(node, incarnation string)
	sub     *nats.Subscription
	judged  map[peer]time.Time // peers this node judged gone by silence, and when
	back    map[peer]time.Time // peers judged gone that beat again, and when
	fenced  time.Time          // when this node last fenced itself
	fencers []func()
	tell    func(subject string, data []byte) error // publishes a notice (core NATS)
}

func newPeers(started time.Time, tell func(subject string, data []byte) error) *peers {
	return &peers{
		seen: make(map[peer]time.Time), seeded: make(map[peer]struct{}), current: make(map[string]string), dead: make(map[string]string),
		judged: make(map[peer]time.Time), back: make(map[peer]time.Time), started: started, tell: tell,
	}
}

// startPeers subscribes to the beats and starts this node's own (cluster
// nodes only; a command-line client beats nothing).
func (c *Cluster) startPeers() error {
	p := newPeers(time.Now(), c.nc.Publish)
	c.peers = p
	c.seedPeers(p)
	// One subscription for beats and goodbyes: NATS keeps one
	// publisher's messages in order within a subscription, so a beat sent
	// just before a goodbye never arrives after it (with two, it did, and
	// brought the leaving node back for a moment).
	sub, err := c.nc.Subscribe(peerSubjects, func(m *nats.Msg) {
		if m.Subject == judgedSubject {
			c.toldJudged(string(m.Data), time.Now())
			return
		}
		c.heard(m.Subject == byeSubject, string(m.Data))
	})
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
		// Our own beats were lost for peerSilence: the others may
		// have judged us gone meanwhile.
		var fence []func()
		if !p.ownSeen.IsZero() && now.Sub(p.ownSeen) >= peerSilence {
			fence = p.fence(now)
		}
		p.ownSeen = now
		p.mu.Unlock()
		c.runFence(fence, "its own beats were lost for "+peerSilence.String())
		return
	}
	me := peer{node, inc}
	_, wasJudged := p.judged[me]
	switch prev, known := p.current[node]; {
	case known && prev == inc && p.dead[node] == inc:
		// It said goodbye: a late beat does not bring it back.
	case bye:
		delete(p.seen, me)
		delete(p.seeded, me)
		delete(p.judged, me)
		p.current[node], p.dead[node] = inc, inc
		goneNow = append(goneNow, me) // also when never heard: someone may hold its state
	default:
		if known && prev != inc && p.dead[node] != prev {
			delete(p.seen, peer{node, prev}) // it restarted
			delete(p.seeded, peer{node, prev})
			delete(p.judged, peer{node, prev})
			goneNow = append(goneNow, peer{node, prev})
		}
		p.current[node] = inc
		delete(p.dead, node)
		p.seen[me] = now
		delete(p.seeded, me)
	}
	if wasJudged && !bye {
		delete(p.judged, me)
		p.back[me] = now
	}
	fns := p.gone
	p.mu.Unlock()
	c.notifyGone(fns, goneNow)
	if wasJudged && !bye {
		// It ran on while we judged it gone: tell it, so it fences
		// itself. A lost notice is covered by its own-beats rule in
		// the common case (it was the one cut off).
		_ = p.tell(judgedSubject, []byte(node+" "+inc+" "+c.node+" "+c.incarnation))
	}
}

// toldJudged handles a notice "<node> <incarnation> <by node> <by
// incarnation>": by judged node gone by silence and hears it again. This
// node fences itself when it is the one named, unless it judged by gone
// too in the same cut (then both sides closed what crossed it).
func (c *Cluster) toldJudged(data string, now time.Time) {
	f := strings.Fields(data)
	if len(f) != 4 || f[0] != c.node || f[1] != c.incarnation {
		return
	}
	by := peer{f[2], f[3]}
	p := c.peers
	p.mu.Lock()
	_, judging := p.judged[by]
	backAt, wasBack := p.back[by]
	var fence []func()
	if !judging && (!wasBack || now.Sub(backAt) >= 2*peerSilence) {
		fence = p.fence(now)
	}
	p.mu.Unlock()
	c.runFence(fence, "node "+by.node+" judged it gone")
}

// fence returns the fencers to run, or none when this node fenced itself
// within peerSilence (both rules fire for one cut). p.mu is held.
func (p *peers) fence(now time.Time) []func() {
	if !p.fenced.IsZero() && now.Sub(p.fenced) < peerSilence {
		return nil
	}
	p.fenced = now
	return p.fencers
}

func (c *Cluster) runFence(fns []func(), why string) {
	if len(fns) == 0 {
		return
	}
	c.log.Warn("cluster node fences itself: the other nodes may have judged it gone, so its live sockets close and reconnect", "node", c.node, "reason", why)
	for _, fn := range fns {
		fn()
	}
}

// OnFenced registers fn, called when this node learns the other nodes may
// have judged it gone while it ran on (see fencing above): fn closes the
// router's live sockets as on a drain, so their clients reconnect. It is
// called from the beat goroutine or NATS's and must not block.
func (c *Cluster) OnFenced(fn func()) {
	p := c.peers
	if p == nil {
		return
	}
	p.mu.Lock()
	p.fencers = append(p.fencers, fn)
	p.mu.Unlock()
}

// seedPeers takes every node with a live record in er_nodes for heard at
// start with livenessTTL to beat (see above). A store that does not
// answer seeds nothing: those nodes count as alive for the start's grace
// (PeerAlive) as before.
func (c *Cluster) seedPeers(p *peers) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lister, err := c.nodes.ListKeys(ctx)
	if err != nil {
		return
	}
	for node := range lister.Keys() {
		if node == c.node {
			continue
		}
		if e, err := c.nodes.Get(ctx, node); err == nil {
			p.seed(node, string(e.Value()))
		}
	}
}

// seed takes node's incarnation for heard at start with livenessTTL to
// beat, unless a beat of it came already.
func (p *peers) seed(node, inc string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, known := p.current[node]; !known {
		p.current[node] = inc
		p.seen[peer{node, inc}] = p.started.Add(livenessTTL - peerSilence) // judged gone at started + livenessTTL
		p.seeded[peer{node, inc}] = struct{}{}
	}
}

// judge declares gone the peers silent for peerSilence, unless this node
// has not heard itself for ownFresh.
func (c *Cluster) judge(now time.Time) {
	p := c.peers
	var goneNow []peer
	p.mu.Lock()
	if now.Sub(p.ownSeen) < ownFresh {
		for k, at := range p.seen {
			if now.Sub(at) >= peerSilence {
				// Gone, but not for good: a node cut off for a while
				// (its link, a stall) that beats again is alive again.
				// What the others did meanwhile (phones closed, clients
				// detached) stands; it is not told (see the package's
				// notes for the next step: fencing itself).
				delete(p.seen, k)
				delete(p.seeded, k)
				p.judged[k] = now
				goneNow = append(goneNow, k)
			}
		}
	}
	for k, at := range p.judged {
		if now.Sub(at) >= judgedKept {
			delete(p.judged, k)
		}
	}
	for k, at := range p.back {
		if now.Sub(at) >= livenessTTL {
			delete(p.back, k)
		}
	}
	fns := p.gone
	p.mu.Unlock()
	c.notifyGone(fns, goneNow)
}

// notifyGone logs each peer judged gone (a line an operator reads beside
// the sockets it closed) and tells the routers.
func (c *Cluster) notifyGone(fns []func(node, incarnation string), gone []peer) {
	for _, g := range gone {
		c.log.Info("cluster peer gone: its sides, channels and clients are let go here", "peer", g.node, "incarnation", g.incarnation)
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
