// Package signalroute is route.Signals for a cluster: the two sides of a
// mailbox's signal rendezvous meet on any nodes, over core NATS.
//
// Each joined side subscribes its own subject er.sig.<app>.<id>.<p|c>;
// what reaches it there is a frame from the other side (no header) or a
// control message (header Er-Sig):
//
//	replaced  a newer socket of this side joined: the older one, on any
//	          node, is told Replaced (close 4000)
//	up        the other side joined (sent to this side's subject by it)
//	here      answer to up: this side is connected
//	down      the other side left
//
// Every control message names its sender's join as "<unix ns> <node>
// <incarnation>"; the newer join of a side wins (ordered by that stamp,
// which needs the nodes' clocks to agree, as the push gateway's limits do).
// No Raft write is made per socket: the newer-wins rule needs only an
// order, and a node that dies is known from the peers' beats (the side
// left is told Peer(false) within 1.5 s). CLUSTER.md §4.1 proposed a KV
// lease per side; it would cost a quorum write per signal socket and
// refuse new sockets without a quorum, for no rule the stamps do not give.
//
// Frames between two sides on one node never touch NATS. A side that
// joins publishes up three times (at once, after 100 ms and after 500 ms)
// until it hears here: a subscription's interest reaches the other
// servers a moment after it is made, and two sides joining at once could
// otherwise both miss the other's up. Messages are handled by one
// dispatcher goroutine per node, which only queues onto sockets.
//
// Fencing: when this node learns the others may have judged it gone while
// it ran on (cluster.OnFenced: a stall, a cut link), the other sides of
// its sockets were told peer 0 and may have paired again elsewhere. Every
// side joined here closes as on a drain (1001), so that its client
// reconnects into a cluster that agrees; the normal Leave follows.
package signalroute

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/route"
	"edgerelay/store/cluster"
)

// Router is route.Signals over a cluster.
type Router struct {
	c    *cluster.Cluster
	nc   *nats.Conn
	msgs chan *nats.Msg
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	// sides are this node's joined sides by their subject (what a
	// message names, so that finding its side allocates nothing).
	sides map[string]*side
}

var _ route.Signals = (*Router)(nil)

// stamp orders the joins of one side: the newer wins.
type stamp struct {
	at        int64
	node, inc string
}

func (s stamp) String() string { return strconv.FormatInt(s.at, 10) + " " + s.node + " " + s.inc }

func (s stamp) newer(o stamp) bool {
	if s.at != o.at {
		return s.at > o.at
	}
	if s.node != o.node {
		return s.node > o.node
	}
	return s.inc > o.inc
}

func parseStamp(v string) (stamp, bool) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return stamp{}, false
	}
	at, err := strconv.ParseInt(f[0], 10, 64)
	return stamp{at: at, node: f[1], inc: f[2]}, err == nil
}

// peer is the other side as this side knows it: local (on this node) or
// remote (its join's stamp).
type peer struct {
	local  *side
	remote stamp
}

type side struct {
	r       *Router
	sock    route.SignalSocket
	me      stamp
	subject string // this side's
	other   string // the other side's
	sub     *nats.Subscription
	// peer and current change with the router's mu held; Send reads them
	// without it (the frame path takes no lock).
	peer    atomic.Pointer[peer]
	current atomic.Bool // still the side's socket on this node (not replaced, not left)
	once    sync.Once
}

// flushTimeout bounds a join's wait for its server.
const flushTimeout = 2 * time.Second

// dispatchQueue bounds the messages waiting for the dispatcher; past it
// NATS drops them for that subscription (frames are at most once).
const dispatchQueue = 8192

// New starts the router on c.
func New(c *cluster.Cluster) *Router {
	r := &Router{c: c, nc: c.Conn(), msgs: make(chan *nats.Msg, dispatchQueue), stop: make(chan struct{}), done: make(chan struct{}), sides: make(map[string]*side)}
	c.OnPeerGone(r.peerGone)
	c.OnFenced(r.fenced)
	go r.dispatch()
	return r
}

