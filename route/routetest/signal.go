// Package routetest holds the contract suites of package route's
// interfaces, run over the single node's implementation and a cluster's.
package routetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"edgerelay/route"
)

// Socket is a fake signal socket recording what the router told it.
type Socket struct {
	mu     sync.Mutex
	frames []string
	events []string // "peer 1", "peer 0", "replaced", "erased"
}

func (s *Socket) Frame(msg []byte) {
	s.mu.Lock()
	s.frames = append(s.frames, string(msg))
	s.mu.Unlock()
}

func (s *Socket) Peer(up bool) {
	s.mu.Lock()
	if up {
		s.events = append(s.events, "peer 1")
	} else {
		s.events = append(s.events, "peer 0")
	}
	s.mu.Unlock()
}

func (s *Socket) Replaced()  { s.event("replaced") }
func (s *Socket) Erased()    { s.event("erased") }
func (s *Socket) GoingAway() { s.event("going away") }

func (s *Socket) event(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

// Events and Frames copy what the socket was told so far.
func (s *Socket) Events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func (s *Socket) Frames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.frames)
}

// WaitEvents waits until the socket was told exactly want.
func (s *Socket) WaitEvents(t testing.TB, what string, want ...string) {
	t.Helper()
	Eventually(t, what, func() error {
		if got := s.Events(); !slices.Equal(got, want) {
			return fmt.Errorf("events %q, want %q", got, want)
		}
		return nil
	})
}

// Eventually polls f until it returns nil, for up to 5 s.
func Eventually(t testing.TB, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Signals runs the contract of route.Signals over hs, handles onto one
// rendezvous (a cluster: one per node; one node: the same router each
// time). Each case uses its own mailbox; side 0 joins through hs[0] and
// side 1 through hs[1 % len], the newer socket of a side through hs[2 %
// len].
func Signals(t *testing.T, hs []route.Signals) {
	ctx := context.Background()
	h := func(i int) route.Signals { return hs[i%len(hs)] }
	join := func(t *testing.T, i int, name string, side int, s *Socket) route.SignalSide {
		t.Helper()
		j, err := h(i).Join(ctx, name, side, s)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}

	t.Run("PairFramesInOrderAndLeave", func(t *testing.T) {
		name := "chat/pair0000000001"
		var p, c Socket
		ps := join(t, 0, name, 0, &p)
		if got := p.Events(); len(got) != 0 {
			t.Fatalf("a side alone was told %q", got)
		}
		ps.Send([]byte("dropped")) // nobody there
		cs := join(t, 1, name, 1, &c)
		p.WaitEvents(t, "primary told the companion came", "peer 1")
		c.WaitEvents(t, "companion told the primary is there", "peer 1")
		var want []string
		for i := range 200 {
			f := fmt.Sprintf("frame %d", i)
			want = append(want, f)
			ps.Send([]byte(f))
			cs.Send([]byte("back " + f))
		}
		Eventually(t, "frames both ways, in order", func() error {
			if got := c.Frames(); !slices.Equal(got, want) {
				return fmt.Errorf("companion got %d frames (%.60q…), want %d in order", len(got), got, len(want))
			}
			if got := p.Frames(); len(got) != len(want) || got[len(got)-1] != "back frame 199" {
				return fmt.Errorf("primary got %d frames, want %d", len(got), len(want))
			}
			return nil
		})
		cs.Leave()
		p.WaitEvents(t, "primary told the companion left", "peer 1", "peer 0")
		ps.Send([]byte("after the leave"))
		ps.Leave()
		time.Sleep(50 * time.Millisecond) // nothing to wait for: a frame that must not come
		if got := c.Frames(); len(got) != len(want) {
			t.Fatalf("a frame reached a side that left: %q", got[len(want):])
		}
		if got := c.Events(); !slices.Equal(got, []string{"peer 1"}) {
			t.Fatalf("the side that left was told %q after", got)
		}
	})

	t.Run("NewerSocketReplacesTheOlder", func(t *testing.T) {
		name := "chat/replace00000001"
		var p1, p2, c Socket
		p1s := join(t, 0, name, 0, &p1)
		cs := join(t, 1, name, 1, &c)
		c.WaitEvents(t, "companion paired", "peer 1")
		p1.WaitEvents(t, "first primary paired", "peer 1")
		p2s := join(t, 2, name, 0, &p2)
		p1.WaitEvents(t, "first primary replaced", "peer 1", "replaced")
		p2.WaitEvents(t, "second primary paired", "peer 1")
		c.WaitEvents(t, "companion told again", "peer 1", "peer 1")
		p1s.Leave() // the replaced socket's end tells nobody
		cs.Send([]byte("to the newer"))
		p2s.Send([]byte("from the newer"))
		Eventually(t, "frames between the newer primary and the companion", func() error {
			if got := p2.Frames(); !slices.Equal(got, []string{"to the newer"}) {
				return fmt.Errorf("newer primary got %q", got)
			}
			if got := c.Frames(); !slices.Equal(got, []string{"from the newer"}) {
				return fmt.Errorf("companion got %q", got)
			}
			return nil
		})
		if got := p1.Frames(); len(got) != 0 {
			t.Fatalf("the replaced socket got %q", got)
		}
		if got := c.Events(); !slices.Equal(got, []string{"peer 1", "peer 1"}) {
			t.Fatalf("the replaced socket's end told the companion: %q", got)
		}
		p2s.Leave()
		cs.Leave()
	})

	t.Run("CloseAllErasesBothSides", func(t *testing.T) {
		name := "chat/erase000000001"
		var p, c, other Socket
		ps := join(t, 0, name, 0, &p)
		cs := join(t, 1, name, 1, &c)
		os := join(t, 0, "chat/erase000000002", 0, &other)
		c.WaitEvents(t, "paired", "peer 1")
		p.WaitEvents(t, "paired", "peer 1")
		for _, r := range hs { // every node, as the store's OnGone does
			r.CloseAll(name)
		}
		p.WaitEvents(t, "primary erased", "peer 1", "erased")
		c.WaitEvents(t, "companion erased", "peer 1", "erased")
		if got := other.Events(); len(got) != 0 {
			t.Fatalf("another mailbox's socket was told %q", got)
		}
		ps.Leave()
		cs.Leave()
		os.Leave()
	})
}
