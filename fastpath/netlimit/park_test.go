package netlimit

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/park"
	"edgerelay/fastpath/tlsconf/tlstest"
)

// parkedServer is a fasthttp server on a Listener that parks connections
// until their first byte, the way fastpath/server runs one.
type parkedServer struct {
	t      *testing.T
	set    *park.Set
	l      *Listener
	counts *recorder
	hits   atomic.Int64 // requests that reached the handler
	served chan error   // Serve's result
}

// newSet is a park.Set, or skips the test where there is none (the nopark
// build, other systems).
func newSet(t *testing.T) *park.Set {
	t.Helper()
	set, err := park.New()
	if errors.Is(err, park.ErrUnsupported) {
		t.Skip("no park.Set in this build:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set.Close() }) // last: after the listener
	return set
}

// startParked serves on a parked listener with lim and the wait (also
// the server's ReadTimeout, as fastpath/server sets both from the header
// timeout). wrap, when not nil, wraps the listener (TLS); configure
// adjusts the Listener and the server before it serves.
func startParked(t *testing.T, lim Limits, wait time.Duration, wrap func(net.Listener) net.Listener, configure ...func(*Listener, *fasthttp.Server)) *parkedServer {
	t.Helper()
	s := &parkedServer{t: t, set: newSet(t), counts: &recorder{}, served: make(chan error, 1)}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.l = New(raw, lim, s.counts)
	s.l.SetParker(s.set, wait)
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			s.hits.Add(1)
			ctx.SetBodyString("ok")
		},
		ReadTimeout:     wait,
		CloseOnShutdown: true,
		Logger:          quietLogger{},
		// As fastpath/server hooks it (it matters only with ParkKeepAlive).
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateIdle || st == fasthttp.StateActive {
				MarkIdle(c, st == fasthttp.StateIdle)
			}
		},
	}
	for _, f := range configure {
		f(s.l, srv)
	}
	var ln net.Listener = s.l
	if wrap != nil {
		ln = wrap(ln)
	}
	go func() { s.served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		select {
		case err := <-s.served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(wait):
			t.Error("Serve did not return after Shutdown")
		}
	})
	return s
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// dial connects from the loopback address from and sends nothing.
func (s *parkedServer) dial(from string) *net.TCPConn {
	s.t.Helper()
	d := net.Dialer{Timeout: wait, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// get sends a request on c and reads its answer.
func (s *parkedServer) get(c net.Conn) {
	s.t.Helper()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		s.t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16))
	if resp.StatusCode != 200 || string(body) != "ok" {
		s.t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
	_ = c.SetDeadline(time.Time{})
}

// waitFor waits until cond holds, failing with what after the bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, wait)
		}
		time.Sleep(time.Millisecond)
	}
}

// expectEOF reads from c until the server closes it, within bound.
func expectEOF(t *testing.T, c net.Conn, bound time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(bound))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d bytes, %v; want the server's close (EOF)", n, err)
	}
}

// 200 connections that send nothing reach neither Accept's caller nor the
// handler and hold no goroutine; each is served as soon as it sends a
// request, however late.
func TestParkedSilentConnsHoldNothingAndAreServedLate(t *testing.T) {
	const n = 200
	s := startParked(t, Limits{}, time.Minute, nil)
	waitFor(t, "accept goroutine running", func() bool {
		s.l.parking.mu.Lock()
		defer s.l.parking.mu.Unlock()
		return s.l.parking.started
	})
	base := runtime.NumGoroutine()
	conns := make([]*net.TCPConn, n)
	for i := range conns {
		conns[i] = s.dial("127.0.0.1")
	}
	waitFor(t, "all waiting", func() bool { return s.l.Waiting() == n })
	if got := s.set.Registered(); got != n {
		t.Fatalf("%d registered in the set, want %d", got, n)
	}
	if g := runtime.NumGoroutine(); g > base+5 {
		t.Fatalf("%d goroutines with %d silent connections, %d before: they must hold none", g, n, base)
	}
	// The clients think before their first request; what is tested is
	// that a late first byte is served, and that nothing reached the
	// handler in the meantime.
	time.Sleep(300 * time.Millisecond)
	if h := s.hits.Load(); h != 0 {
		t.Fatalf("%d requests reached the handler before any was sent", h)
	}
	if got := s.l.Open(); got != n {
		t.Fatalf("Open() = %d, want %d (waiting connections hold their place)", got, n)
	}
	for i, c := range conns {
		start := time.Now()
		s.get(c)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("connection %d answered after %v", i, d)
		}
	}
	if h := s.hits.Load(); h != n {
		t.Fatalf("%d requests reached the handler, want %d", h, n)
	}
	if w := s.l.Waiting(); w != 0 {
		t.Fatalf("%d still waiting after every connection sent its request", w)
	}
	waitFor(t, "unregistered after the hand-over", func() bool { return s.set.Registered() == 0 })
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "every place released", func() bool { return s.l.Open() == 0 })
	if got := s.counts.snapshot()[ReasonSilent]; got != 0 {
		t.Fatalf("%d counted silent, want 0", got)
	}
}