// Close stops the dispatcher.
func (r *Router) Close() error {
	close(r.stop)
	<-r.done
	return nil
}

func subject(name string, side int) (string, error) {
	app, id, ok := strings.Cut(name, "/")
	if !ok || !cluster.SubjectToken(app) || !cluster.SubjectToken(id) {
		return "", fmt.Errorf("signalroute: mailbox name %q is not subject-safe", name)
	}
	return "er.sig." + app + "." + id + "." + [2]string{"p", "c"}[side], nil
}

const (
	hdrSig  = "Er-Sig"
	hdrFrom = "Er-From"
)

// Join makes sock side of name on this node and tells the cluster.
func (r *Router) Join(ctx context.Context, name string, sideIdx int, sock route.SignalSocket) (route.SignalSide, error) {
	mine, err := subject(name, sideIdx)
	if err != nil {
		return nil, err
	}
	theirs, _ := subject(name, 1-sideIdx)
	s := &side{r: r, sock: sock, subject: mine, other: theirs,
		me: stamp{at: time.Now().UnixNano(), node: r.c.Node(), inc: r.c.Incarnation()}}
	s.current.Store(true)
	if s.sub, err = r.nc.ChanSubscribe(mine, r.msgs); err != nil {
		return nil, cluster.Fail("subscribe "+mine, err)
	}
	// The flush puts the interest at this node's server before anyone is
	// told the side joined.
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	err = r.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		_ = s.sub.Unsubscribe()
		return nil, cluster.Fail("flush "+mine, err)
	}
	r.mu.Lock()
	old := r.sides[mine]
	if old != nil {
		old.current.Store(false)
	}
	r.sides[mine] = s
	var localPeer *side
	if o := r.sides[theirs]; o != nil {
		localPeer = o
		s.peer.Store(&peer{local: o})
		o.peer.Store(&peer{local: s})
	}
	r.mu.Unlock()
	if old != nil {
		_ = old.sub.Unsubscribe()
		old.sock.Replaced()
	}
	// An older socket of this side on another node closes.
	r.control(mine, "replaced", s.me)
	if localPeer != nil {
		localPeer.sock.Peer(true)
		sock.Peer(true)
		return s, nil
	}
	r.control(theirs, "up", s.me)
	go s.repeatUp()
	return s, nil
}

// repeatUp sends up again until the other side answered or this side
// left (see the package comment).
func (s *side) repeatUp() {
	for _, wait := range []time.Duration{100 * time.Millisecond, 400 * time.Millisecond} {
		select {
		case <-time.After(wait):
		case <-s.r.stop:
			return
		}
		s.r.mu.Lock()
		again := s.current.Load() && s.peer.Load() == nil
		s.r.mu.Unlock()
		if !again {
			return
		}
		s.r.control(s.other, "up", s.me)
	}
}

func (r *Router) control(subject, kind string, from stamp) {
	m := nats.NewMsg(subject)
	m.Header.Set(hdrSig, kind)
	m.Header.Set(hdrFrom, from.String())
	_ = r.nc.PublishMsg(m) // at most once, like the frames
}

// Send forwards a frame to the other side: a direct call on this node,
// a publish to its subject on another, nothing when it is not connected.
func (s *side) Send(msg []byte) {
	p, current := s.peer.Load(), s.current.Load()
	switch {
	case !current || p == nil:
	case p.local != nil:
		p.local.sock.Frame(msg)
	default:
		_ = s.r.nc.Publish(s.other, msg)
	}
}

