package ws

import (
	"context"
	"sync"
)

// Group tracks the open sockets of one service so that a drain can close
// them all with 1001 and wait for their writers to flush. The sockets are
// linked through their Conns (groupPrev, groupNext), not kept in a map: an
// idle socket costs its Group nothing but those two pointers, which fit
// in the Conn's size class. A Conn is in one Group at most.
type Group struct {
	mu       sync.Mutex
	head     *Conn // the last added; the list runs through groupNext
	n        int
	draining bool
}

// Add registers c. It returns false once the group is draining; the caller
// then closes c with 1001 itself. Adding c again is a no-op; adding it to
// a second Group panics.
func (g *Group) Add(c *Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return false
	}
	switch c.group {
	case g:
		return true
	case nil:
	default:
		panic("ws: Conn added to a second Group")
	}
	c.group, c.groupPrev, c.groupNext = g, nil, g.head
	if g.head != nil {
		g.head.groupPrev = c
	}
	g.head = c
	g.n++
	return true
}

// Remove forgets c; a no-op when c is not in g.
func (g *Group) Remove(c *Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.group != g {
		return
	}
	if c.groupPrev != nil {
		c.groupPrev.groupNext = c.groupNext
	} else {
		g.head = c.groupNext
	}
	if c.groupNext != nil {
		c.groupNext.groupPrev = c.groupPrev
	}
	c.group, c.groupPrev, c.groupNext = nil, nil, nil
	g.n--
}

// Len is the number of open sockets.
func (g *Group) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Drain refuses new sockets, closes every open one with code and waits
// until their writers have finished or ctx ends.
func (g *Group) Drain(ctx context.Context, code int) error {
	g.mu.Lock()
	g.draining = true
	conns := make([]*Conn, 0, g.n)
	for c := g.head; c != nil; c = c.groupNext {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, c := range conns {
		c.Close(code, "server shutting down")
	}
	for _, c := range conns {
		select {
		case <-c.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
