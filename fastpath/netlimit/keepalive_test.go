package netlimit

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/tlsconf/tlstest"
)

const linger = 50 * time.Millisecond

// keepAlive configures a parked server to park keep-alive connections
// after linger, with the server's idle time idle.
func keepAlive(idle time.Duration, reduceMemory bool) func(*Listener, *fasthttp.Server) {
	return func(l *Listener, srv *fasthttp.Server) {
		l.ParkKeepAlive(linger)
		srv.IdleTimeout = idle
		srv.ReduceMemoryUsage = reduceMemory
		// fasthttp keeps a worker goroutine that served a connection
		// for this long, to serve the next: the goroutines counted are
		// the connections' own.
		srv.MaxIdleWorkerDuration = linger
	}
}

// Keep-alive connections between requests are parked after the linger:
// they hold no goroutine and keep their places, their next requests are
// answered on the same connections, as often as they come, and nothing
// is counted as a refusal. fasthttp's two ways of waiting for the next
// request (a buffered peek, and a one-byte read with ReduceMemoryUsage)
// both park.
func TestKeepAliveParkedBetweenRequests(t *testing.T) {
	for _, reduce := range []bool{false, true} {
		name := "buffered"
		if reduce {
			name = "reduce memory"
		}
		t.Run(name, func(t *testing.T) {
			const n = 100
			s := startParked(t, Limits{}, time.Minute, nil, keepAlive(time.Minute, reduce))
			conns := make([]*net.TCPConn, n)
			for i := range conns {
				conns[i] = s.dial("127.0.0.1")
			}
			waitFor(t, "all waiting for their first request", func() bool { return s.l.Waiting() == n })
			base := runtime.NumGoroutine()
			for cycle := 1; cycle <= 3; cycle++ {
				for _, c := range conns {
					s.get(c)
				}
				if h := s.hits.Load(); h != int64(cycle*n) {
					t.Fatalf("cycle %d: %d requests reached the handler, want %d", cycle, h, cycle*n)
				}
				waitFor(t, "all parked after their answers", func() bool { return s.l.Waiting() == n })
				if got := s.set.Registered(); got != n {
					t.Fatalf("cycle %d: %d registered in the set, want %d", cycle, got, n)
				}
				waitFor(t, "the servers' goroutines gone", func() bool { return runtime.NumGoroutine() <= base+5 })
				if got := s.l.Open(); got != n {
					t.Fatalf("cycle %d: Open() = %d, want %d (parked connections keep their places)", cycle, got, n)
				}
			}
			if got := s.counts.snapshot(); len(got) != 0 {
				t.Fatalf("refusals counted: %v, want none", got)
			}
			for _, c := range conns {
				c.Close()
			}
			waitFor(t, "every place released", func() bool { return s.l.Open() == 0 })
			waitFor(t, "nothing registered", func() bool { return s.set.Registered() == 0 })
			if w := s.l.Waiting(); w != 0 {
				t.Fatalf("%d waiting after every client left", w)
			}
		})
	}
}

// A parked keep-alive connection is closed at the end of the server's
// idle time, counted at an end as the server's own idle close is: not at
// all.
func TestKeepAliveParkedClosedAtTheIdleTime(t *testing.T) {
	const idle = 600 * time.Millisecond
	s := startParked(t, Limits{}, time.Minute, nil, keepAlive(idle, false))
	c := s.dial("127.0.0.1")
	s.get(c)
	answered := time.Now()
	waitFor(t, "parked", func() bool { return s.l.Waiting() == 1 })
	expectEOF(t, c, wait)
	d := time.Since(answered)
	if d < idle-linger {
		t.Fatalf("closed %v after the answer, before the idle time of %v", d, idle)
	}
	if d > idle+750*time.Millisecond {
		t.Fatalf("closed %v after the answer, long after the idle time of %v", d, idle)
	}
	waitFor(t, "its place released", func() bool { return s.l.Open() == 0 })
	if got := s.counts.snapshot(); len(got) != 0 {
		t.Fatalf("refusals counted: %v, want none", got)
	}
	if s.l.Waiting() != 0 || s.set.Registered() != 0 {
		t.Fatalf("waiting %d, registered %d; want 0", s.l.Waiting(), s.set.Registered())
	}
}

// An idle time shorter than the linger leaves the connection to the
// server, which closes it at that time.
func TestKeepAliveIdleTimeShorterThanTheLinger(t *testing.T) {
	const idle = 20 * time.Millisecond
	s := startParked(t, Limits{}, time.Minute, nil, keepAlive(idle, false))
	c := s.dial("127.0.0.1")
	s.get(c)
	expectEOF(t, c, wait)
	waitFor(t, "its place released", func() bool { return s.l.Open() == 0 })
	if s.set.Registered() != 0 {
		t.Fatalf("%d registered, want 0", s.set.Registered())
	}
}

