// Package park waits for sockets to become readable without a goroutine
// per socket: a Set is one epoll set (Linux) with one goroutine harvesting
// its events; a socket registers once (Reg.Register) and then arms a
// one-shot wait (Reg.Arm) each time it has nothing left to read, and its
// wake function runs when input (or the peer's close) arrives. The
// WebSocket layer parks idle sockets this way (fastpath/ws, Conn.Serve).
//
// The epoll set is separate from the Go runtime's own: the runtime keeps
// the fd registered edge-triggered for the reads a woken socket makes
// through net.Conn, and the kernel lets one fd sit in several sets. A
// registration is one-shot (EPOLLONESHOT) and level-triggered: arming with
// bytes already queued in the kernel reports them at once, so input that
// arrives while the owner is on its way out is never missed, and each
// arming yields at most one wake.
//
// epoll's per-event data cannot hold a Go pointer (the collector would not
// see it), so it holds a slot of the set's table and the slot's
// generation: an event harvested for a socket that has since ended and
// whose slot went to another socket is recognised as stale and dropped.
package park

import "errors"

// ErrUnsupported: this build has no sets (not Linux, or built with the
// nopark tag).
var ErrUnsupported = errors.New("park: waiting for readable sockets without goroutines needs Linux (epoll)")

// ErrClosed: the registration has been taken out of its set.
var ErrClosed = errors.New("park: registration closed")
