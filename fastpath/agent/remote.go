package agent

import (
	"edgerelay/fastpath/ndjson"
	"edgerelay/fastpath/ws"
	"edgerelay/route"
)

// remoteLink is a link as the route sees it: lines from clients on other
// nodes, detaches it synthesizes for clients whose node died, and the
// replacement by a newer link elsewhere. Nothing here blocks: the route
// calls it from its NATS callbacks.
type remoteLink struct{ l *link }

var (
	_ route.AgentLink   = remoteLink{}
	_ route.AgentClient = remoteClient{}
)

// Offer implements route.AgentLink: it queues a client's line from
// another node if it fits within the bound, as a client here (the reserve
// above it stays for the relay's own frames: acks, detaches, which would
// otherwise find it full and drop the link). When the queue has no room,
// the client to close is the one whose lines hold the most of it (see
// share): the line's sender, or another client, in which case the line is
// queued into collisionRoom if it fits there (else its sender is closed
// too, as the next biggest it cannot wait). A link that is closing drops
// the line (nil: nothing for the route to do).
func (r remoteLink) Offer(line []byte) []byte {
	l := r.l
	var sess []byte
	if f, err := ndjson.Scan(line); err == nil && f.Session.Present() && !f.Session.Escaped {
		sess = f.Session.Raw(line)
	}
	n := len(line) + 1
	s := &l.share
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := l.q.Put(line, true, l.h.nowait); err == nil {
		end := s.counted(n)
		if sess != nil {
			s.addLocked(sess, n, end)
		}
		l.h.m.toInstance.Inc()
		return nil
	}
	// With nowait a full queue is ErrClosed too: l.closed, set before the
	// queue closes, tells the two apart.
	if l.closed.Load() || sess == nil {
		l.h.m.dropOffline.Inc()
		return nil
	}
	s.forgetLocked(l.q.Queued())
	top, _ := s.mostLocked()
	if top == nil || top.session == string(sess) {
		l.h.m.dropOffline.Inc()
		return sess
	}
	if l.q.Queued()+n > l.h.cfg.LinkQueue+collisionRoom || l.q.TryPut(line, true) != nil {
		l.h.m.dropOffline.Inc()
		return sess
	}
	s.addLocked(sess, n, s.counted(n))
	l.h.m.toInstance.Inc()
	return []byte(top.session)
}

// collisionRoom is how far past the link's bound the lines of clients on
// other nodes colliding with the one holding the most of the queue may go:
// half of the queue's reserve (sendq's default, 64 KiB), the other half
// staying for the relay's own frames, the acp.detach of the client closed
// among them.
const collisionRoom = 32 << 10

// Detached tells the runtime that a client on a node that died is gone.
func (r remoteLink) Detached(session []byte) {
	l := r.l
	l.send(appendDetach(nil, l.in.id, session))
}

// Replaced closes the link: a newer link for its instance is on another
// node.
func (r remoteLink) Replaced() { r.l.close(endReplaced) }

// Fenced implements route.AgentLink: it closes the link as a drain does (what is queued is flushed): the
// other nodes may have judged this one gone and told the link's clients
// so; the runtime redials into a consistent cluster.
func (r remoteLink) Fenced() { r.l.close(endFenced) }

// Fenced implements route.AgentClient: it closes the client with 1001, as a drain does (see
// remoteLink.Fenced). One fenced before its socket is live is closed as
// soon as it is (serveClient).
func (r remoteClient) Fenced() {
	a := r.a
	a.fenced.Store(true)
	if a.live.Load() {
		a.conn.Close(ws.CloseGoingAway, fencedReason)
	}
}

// fencedReason is the close reason of a client closed by a fence.
const fencedReason = "relay fenced: reconnect"

// Overflowed implements route.AgentClient: it closes the client with 1013 and detaches it: its line did
// not fit the queue of its instance's link on another node.
func (r remoteClient) Overflowed() {
	a := r.a
	if !a.live.Load() || a.detached.Load() {
		return
	}
	a.conn.CloseOverflow()
	if r.h.detach(a, nil) {
		r.h.m.slowClientLink.Inc()
	}
}

// remoteClient is an attachment as the route sees it.
type remoteClient struct {
	h *Handler
	a *attachment
}

// Deliver implements route.AgentClient: it queues a line of the instance's link on another node for the
// client, as a line from a link on this node: within its own queue and the
// instance's bound (InstanceQueue) on this node's clients of it, past which
// a client is closed with 1013 and detached. Several subscriptions may
// call it at once; makeRoom and detach take that.
func (r remoteClient) Deliver(line []byte) {
	a := r.a
	if !a.live.Load() || a.detached.Load() {
		return
	}
	r.h.queueFor(a, line, nil)
}