// A parked keep-alive connection keeps its place: the cap refuses a
// newcomer, and its own next request spends no accept token.
func TestKeepAliveParkedKeepsItsPlace(t *testing.T) {
	s := startParked(t, Limits{MaxConns: 1, AcceptRate: 0.001, AcceptBurst: 1}, time.Minute, nil, keepAlive(time.Minute, false))
	c := s.dial("127.0.0.1")
	s.get(c)
	waitFor(t, "parked", func() bool { return s.l.Waiting() == 1 })
	expectEOF(t, s.dial("127.0.0.2"), wait)
	if got := s.counts.snapshot()[ReasonTotal]; got != 1 {
		t.Fatalf("%d refused as total, want 1", got)
	}
	// The bucket is empty (one token, refilled in 1,000 s): the next
	// requests go through only because the connection was never
	// accepted again.
	for range 3 {
		s.get(c)
		waitFor(t, "parked again", func() bool { return s.l.Waiting() == 1 })
	}
	if got := s.counts.snapshot()[ReasonRate]; got != 0 {
		t.Fatalf("%d refused for the rate, want 0", got)
	}
}

// Requests split around the parking and pipelined ones are answered
// whole and in order.
func TestKeepAliveParkedRequestsSplitAndPipelined(t *testing.T) {
	s := startParked(t, Limits{}, time.Minute, nil, keepAlive(time.Minute, false))
	c := s.dial("127.0.0.1")
	s.get(c)
	waitFor(t, "parked", func() bool { return s.l.Waiting() == 1 })
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(wait))
	// Half a request wakes it; the server waits for the rest as for any
	// request.
	if _, err := io.WriteString(c, "GET /a HTTP/1.1\r\nHo"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "handed to the server", func() bool { return s.l.Waiting() == 0 })
	if _, err := io.WriteString(c, "st: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("answer %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if h := s.hits.Load(); h != 4 {
		t.Fatalf("%d requests reached the handler, want 4", h)
	}
	waitFor(t, "parked again", func() bool { return s.l.Waiting() == 1 })
}

// TLS keep-alive connections are parked with their TLS when the
// Listener runs it: the client's next request, on the TLS session it
// has, is answered (a connection shaken hands with again would answer
// it with an alert). Under a TLS layer of someone else's none is parked:
// what is tested there is an absence, so the test gives the parking
// several lingers to happen.
func TestKeepAliveTLS(t *testing.T) {
	cfg := &tls.Config{Certificates: []tls.Certificate{tlstest.SelfSigned(t)}}
	for _, own := range []bool{true, false} {
		name := "the listener's TLS"
		if !own {
			name = "tls.NewListener"
		}
		t.Run(name, func(t *testing.T) {
			// What each request's handler found: under the listener's
			// TLS the records are tlsrec's from the first park on, and
			// the connection still says what TLS it has.
			seen := make(chan string, 3)
			s := startParked(t, Limits{}, time.Minute, func(ln net.Listener) net.Listener {
				if own {
					return ln.(*Listener).TLS(cfg)
				}
				return tls.NewListener(ln, cfg)
			}, keepAlive(time.Minute, false), func(_ *Listener, srv *fasthttp.Server) {
				next := srv.Handler
				srv.Handler = func(ctx *fasthttp.RequestCtx) {
					tc, _ := ctx.Conn().(*tlsConn)
					seen <- fmt.Sprintf("taken over %v, TLS %#x", tc != nil && tc.TakenOver(), ctx.TLSConnectionState().Version)
					next(ctx)
				}
			})
			c := tls.Client(s.dial("127.0.0.1"), &tls.Config{InsecureSkipVerify: true})
			if own {
				// The listener shakes hands and parks the connection
				// until its first request (greet): taken over from the
				// first request on.
				if err := c.Handshake(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "parked after its handshake", func() bool { return s.l.Waiting() == 1 })
			}
			for round := 1; round <= 3; round++ {
				s.get(c)
				if own {
					waitFor(t, "parked with its TLS", func() bool { return s.l.Waiting() == 1 })
					continue
				}
				time.Sleep(6 * linger)
				if w := s.l.Waiting(); w != 0 {
					t.Fatalf("%d waiting: a connection under another TLS layer was parked", w)
				}
			}
			if h := s.hits.Load(); h != 3 {
				t.Fatalf("%d requests reached the handler, want 3", h)
			}
			for round := 1; round <= 3; round++ {
				want := fmt.Sprintf("taken over %v, TLS %#x", own, tls.VersionTLS13)
				if got := <-seen; got != want {
					t.Fatalf("request %d: %s, want %s", round, got, want)
				}
			}
			if got := s.counts.snapshot(); len(got) != 0 {
				t.Fatalf("refusals counted: %v, want none", got)
			}
		})
	}
}
