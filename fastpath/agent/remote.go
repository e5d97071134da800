package agent

import (
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
// another node if it fits, and reports false when the queue had no room:
// the route then closes that client (a client here would wait, but the
// route's reader must never wait for a runtime that stopped reading). A link that is closing drops the line
// (true: nothing for the route to do). Within the bound, as a client
// here: the reserve above it stays for the relay's own frames (acks,
// detaches), which would otherwise find it full and drop the link.
func (r remoteLink) Offer(line []byte) bool {
	l := r.l
	if err := l.q.Put(line, true, l.h.nowait); err != nil {
		// With nowait a full queue is ErrClosed too: l.closed, set before
		// the queue closes, tells the two apart.
		l.h.m.dropOffline.Inc()
		return l.closed.Load()
	}
	l.h.m.toInstance.Inc()
	return true
}

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
	r.h.m.slowClientLink.Inc()
	a.conn.CloseOverflow()
	r.h.detach(a, nil)
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
