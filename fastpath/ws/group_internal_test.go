package ws

import (
	"context"
	"io"
	"net"
	"testing"
)

// The Group's list through the Conns: removing from its middle, head and
// tail leaves the others, a second Add and a Remove of a Conn not in the
// Group change nothing, and a drain closes exactly those still in it.
func TestGroupListThroughTheConns(t *testing.T) {
	var g, other Group
	conns := make([]*Conn, 5)
	for i := range conns {
		server, client := net.Pipe()
		t.Cleanup(func() { _ = client.Close() })
		go func() { _, _ = io.Copy(io.Discard, client) }() // takes the close frames
		conns[i] = newConn(server, NewSettings(Options{}))
		if !g.Add(conns[i]) {
			t.Fatal("Add refused before the drain")
		}
	}
	stray, strayClient := net.Pipe()
	defer strayClient.Close()
	outsider := newConn(stray, NewSettings(Options{}))
	defer outsider.Abort()

	if !g.Add(conns[0]) || g.Len() != 5 {
		t.Fatalf("a second Add: Len %d, expected 5", g.Len())
	}
	g.Remove(outsider)
	other.Remove(conns[1])
	g.Remove(conns[2]) // middle
	g.Remove(conns[4]) // head (the last added)
	g.Remove(conns[0]) // tail
	g.Remove(conns[0]) // again
	if g.Len() != 2 {
		t.Fatalf("Len %d after three removals of five, expected 2", g.Len())
	}
	var listed []*Conn
	for c := g.head; c != nil; c = c.groupNext {
		listed = append(listed, c)
	}
	if len(listed) != 2 || listed[0] != conns[3] || listed[1] != conns[1] {
		t.Fatalf("the list holds %v, expected conns 3 and 1", listed)
	}
	if !other.Add(conns[2]) {
		t.Fatal("a removed Conn could not join another Group")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("adding a Conn to a second Group did not panic")
			}
		}()
		g.Add(conns[2])
	}()

	if err := g.Drain(context.Background(), CloseGoingAway); err != nil {
		t.Fatal(err)
	}
	for i, c := range conns {
		want := 0
		if i == 1 || i == 3 {
			want = CloseGoingAway
		}
		if got := c.CloseCode(); got != want {
			t.Errorf("conn %d: close code %d, expected %d", i, got, want)
		}
	}
	if g.Add(outsider) {
		t.Fatal("Add accepted a Conn while draining")
	}
}
