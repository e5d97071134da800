package netlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// wait bounds every "this should happen" in these tests; things that work
// happen in microseconds, so it is only reached on failure.
const wait = 5 * time.Second

func TestMaxConns(t *testing.T) {
	h := start(t, Limits{MaxConns: 2}, nil)

	a := h.expectAccepted(h.dial("127.0.0.1"))
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.2")) // total is total, whoever asks
	if got := h.l.Open(); got != 2 {
		t.Fatalf("Open() = %d, want 2", got)
	}
	h.expectCounts(map[string]int{ReasonTotal: 2})

	a.Close()
	if got := h.l.Open(); got != 1 {
		t.Fatalf("Open() after a close = %d, want 1", got)
	}
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))
	h.expectCounts(map[string]int{ReasonTotal: 3})
}

func TestMaxConnsPerIP(t *testing.T) {
	h := start(t, Limits{MaxConnsPerIP: 2}, nil)

	a1 := h.expectAccepted(h.dial("127.0.0.1"))
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))
	b1 := h.expectAccepted(h.dial("127.0.0.2")) // another client is not affected
	h.expectAccepted(h.dial("127.0.0.2"))
	h.expectRefused(h.dial("127.0.0.2"))
	h.expectCounts(map[string]int{ReasonPerIP: 2})
	if n := h.trackedIPs(); n != 2 {
		t.Fatalf("tracking %d IPs, want 2", n)
	}

	a1.Close()
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))
	h.expectCounts(map[string]int{ReasonPerIP: 3})

	// Closing everything from an IP forgets the IP.
	for _, c := range h.acceptedFrom("127.0.0.1") {
		c.Close()
	}
	if n := h.trackedIPs(); n != 1 {
		t.Fatalf("tracking %d IPs after 127.0.0.1 left, want 1", n)
	}
	b1.Close()
	for _, c := range h.acceptedFrom("127.0.0.2") {
		c.Close()
	}
	if n := h.trackedIPs(); n != 0 {
		t.Fatalf("tracking %d IPs with no connection open, want 0", n)
	}
	if got := h.l.Open(); got != 0 {
		t.Fatalf("Open() = %d, want 0", got)
	}
}

func TestAcceptRate(t *testing.T) {
	clock := newFakeClock()
	h := start(t, Limits{AcceptRate: 2, AcceptBurst: 3}, func(l *Listener) { l.now = clock.Now })

	// A full bucket takes a burst of 3, then refuses.
	for range 3 {
		h.expectAccepted(h.dial("127.0.0.1"))
	}
	h.expectRefused(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.2")) // the rate is the listener's, not per IP
	h.expectCounts(map[string]int{ReasonRate: 2})

	// Half a second at 2/s refills one token.
	clock.Advance(500 * time.Millisecond)
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))

	// A long pause refills up to the burst and no further.
	clock.Advance(time.Hour)
	for range 3 {
		h.expectAccepted(h.dial("127.0.0.1"))
	}
	h.expectRefused(h.dial("127.0.0.1"))
	h.expectCounts(map[string]int{ReasonRate: 4})
}

func TestAcceptRateDefaultBurst(t *testing.T) {
	clock := newFakeClock()
	h := start(t, Limits{AcceptRate: 0.5}, func(l *Listener) { l.now = clock.Now })
	h.expectAccepted(h.dial("127.0.0.1")) // burst is max(1, ceil(0.5)) = 1
	h.expectRefused(h.dial("127.0.0.1"))
	clock.Advance(2 * time.Second)
	h.expectAccepted(h.dial("127.0.0.1"))
}

// A connection refused by a cap must not use up an accept-rate token, or a
// client stuck at its per-IP cap would starve everyone else.
func TestCapRefusalKeepsRateTokens(t *testing.T) {
	clock := newFakeClock()
	h := start(t, Limits{MaxConnsPerIP: 1, AcceptRate: 1, AcceptBurst: 2}, func(l *Listener) { l.now = clock.Now })
	h.expectAccepted(h.dial("127.0.0.1"))
	for range 5 {
		h.expectRefused(h.dial("127.0.0.1"))
	}
	h.expectAccepted(h.dial("127.0.0.2"))
	h.expectCounts(map[string]int{ReasonPerIP: 5})
}

