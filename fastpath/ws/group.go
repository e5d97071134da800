package ws

import (
	"context"
	"sync"
)

// Group tracks the open sockets of one service so that a drain can close
// them all with 1001 and wait for their writers to flush.
type Group struct {
	mu       sync.Mutex
	conns    map[*Conn]struct{}
	draining bool
}

// Add registers c. It returns false once the group is draining; the caller
// then closes c with 1001 itself.
func (g *Group) Add(c *Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return false
	}
	if g.conns == nil {
		g.conns = make(map[*Conn]struct{})
	}
	g.conns[c] = struct{}{}
	return true
}

// Remove forgets c.
func (g *Group) Remove(c *Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// Len is the number of open sockets.
func (g *Group) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

// Drain refuses new sockets, closes every open one with code and waits
// until their writers have finished or ctx ends.
func (g *Group) Drain(ctx context.Context, code int) error {
	g.mu.Lock()
	g.draining = true
	conns := make([]*Conn, 0, len(g.conns))
	for c := range g.conns {
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
