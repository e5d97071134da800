//go:build linux && !nopark

package park

import (
	"net"
	"testing"
	"time"
)

const wait = 5 * time.Second

// tcpPair is a connected loopback pair: the side to park and its peer.
func tcpPair(t *testing.T) (parked *net.TCPConn, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = peer.Close() })
	return c.(*net.TCPConn), peer
}

// The set's goroutine, which harvests with non-blocking epoll_wait calls
// and waits in the runtime's netpoller in between (Set), wakes an armed
// socket once per arming when input arrives, again after a re-arm, also
// for input already queued when it is armed, and stops on Close.
func TestSetWakesOncePerArmAndCloses(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	c, peer := tcpPair(t)
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	woken := make(chan struct{}, 8)
	var r Reg
	if !r.Register(p, rc, func() { woken <- struct{}{} }) {
		t.Fatal("Register refused a live socket")
	}
	expectWake := func(what string) {
		t.Helper()
		select {
		case <-woken:
		case <-time.After(wait):
			t.Fatalf("no wake %s", what)
		}
	}
	buf := make([]byte, 8)
	drain := func() {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}

	if err := r.Arm(); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	expectWake("for input after arming")
	drain()

	// Input that arrives while the socket is not armed wakes at the next
	// arming, at once.
	if _, err := peer.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := r.Arm(); err != nil {
		t.Fatal(err)
	}
	expectWake("for input queued before the arming")
	// One-shot: the byte still unread does not wake it again until re-armed.
	select {
	case <-woken:
		t.Fatal("woken twice for one arming")
	default:
	}
	drain()

	// Many sockets' input in one harvest wakes each.
	const more = 40
	pairs := make([]net.Conn, more)
	regs := make([]Reg, more)
	wokenBy := make(chan int, more)
	for i := range more {
		s, pe := tcpPair(t)
		src, err := s.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		if !regs[i].Register(p, src, func() { wokenBy <- i }) {
			t.Fatal("Register refused")
		}
		if err := regs[i].Arm(); err != nil {
			t.Fatal(err)
		}
		pairs[i] = pe
	}
	for _, pe := range pairs {
		if _, err := pe.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int]bool{}
	for len(seen) < more {
		select {
		case i := <-wokenBy:
			if seen[i] {
				t.Fatalf("socket %d woken twice for one arming", i)
			}
			seen[i] = true
		case <-time.After(wait):
			t.Fatalf("%d of %d sockets woken", len(seen), more)
		}
	}
	for i := range regs {
		regs[i].Unregister()
	}
	if got := p.Registered(); got != 1 {
		t.Fatalf("Registered = %d after 40 of 41 unregistered, want 1", got)
	}

	r.Unregister()
	if err := r.Arm(); err != ErrClosed {
		t.Fatalf("Arm after Unregister: %v, want ErrClosed", err)
	}
	done := make(chan struct{})
	go func() { _ = p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("Close did not stop the set's goroutine")
	}
}

// TestInlineBudgetPerHarvest: the first inlineBudget wakes of a harvest
// may do their work on the set's goroutine, the rest of it may not, and
// the next harvest has the budget again. A first socket's wake holds the
// set's goroutine while 40 others become readable, so that they come in
// one harvest.
func TestInlineBudgetPerHarvest(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	register := func(wake func()) (*Reg, net.Conn) {
		c, peer := tcpPair(t)
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		r := new(Reg)
		if !r.Register(p, rc, wake) {
			t.Fatal("Register refused")
		}
		if err := r.Arm(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Unregister)
		return r, peer
	}
	held, release := make(chan bool, 1), make(chan struct{})
	_, firstPeer := register(func() {
		held <- p.TakeInline()
		<-release
	})
	const n = 40
	inline := make(chan bool, n)
	regs, peers := make([]*Reg, n), make([]net.Conn, n)
	for i := range peers {
		regs[i], peers[i] = register(func() { inline <- p.TakeInline() })
	}
	if _, err := firstPeer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-held:
		if !ok {
			t.Fatal("the first wake of a harvest may not work inline")
		}
	case <-time.After(wait):
		t.Fatal("the first socket was not woken")
	}
	for _, pe := range peers {
		if _, err := pe.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	next := func() bool {
		t.Helper()
		select {
		case ok := <-inline:
			return ok
		case <-time.After(wait):
			t.Fatal("a socket was not woken")
			return false
		}
	}
	for i := range n {
		if ok := next(); ok != (i < inlineBudget) {
			t.Fatalf("wake %d of a harvest of %d: inline %v, want the first %d only", i, n, ok, inlineBudget)
		}
	}
	// The next harvest has its budget again.
	if err := regs[n-1].Arm(); err != nil {
		t.Fatal(err)
	}
	if !next() {
		t.Fatal("the next harvest's first wake may not work inline")
	}
}