func TestCloseReleasesOnce(t *testing.T) {
	h := start(t, Limits{MaxConns: 1, MaxConnsPerIP: 1}, nil)
	c := h.expectAccepted(h.dial("127.0.0.1"))

	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
	c.Close()
	if got := h.l.Open(); got != 0 {
		t.Fatalf("Open() after repeated Close = %d, want 0", got)
	}
	if n := h.trackedIPs(); n != 0 {
		t.Fatalf("tracking %d IPs, want 0", n)
	}

	// Exactly one place was freed: one connection fits, the next does not.
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.2"))
	if got := h.l.Open(); got != 1 {
		t.Fatalf("Open() = %d, want 1", got)
	}
}

func TestNilCountersAndUnlimited(t *testing.T) {
	h := start(t, Limits{MaxConns: 1}, func(l *Listener) { l.counters = nil })
	h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))

	u := start(t, Limits{}, nil)
	for range 20 {
		u.expectAccepted(u.dial("127.0.0.1"))
	}
	if got := u.l.Open(); got != 20 {
		t.Fatalf("Open() = %d, want 20", got)
	}
	if u.l.perIP != nil {
		t.Fatal("per-IP map kept without a per-IP limit")
	}
}

func TestListenerCloseKeepsConnsCounted(t *testing.T) {
	h := start(t, Limits{MaxConns: 5}, nil)
	c := h.expectAccepted(h.dial("127.0.0.1"))
	if err := h.l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if got := h.l.Open(); got != 1 {
		t.Fatalf("Open() = %d, want 1", got)
	}
	c.Close()
	if got := h.l.Open(); got != 0 {
		t.Fatalf("Open() = %d, want 0", got)
	}
}

// io.Copy between two limited connections goes through ReadFrom with the
// wrappers removed; the bytes must arrive all the same.
func TestCopyBetweenConns(t *testing.T) {
	h := start(t, Limits{MaxConns: 10}, nil)
	clientA := h.dial("127.0.0.1")
	a := h.expectAccepted(clientA)
	clientB := h.dial("127.0.0.2")
	b := h.expectAccepted(clientB)

	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(b, a)
		b.(interface{ NetConn() net.Conn }).NetConn().(*net.TCPConn).CloseWrite()
		done <- err
	}()
	msg := strings.Repeat("relay ", 10000)
	if _, err := io.WriteString(clientA, msg); err != nil {
		t.Fatal(err)
	}
	clientA.(*net.TCPConn).CloseWrite()
	clientB.SetReadDeadline(time.Now().Add(wait))
	got, err := io.ReadAll(clientB)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != msg {
		t.Fatalf("copied %d bytes, want %d", len(got), len(msg))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRemoteIP(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string // "" for no IP
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 1}, "127.0.0.2"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 1}, "10.0.0.1"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::1"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}, "2001:db8::1"},
		{&net.UnixAddr{Name: "/tmp/sock", Net: "unix"}, ""},
		{nil, ""},
	} {
		ip, ok := remoteIP(addrConn{addr: tc.addr})
		if tc.want == "" {
			if ok {
				t.Errorf("%v: got IP %v, want none", tc.addr, ip)
			}
			continue
		}
		if !ok || ip != netip.MustParseAddr(tc.want) {
			t.Errorf("%v: got %v, %v; want %s", tc.addr, ip, ok, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := (Limits{}).Validate(); err != nil {
		t.Errorf("zero limits: %v", err)
	}
	if err := (Limits{MaxConns: 10000, MaxConnsPerIP: 100, AcceptRate: 200, AcceptBurst: 400}).Validate(); err != nil {
		t.Errorf("sane limits: %v", err)
	}
	for _, bad := range []Limits{
		{MaxConns: -1}, {MaxConnsPerIP: -1}, {AcceptRate: -1}, {AcceptBurst: -1},
		{AcceptRate: nan()}, {AcceptRate: inf()},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
		// New must not turn a bad value into "refuse everything".
		l := New(nil, bad, nil)
		if _, reason := l.admit(netip.MustParseAddr("127.0.0.1"), true); reason != "" {
			t.Errorf("%+v: refused with %q, want treated as unlimited", bad, reason)
		}
	}
}

func nan() float64 { z := 0.0; return z / z }
func inf() float64 { z := 0.0; return 1 / z }

// harness runs a limited listener on a loopback port with an accept loop
// that hands accepted connections to the test.
type harness struct {
	t        *testing.T
	l        *Listener
	accepted chan net.Conn
	counts   *recorder
	loop     sync.WaitGroup // the accept loop

	mu  sync.Mutex
	all []net.Conn // server side, for acceptedFrom and cleanup
}

// start listens on 127.0.0.1 with lim and runs the accept loop; configure,
// if not nil, adjusts the Listener before its accept loop starts.
func start(t *testing.T, lim Limits, configure func(*Listener)) *harness {
	t.Helper()
	h := listen(t, lim, configure)
	h.serve()
	return h
}

// listen is start without the accept loop: serve starts it.
func listen(t *testing.T, lim Limits, configure func(*Listener)) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, accepted: make(chan net.Conn, 64), counts: &recorder{}}
	h.l = New(ln, lim, h.counts)
	if configure != nil {
		configure(h.l)
	}
	t.Cleanup(func() {
		h.l.Close()
		h.loop.Wait()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.all {
			c.Close()
		}
	})
	return h
}