// Leave tells the other side, unless a newer socket replaced this one.
func (s *side) Leave() {
	s.once.Do(func() {
		r := s.r
		r.mu.Lock()
		wasCurrent := s.current.Swap(false)
		if r.sides[s.subject] == s {
			delete(r.sides, s.subject)
		}
		p := s.peer.Swap(nil)
		if p != nil && p.local != nil && wasCurrent {
			p.local.peer.Store(nil)
		}
		r.mu.Unlock()
		_ = s.sub.Unsubscribe()
		switch {
		case !wasCurrent || p == nil:
		case p.local != nil:
			p.local.sock.Peer(false)
		default:
			r.control(s.other, "down", s.me)
		}
	})
}

// CloseAll tells this node's sockets of name the mailbox is gone.
func (r *Router) CloseAll(name string) {
	var gone []*side
	r.mu.Lock()
	for i := range 2 {
		subj, err := subject(name, i)
		if err != nil {
			break
		}
		if s := r.sides[subj]; s != nil {
			s.current.Store(false)
			s.peer.Store(nil)
			delete(r.sides, subj)
			gone = append(gone, s)
		}
	}
	r.mu.Unlock()
	for _, s := range gone {
		_ = s.sub.Unsubscribe()
		s.sock.Erased()
	}
}

// peerGone: the other sides that lived on a gone node left.
func (r *Router) peerGone(node, inc string) {
	var left []*side
	r.mu.Lock()
	for _, s := range r.sides {
		if p := s.peer.Load(); p != nil && p.local == nil && p.remote.node == node && p.remote.inc == inc {
			s.peer.Store(nil)
			left = append(left, s)
		}
	}
	r.mu.Unlock()
	for _, s := range left {
		s.sock.Peer(false)
	}
}

// fenced closes every side joined here before the fence (see the package
// comment). It runs on the beat goroutine or NATS's, and only queues
// closes onto the sockets.
func (r *Router) fenced() {
	r.mu.Lock()
	held := make([]route.SignalSocket, 0, len(r.sides))
	for _, s := range r.sides {
		held = append(held, s.sock)
	}
	r.mu.Unlock()
	for _, sock := range held {
		sock.GoingAway() // 1001, as on a drain
	}
}

func (r *Router) dispatch() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case m := <-r.msgs:
			r.handle(m)
		}
	}
}

// handle is one message for a side of this node, found by its subject.
func (r *Router) handle(m *nats.Msg) {
	r.mu.Lock()
	s := r.sides[m.Subject]
	r.mu.Unlock()
	if s == nil {
		return
	}
	kind := m.Header.Get(hdrSig)
	if kind == "" { // a frame
		s.sock.Frame(m.Data)
		return
	}
	from, ok := parseStamp(m.Header.Get(hdrFrom))
	if !ok || from == s.me {
		return // our own (replaced goes to our own subject too)
	}
	var tell func()
	r.mu.Lock()
	switch kind {
	case "replaced":
		if from.newer(s.me) && s.current.Load() {
			s.current.Store(false)
			delete(r.sides, s.subject)
			if p := s.peer.Load(); p != nil && p.local != nil {
				p.local.peer.Store(nil) // the newer socket's up reaches it
			}
			s.peer.Store(nil)
			tell = func() { _ = s.sub.Unsubscribe(); s.sock.Replaced() }
		}
	case "up", "here":
		if p := s.peer.Load(); s.current.Load() && (p == nil || p.local == nil && from.newer(p.remote)) {
			s.peer.Store(&peer{remote: from})
			tell = func() {
				if kind == "up" {
					r.control(s.other, "here", s.me)
				}
				s.sock.Peer(true)
			}
		} else if kind == "up" && s.current.Load() && p != nil && p.local == nil && p.remote == from {
			tell = func() { r.control(s.other, "here", s.me) } // a repeated up: answer again
		}
	case "down":
		if p := s.peer.Load(); s.current.Load() && p != nil && p.local == nil && p.remote == from {
			s.peer.Store(nil)
			tell = func() { s.sock.Peer(false) }
		}
	}
	r.mu.Unlock()
	if tell != nil {
		tell()
	}
}
