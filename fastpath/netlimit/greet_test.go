package netlimit

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/tlsconf/tlstest"
)

// greetedServer serves TLS through the Listener's own TLS (l.TLS) over a
// parked listener, reporting for each request what its handler found.
func greetedServer(t *testing.T, wait time.Duration, configure ...func(*Listener, *fasthttp.Server)) (*parkedServer, chan string) {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{tlstest.SelfSigned(t)}, NextProtos: []string{"http/1.1"}}
	seen := make(chan string, 64)
	report := func(_ *Listener, srv *fasthttp.Server) {
		next := srv.Handler
		srv.Handler = func(ctx *fasthttp.RequestCtx) {
			tc, _ := ctx.Conn().(*tlsConn)
			st := ctx.TLSConnectionState()
			seen <- fmt.Sprintf("taken over %v, TLS %#x, ALPN %q, SNI %q", tc != nil && tc.TakenOver(), st.Version, st.NegotiatedProtocol, st.ServerName)
			next(ctx)
		}
	}
	s := startParked(t, Limits{}, wait, func(ln net.Listener) net.Listener { return ln.(*Listener).TLS(cfg) }, append(configure, report)...)
	return s, seen
}

// tlsClient dials the server and shakes hands, sending no request.
func (s *parkedServer) tlsClient(cfg *tls.Config) *tls.Conn {
	s.t.Helper()
	c := tls.Client(s.dial("127.0.0.1"), cfg)
	_ = c.SetDeadline(time.Now().Add(wait))
	if err := c.Handshake(); err != nil {
		s.t.Fatalf("handshake: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c
}

// 50 TLS connections that shake hands and then send nothing wait parked,
// with no goroutine, the record layer taken over; each is served when its
// request comes, and says what TLS it has.
func TestGreetedTLSParkedUntilItsRequest(t *testing.T) {
	const n = 50
	s, seen := greetedServer(t, time.Minute)
	ccfg := &tls.Config{InsecureSkipVerify: true, ServerName: "relay.example", NextProtos: []string{"http/1.1"}}
	// One first, so the accept goroutine runs before the count below.
	first := s.tlsClient(ccfg)
	waitFor(t, "the first greeted one parked", func() bool { return s.l.Waiting() == 1 })
	base := runtime.NumGoroutine()
	conns := []*tls.Conn{first}
	for range n - 1 {
		conns = append(conns, s.tlsClient(ccfg))
	}
	waitFor(t, "all parked after their handshake", func() bool { return s.l.Waiting() == n })
	if got := s.set.Registered(); got != n {
		t.Fatalf("%d registered in the set, want %d", got, n)
	}
	// The handshakes' goroutines are on their way out: allow a few.
	waitFor(t, "no goroutine per greeted connection", func() bool { return runtime.NumGoroutine() <= base+5 })
	if h := s.hits.Load(); h != 0 {
		t.Fatalf("%d requests reached the handler before any was sent", h)
	}
	for _, c := range conns {
		s.get(c)
	}
	want := `taken over true, TLS 0x304, ALPN "http/1.1", SNI "relay.example"`
	for i := range n {
		if got := <-seen; got != want {
			t.Fatalf("request %d: %s, want %s", i, got, want)
		}
	}
	if w := s.l.Waiting(); w != 0 {
		t.Fatalf("%d still waiting after every connection sent its request", w)
	}
	if got := s.counts.snapshot(); len(got) != 0 {
		t.Fatalf("refusals counted: %v, want none", got)
	}
}

// A request that comes with the handshake's end (crypto/tls reads it with
// the client's Finished, so epoll never tells of it) is served at once.
func TestGreetedTLSRequestWithTheHandshake(t *testing.T) {
	s, seen := greetedServer(t, time.Minute)
	for range 20 {
		// The request is written as the handshake ends: Write shakes
		// hands first, then sends it at once.
		c := tls.Client(s.dial("127.0.0.1"), &tls.Config{InsecureSkipVerify: true})
		s.get(c)
		<-seen
	}
	if h := s.hits.Load(); h != 20 {
		t.Fatalf("%d served, want 20", h)
	}
}

// A TLS 1.2 client is served as before: its state stays crypto/tls's.
func TestGreetedTLS12Served(t *testing.T) {
	s, seen := greetedServer(t, time.Minute)
	c := s.tlsClient(&tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12})
	s.get(c)
	if got, want := <-seen, `taken over false, TLS 0x303, ALPN "", SNI ""`; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

// Silence after the handshake, and a handshake that stops half way, are
// closed at the end of the wait that began at the accept, and counted as
// silent; a failed handshake is closed at once, not counted. Every place
// is given back, and nothing reaches the handler.
func TestGreetedTLSSilentAndBroken(t *testing.T) {
	const w = 600 * time.Millisecond
	s, _ := greetedServer(t, w)
	start := time.Now()
	silent := s.tlsClient(&tls.Config{InsecureSkipVerify: true})
	stalled := s.dial("127.0.0.1")
	// A record header and part of a ClientHello: the handshake waits.
	if _, err := stalled.Write([]byte{0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0x00}); err != nil {
		t.Fatal(err)
	}
	broken := s.dial("127.0.0.1")
	if _, err := io.WriteString(broken, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = broken.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.ReadAll(broken); err != nil {
		t.Fatalf("plain HTTP on TLS: %v, want the server's close", err)
	}
	if d := time.Since(start); d >= w {
		t.Fatalf("the broken handshake was closed after %v, not at once", d)
	}
	_ = silent.SetReadDeadline(time.Now().Add(wait))
	if n, err := silent.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("silent after its handshake: read %d, %v; want the close", n, err)
	}
	expectEOF(t, stalled, wait)
	if d := time.Since(start); d < w || d > w+750*time.Millisecond {
		t.Fatalf("closed %v after the accepts; want at the end of the wait of %v", d, w)
	}
	waitFor(t, "every place released", func() bool { return s.l.Open() == 0 })
	if got := s.counts.snapshot(); got[ReasonSilent] != 2 || len(got) != 1 {
		t.Fatalf("counted %v, want 2 silent only", got)
	}
	if s.hits.Load() != 0 || s.l.Waiting() != 0 || s.set.Registered() != 0 {
		t.Fatalf("hits %d, waiting %d, registered %d; want 0", s.hits.Load(), s.l.Waiting(), s.set.Registered())
	}
}

// Closing the listener closes the greeted connections waiting.
func TestGreetedTLSClosedWithTheListener(t *testing.T) {
	s, _ := greetedServer(t, time.Minute)
	var conns []*tls.Conn
	for range 4 {
		conns = append(conns, s.tlsClient(&tls.Config{InsecureSkipVerify: true}))
	}
	waitFor(t, "four greeted waiting", func() bool { return s.l.Waiting() == 4 })
	if err := s.l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Fatalf("read %d, %v after the listener closed; want the close", n, err)
		}
	}
	waitFor(t, "every place released", func() bool { return s.l.Open() == 0 })
	<-s.served
	s.served <- nil // for the cleanup
}