// A connection that sends nothing is closed when the wait ends (not
// before, not much after) and counted as silent.
func TestParkedSilentConnClosedAtTheWait(t *testing.T) {
	const w = 500 * time.Millisecond
	s := startParked(t, Limits{}, w, nil)
	start := time.Now() // the server accepts after this: its wait ends later
	c := s.dial("127.0.0.1")
	expectEOF(t, c, wait)
	d := time.Since(start)
	if d < w {
		t.Fatalf("closed after %v, before the wait of %v", d, w)
	}
	if d > w+750*time.Millisecond {
		t.Fatalf("closed after %v, long after the wait of %v", d, w)
	}
	waitFor(t, "its place released", func() bool { return s.l.Open() == 0 })
	if got := s.counts.snapshot()[ReasonSilent]; got != 1 {
		t.Fatalf("%d counted silent, want 1", got)
	}
	if s.hits.Load() != 0 || s.l.Waiting() != 0 || s.set.Registered() != 0 {
		t.Fatalf("hits %d, waiting %d, registered %d; want 0", s.hits.Load(), s.l.Waiting(), s.set.Registered())
	}
}

// A connection whose first byte comes late gets the rest of the wait for
// its request, not a whole header timeout more: the header timeout runs
// from the accept, as without parking.
func TestParkedFirstByteGetsTheRestOfTheWait(t *testing.T) {
	const w = 1200 * time.Millisecond
	s := startParked(t, Limits{}, w, nil)
	start := time.Now()
	c := s.dial("127.0.0.1")
	time.Sleep(900 * time.Millisecond) // a slow client: one byte late in the wait, then nothing
	if _, err := io.WriteString(c, "G"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err := io.ReadAll(c) // fasthttp answers 408 and closes
	d := time.Since(start)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if d < w || d > w+600*time.Millisecond {
		t.Fatalf("closed %v after the accept; want at the end of the wait of %v (without the cut: %v)", d, w, 900*time.Millisecond+w)
	}
}

// A connection that closes at once (EOF) and one reset (SO_LINGER 0) are
// handed to the server, which closes them: nothing is left behind.
func TestParkedEOFAndResetCleanedUp(t *testing.T) {
	s := startParked(t, Limits{MaxConns: 10}, time.Minute, nil)
	eof := s.dial("127.0.0.1")
	reset := s.dial("127.0.0.2")
	waitFor(t, "both waiting", func() bool { return s.l.Waiting() == 2 })
	if err := eof.Close(); err != nil {
		t.Fatal(err)
	}
	if err := reset.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := reset.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both places released", func() bool { return s.l.Open() == 0 })
	if s.l.Waiting() != 0 || s.hits.Load() != 0 {
		t.Fatalf("waiting %d, hits %d; want 0", s.l.Waiting(), s.hits.Load())
	}
	waitFor(t, "both unregistered", func() bool { return s.set.Registered() == 0 })
	if got := s.counts.snapshot()[ReasonSilent]; got != 0 {
		t.Fatalf("%d counted silent, want 0", got)
	}
}

// Waiting connections count against MaxConns and the per-IP cap.
func TestParkedConnsCountAgainstTheCaps(t *testing.T) {
	t.Run("total", func(t *testing.T) {
		s := startParked(t, Limits{MaxConns: 3}, time.Minute, nil)
		first := s.dial("127.0.0.1")
		s.dial("127.0.0.2")
		s.dial("127.0.0.3")
		waitFor(t, "three waiting", func() bool { return s.l.Waiting() == 3 })
		expectEOF(t, s.dial("127.0.0.4"), wait)
		if got := s.counts.snapshot()[ReasonTotal]; got != 1 {
			t.Fatalf("%d refused as total, want 1", got)
		}
		s.get(first) // a waiting connection is still served
		first.Close()
		waitFor(t, "a place freed", func() bool { return s.l.Open() == 2 })
		s.dial("127.0.0.4")
		waitFor(t, "the newcomer waiting", func() bool { return s.l.Waiting() == 3 })
	})
	t.Run("per IP", func(t *testing.T) {
		s := startParked(t, Limits{MaxConnsPerIP: 2}, time.Minute, nil)
		a := s.dial("127.0.0.1")
		s.dial("127.0.0.1")
		waitFor(t, "two waiting", func() bool { return s.l.Waiting() == 2 })
		expectEOF(t, s.dial("127.0.0.1"), wait)
		if got := s.counts.snapshot()[ReasonPerIP]; got != 1 {
			t.Fatalf("%d refused per IP, want 1", got)
		}
		b := s.dial("127.0.0.2") // another client is not affected
		waitFor(t, "three waiting", func() bool { return s.l.Waiting() == 3 })
		s.get(a)
		s.get(b)
		if got := s.l.Open(); got != 3 {
			t.Fatalf("Open() = %d, want 3", got)
		}
	})
}

// Closing the listener closes the connections still waiting, new ones
// and keep-alive ones parked between requests, and Accept returns the
// closed error.
func TestParkedCloseClosesWaiting(t *testing.T) {
	s := startParked(t, Limits{}, time.Minute, nil, keepAlive(time.Minute, false))
	var conns []*net.TCPConn
	for i := range 8 {
		c := s.dial("127.0.0.1")
		if i >= 5 {
			s.get(c)
		}
		conns = append(conns, c)
	}
	waitFor(t, "five new and three kept alive waiting", func() bool { return s.l.Waiting() == 8 })
	if err := s.l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		expectEOF(t, c, wait)
	}
	waitFor(t, "every place released", func() bool { return s.l.Open() == 0 })
	if s.l.Waiting() != 0 || s.set.Registered() != 0 {
		t.Fatalf("waiting %d, registered %d after Close; want 0", s.l.Waiting(), s.set.Registered())
	}
	if _, err := s.l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	select {
	case err := <-s.served:
		if err != nil {
			t.Fatalf("Serve after Close: %v, want nil (fasthttp ends quietly on a closed listener)", err)
		}
		s.served <- nil // for the cleanup
	case <-time.After(wait):
		t.Fatal("Serve still running after the listener closed")
	}
}

