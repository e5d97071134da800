package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/netlimit"
	"edgerelay/fastpath/park"
	"edgerelay/fastpath/tlsconf/tlstest"
)

type countSilent struct{ silent atomic.Int32 }

func (c *countSilent) Refused(reason string) {
	if reason == netlimit.ReasonSilent {
		c.silent.Add(1)
	}
}

// A service with a Parker keeps silent connections from its handler,
// serves one as soon as it sends a request, plain and over TLS, closes a
// silent one at the header timeout and counts it, and its Shutdown closes
// those still waiting.
func TestParkerKeepsSilentConnectionsUntilTheirFirstByte(t *testing.T) {
	set, err := park.New()
	if errors.Is(err, park.ErrUnsupported) {
		t.Skip("no park.Set in this build:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set.Close() })
	for _, useTLS := range []bool{false, true} {
		name := "plain"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			var hits atomic.Int32
			var counts countSilent
			svc := Service{Name: "t", MaxHeaderBytes: 4096, HeaderTimeout: 400 * time.Millisecond, Parker: set,
				Handler: func(ctx *fasthttp.RequestCtx) { hits.Add(1); ctx.SetBodyString("ok") }}
			dialTLS := &tls.Config{InsecureSkipVerify: true}
			if useTLS {
				svc.TLS = &tls.Config{Certificates: []tls.Certificate{tlstest.SelfSigned(t)}}
			}
			l := start(t, svc, &counts)
			dial := func() net.Conn {
				c, err := net.Dial("tcp", l.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}

			begin := time.Now() // before the accept, so before the wait starts
			silent := dial()
			late := dial()
			waitFor(t, func() bool { return l.Limited().Waiting() == 2 })
			if hits.Load() != 0 {
				t.Fatal("a silent connection reached the handler")
			}
			// The late one asks within the header timeout and is served.
			var c net.Conn = late
			if useTLS {
				tc := tls.Client(late, dialTLS)
				if err := tc.Handshake(); err != nil {
					t.Fatalf("handshake: %v", err)
				}
				c = tc
			}
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("late request: %v %v", resp, err)
			}
			if hits.Load() != 1 {
				t.Fatalf("%d requests reached the handler, want 1", hits.Load())
			}
			// The silent one is closed at the header timeout and counted.
			_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := silent.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("silent connection: read %d, %v; want EOF", n, err)
			}
			if d := time.Since(begin); d < svc.HeaderTimeout {
				t.Fatalf("silent connection closed after %v, before the header timeout", d)
			}
			waitFor(t, func() bool { return counts.silent.Load() == 1 })

			// Shutdown closes a connection still waiting.
			waiting := dial()
			waitFor(t, func() bool { return l.Limited().Waiting() == 1 })
			if err := l.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			_ = waiting.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := waiting.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("waiting connection after Shutdown: read %d, %v; want EOF", n, err)
			}
		})
	}
}

// With a Parker, a keep-alive connection is parked between requests (the
// service hooks fasthttp's connection states to netlimit), plain or TLS
// (with its TLS session kept), its next request is served whatever it
// is, a hijack included, and Shutdown closes one still parked.
func TestParkerParksKeepAliveConnections(t *testing.T) {
	set, err := park.New()
	if errors.Is(err, park.ErrUnsupported) {
		t.Skip("no park.Set in this build:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set.Close() })
	for _, useTLS := range []bool{false, true} {
		name := "plain"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) { keepAliveParked(t, set, useTLS) })
	}
}

func keepAliveParked(t *testing.T, set *park.Set, useTLS bool) {
	svc := Service{Name: "t", MaxHeaderBytes: 4096, HeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		Parker: set, KeepAliveLinger: 20 * time.Millisecond,
		Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) != "/echo" {
				ctx.SetBodyString("ok")
				return
			}
			ctx.SetStatusCode(fasthttp.StatusSwitchingProtocols)
			ctx.Response.Header.Set("Connection", "Upgrade")
			ctx.Response.Header.Set("Upgrade", "echo")
			ctx.Hijack(func(c net.Conn) { _, _ = io.Copy(c, c) })
		}}
	if useTLS {
		svc.TLS = &tls.Config{Certificates: []tls.Certificate{tlstest.SelfSigned(t)}}
	}
	l := start(t, svc, nil)
	dial := func() (net.Conn, *bufio.Reader) {
		var c net.Conn
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if useTLS {
			c = tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return c, bufio.NewReader(c)
	}
	ask := func(c net.Conn, r *bufio.Reader, path string, want int) {
		t.Helper()
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("GET %s: %v %v, want %d", path, resp, err, want)
		}
		if want == 200 {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
	}

	c, r := dial()
	ask(c, r, "/", 200)
	waitFor(t, func() bool { return l.Limited().Waiting() == 1 })
	ask(c, r, "/", 200)
	waitFor(t, func() bool { return l.Limited().Waiting() == 1 })
	ask(c, r, "/echo", fasthttp.StatusSwitchingProtocols)
	if _, err := io.WriteString(c, "hello"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(r, got); err != nil || string(got) != "hello" {
		t.Fatalf("echo after the parking: %q, %v", got, err)
	}

	parked, pr := dial()
	ask(parked, pr, "/", 200)
	waitFor(t, func() bool { return l.Limited().Waiting() == 1 })
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, err := pr.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("parked connection after Shutdown: read %d, %v; want EOF", n, err)
	}
}