// serve runs the accept loop until the listener closes.
func (h *harness) serve() {
	h.loop.Go(func() {
		for {
			c, err := h.l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.all = append(h.all, c)
			h.mu.Unlock()
			h.accepted <- c
		}
	})
}

// dial connects from the loopback address from (all of 127/8 is loopback on
// Linux, so 127.0.0.1 and 127.0.0.2 are two different clients).
func (h *harness) dial(from string) net.Conn {
	h.t.Helper()
	d := net.Dialer{Timeout: wait, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", h.l.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// expectAccepted waits for the server side of client to come out of Accept,
// checks that it works, and returns it.
func (h *harness) expectAccepted(client net.Conn) net.Conn {
	h.t.Helper()
	select {
	case c := <-h.accepted:
		if c.RemoteAddr().String() != client.LocalAddr().String() {
			h.t.Fatalf("accepted %v, expected %v", c.RemoteAddr(), client.LocalAddr())
		}
		c.SetWriteDeadline(time.Now().Add(wait))
		if _, err := c.Write([]byte("k")); err != nil {
			h.t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(wait))
		if _, err := io.ReadFull(client, make([]byte, 1)); err != nil {
			h.t.Fatalf("accepted connection does not work: %v", err)
		}
		return c
	case <-time.After(wait):
		h.t.Fatalf("connection from %v not accepted", client.LocalAddr())
		return nil
	}
}

// expectRefused waits for the server to close client without a byte, and
// checks that Accept never returned it.
func (h *harness) expectRefused(client net.Conn) {
	h.t.Helper()
	client.SetReadDeadline(time.Now().Add(wait))
	n, err := client.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		h.t.Fatalf("refused connection from %v: read %d bytes, %v; want EOF", client.LocalAddr(), n, err)
	}
	h.expectNoneAccepted()
}

// expectNoneAccepted checks that Accept returned no connection since the
// last one a test took.
func (h *harness) expectNoneAccepted() {
	h.t.Helper()
	select {
	case c := <-h.accepted:
		h.t.Fatalf("connection from %v was accepted as well", c.RemoteAddr())
	default:
	}
}

func (h *harness) expectCounts(want map[string]int) {
	h.t.Helper()
	got := h.counts.snapshot()
	for _, r := range []string{ReasonTotal, ReasonPerIP, ReasonRate} {
		if got[r] != want[r] {
			h.t.Fatalf("refusals = %v, want %v", got, want)
		}
	}
}

func (h *harness) acceptedFrom(ip string) []net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []net.Conn
	for _, c := range h.all {
		if c.RemoteAddr().(*net.TCPAddr).IP.String() == ip {
			out = append(out, c)
		}
	}
	return out
}

func (h *harness) trackedIPs() int {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	return len(h.l.perIP)
}

type recorder struct {
	mu     sync.Mutex
	counts map[string]int
}

func (r *recorder) Refused(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[reason]++
}

func (r *recorder) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

// fakeClock is a time source the test moves by hand, so that rate tests do
// not depend on how fast the machine dials.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// addrConn is a net.Conn with only a remote address, for remoteIP.
type addrConn struct {
	net.Conn
	addr net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.addr }