// Connections woken but not yet taken by Accept are closed by Close too.
func TestParkedCloseClosesQueued(t *testing.T) {
	set := newSet(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(raw, Limits{}, nil)
	l.SetParker(set, time.Minute)
	taken := make(chan net.Conn, 1)
	go func() { // one Accept only: whatever else wakes stays queued
		if c, err := l.Accept(); err == nil {
			taken <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "x"); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	var first net.Conn
	select {
	case first = <-taken:
	case <-time.After(wait):
		t.Fatal("no connection accepted")
	}
	defer first.Close()
	waitFor(t, "the other one queued", func() bool {
		l.parking.mu.Lock()
		defer l.parking.mu.Unlock()
		return len(l.parking.ready) == 1
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	queued := a
	if first.RemoteAddr().String() == a.LocalAddr().String() {
		queued = b
	}
	// Its byte was never read: the close resets it rather than ending it.
	_ = queued.SetReadDeadline(time.Now().Add(wait))
	if n, err := queued.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("queued connection after Close: read %d, %v; want it closed", n, err)
	}
	if got := l.Open(); got != 1 {
		t.Fatalf("Open() = %d, want 1 (the accepted one)", got)
	}
}

// Errors of the inner listener reach Accept's caller as they are, one per
// call, and Accept returns the closed error after Close.
func TestParkedAcceptErrorsPassThrough(t *testing.T) {
	set := newSet(t)
	inner := &errListener{errs: make(chan error), closed: make(chan struct{})}
	l := New(inner, Limits{}, nil)
	l.SetParker(set, time.Minute)
	temporary := errors.New("a temporary failure")
	got := make(chan error, 1)
	go func() { _, err := l.Accept(); got <- err }()
	inner.errs <- temporary
	if err := <-got; err != temporary {
		t.Fatalf("Accept: %v, want the inner listener's error as it is", err)
	}
	go func() { _, err := l.Accept(); got <- err }()
	inner.errs <- temporary
	if err := <-got; err != temporary {
		t.Fatalf("second Accept: %v, want the inner listener's error again", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := l.Accept()
	if !errors.Is(err, net.ErrClosed) || !strings.Contains(err.Error(), "use of closed network connection") {
		t.Fatalf("Accept after Close: %v, want the closed-listener error", err)
	}
}

// errListener's Accept returns the errors sent to it, and net.ErrClosed
// once closed.
type errListener struct {
	errs   chan error
	closed chan struct{}
}

func (e *errListener) Accept() (net.Conn, error) {
	select {
	case err := <-e.errs:
		return nil, err
	case <-e.closed:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
	}
}
func (e *errListener) Close() error   { close(e.closed); return nil }
func (e *errListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TLS above the parked listener: the ClientHello is the first byte.
func TestParkedUnderTLS(t *testing.T) {
	cfg := &tls.Config{Certificates: []tls.Certificate{tlstest.SelfSigned(t)}}
	s := startParked(t, Limits{}, time.Minute, func(ln net.Listener) net.Listener { return tls.NewListener(ln, cfg) })
	s.dial("127.0.0.1") // silent: never handed to TLS
	waitFor(t, "the silent one waiting", func() bool { return s.l.Waiting() == 1 })
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: wait}, "tcp", s.l.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS handshake through the parked listener: %v", err)
	}
	defer c.Close()
	s.get(c)
	if got := s.l.Waiting(); got != 1 {
		t.Fatalf("%d waiting, want the silent one only", got)
	}
}

// Without a set the listener hands connections over at once, as it always
// did (the nopark build runs this too).
func TestNoParkerAcceptsAtOnce(t *testing.T) {
	set, _ := park.New() // nil where there is none
	if set != nil {
		t.Cleanup(func() { _ = set.Close() }) // after the listeners' cleanups
	}
	h := start(t, Limits{}, func(l *Listener) { l.SetParker(nil, time.Minute) })
	h.expectAccepted(h.dial("127.0.0.1")) // silent, yet accepted
	if h.l.parking != nil || h.l.Waiting() != 0 {
		t.Fatal("a nil set left the listener parking")
	}
	if set == nil {
		return // the nopark build: nothing more to compare with
	}
	// A set in this build parks: the same silent connection is not accepted.
	p := listen(t, Limits{}, func(l *Listener) { l.SetParker(set, time.Minute) })
	p.serve()
	p.dial("127.0.0.1")
	waitFor(t, "waiting", func() bool { return p.l.Waiting() == 1 })
	p.expectNoneAccepted()
}

// Waits that end one after another are each ended on time by the
// listener's one expiry timer, a connection that parks after the list
// emptied included, and one woken in between is served.
func TestParkedWaitsExpireInTurn(t *testing.T) {
	const w = 400 * time.Millisecond
	s := startParked(t, Limits{}, w, nil)
	type silent struct {
		c     net.Conn
		start time.Time
	}
	dialAt := func() silent {
		start := time.Now()
		return silent{s.dial("127.0.0.1"), start}
	}
	check := func(c silent) {
		t.Helper()
		expectEOF(t, c.c, wait)
		if d := time.Since(c.start); d < w || d > w+750*time.Millisecond {
			t.Fatalf("closed %v after its accept, want at the end of its wait of %v", d, w)
		}
	}
	a := dialAt()
	served := s.dial("127.0.0.2")
	time.Sleep(w / 2) // the second silent one's wait ends half a wait later
	b := dialAt()
	s.get(served) // woken between the two, from the middle of the list
	check(a)
	check(b)
	waitFor(t, "list empty", func() bool { return s.l.Waiting() == 0 })
	check(dialAt()) // the timer is set again for a newcomer
	if got := s.counts.snapshot()[ReasonSilent]; got != 3 {
		t.Fatalf("%d counted silent, want 3", got)
	}
	if h := s.hits.Load(); h != 1 {
		t.Fatalf("%d requests served, want 1", h)
	}
}
