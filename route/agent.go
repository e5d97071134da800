package route

import (
	"context"
	"errors"
)

// ErrAgentFull: all of an instance's attachment slots are taken, on
// whichever nodes (the handler answers 429).
var ErrAgentFull = errors.New("route: too many attachments to this instance")

// Agent carries the agent relay's lines between an instance's link and
// its clients when the two are on different nodes. The handler routes
// between a link and clients it holds itself; it tells the route about
// every link and attachment it holds, and hands it a line only when the
// other end is not here. Lines are the bytes that arrived, without their
// line feed, up to ndjson.MaxLine; implementations never change them.
type Agent interface {
	// Link makes this node's link l the holder of instance inst: an older
	// link anywhere is replaced (its AgentLink.Replaced is called on its
	// node). From then on lines from clients on other nodes reach
	// l.Offer, until the hold's Release.
	Link(ctx context.Context, inst string, l AgentLink) (AgentLinkHold, error)
	// Attach takes one of inst's max attachment slots for session, a
	// relay-minted attachment id, whether or not the instance is online;
	// ErrAgentFull when all max are taken. Lines from the instance's link
	// on another node reach c.Deliver until the attachment's Leave.
	Attach(ctx context.Context, inst, session string, max int, c AgentClient) (AgentAttachment, error)
	// Status is instance inst over every node: whether a link holds it
	// and how many clients are attached. known is false when the route
	// knows no more than the handler (a single node).
	Status(ctx context.Context, inst string) (online bool, attachments int, known bool, err error)
}

// AgentLink is a link as the route sees it. Its methods are called from
// the route's goroutines and must not block.
type AgentLink interface {
	// Offer queues a spliced line from a client on another node within
	// the link's bound, without waiting. It returns nil when the line was
	// queued (or dropped: the link is closing, or the line names no
	// session); otherwise the session of the client the route is to close
	// (AgentClient.Overflowed): the one holding the most of the link's
	// queue, which is the line's own sender unless another client's lines
	// hold more (the line itself was then queued). A client here waits for
	// room, but the route's reader must never wait for a runtime that
	// stopped reading. The session returned is valid until Offer returns.
	Offer(line []byte) (overflowed []byte)
	// Detached tells the runtime that session's client has gone: its
	// node died without saying so.
	Detached(session []byte)
	// Replaced closes the link: a newer one holds the instance.
	Replaced()
	// Fenced closes the link as a drain does (what is queued is flushed):
	// this node learnt the others may have judged it gone and told the
	// link's clients so; the runtime redials into a consistent cluster.
	Fenced()
}

// AgentLinkHold is a link's hold on its instance.
type AgentLinkHold interface {
	// ToSession sends a line of the link to the client holding session
	// on another node, where it is dropped when nobody holds it; false
	// when it cannot be sent at all (no other node, or a session that is
	// not a relay-minted attachment id).
	ToSession(session, line []byte) bool
	// Release gives the instance up: clients elsewhere see it offline
	// (unless a newer link holds it).
	Release()
}

// AgentClient is an attached client as the route sees it. Its methods
// are called from the route's goroutines and must not block.
type AgentClient interface {
	// Deliver queues a line of the instance's link on another node
	// (without its line feed) for the client, within the client's bounds.
	Deliver(line []byte)
	// Overflowed closes the client with 1013 and detaches it: its line
	// did not fit the queue of its instance's link on another node.
	Overflowed()
	// Fenced closes the client with 1001, as a drain does (see
	// AgentLink.Fenced).
	Fenced()
}

// AgentAttachment is a client's slot on its instance.
type AgentAttachment interface {
	// ToInstance sends a spliced line to the instance's link on another
	// node; false when no node holds a link for it (the instance is
	// offline).
	ToInstance(line []byte) bool
	// Leave frees the slot and sends detach (the acp.detach line) to the
	// instance's link if another node holds it. It does not block.
	Leave(detach []byte)
}
