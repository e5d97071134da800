package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/netlimit"
)

type countRefusals struct{ total, perIP, rate atomic.Int32 }

func (c *countRefusals) Refused(reason string) {
	switch reason {
	case netlimit.ReasonTotal:
		c.total.Add(1)
	case netlimit.ReasonPerIP:
		c.perIP.Add(1)
	case netlimit.ReasonRate:
		c.rate.Add(1)
	}
}

func start(t *testing.T, svc Service, c netlimit.Counters) *Listener {
	t.Helper()
	svc.Addr = "127.0.0.1:0"
	if svc.Handler == nil {
		svc.Handler = func(ctx *fasthttp.RequestCtx) { httpx.JSON(ctx, 200, []byte(`{"ok":true}`)) }
	}
	l, err := Listen(svc, c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Serve() }()
	t.Cleanup(func() { _ = l.Shutdown(context.Background()) })
	return l
}

func errorBody(t *testing.T, r io.Reader) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.NewDecoder(r).Decode(&e); err != nil {
		t.Fatalf("error body: %v", err)
	}
	return e.Error
}

func TestHeaderSizeLimit(t *testing.T) {
	l := start(t, Service{Name: "t", MaxHeaderBytes: 4096, HeaderTimeout: 5 * time.Second}, nil)
	send := func(headerBytes int) *http.Response {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		req := "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", headerBytes) + "\r\n\r\n"
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := send(1000); resp.StatusCode != 200 {
		t.Fatalf("small headers: %d", resp.StatusCode)
	}
	resp := send(8000)
	if resp.StatusCode != 431 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("big headers: %d %v", resp.StatusCode, resp.Header)
	}
	if msg := errorBody(t, resp.Body); msg != "request headers too large" {
		t.Fatalf("error %q", msg)
	}
}

func TestBodySizeLimit(t *testing.T) {
	l := start(t, Service{Name: "t", MaxBodyBytes: 1000, MaxHeaderBytes: 4096}, nil)
	post := func(n int) *http.Response {
		resp, err := http.Post("http://"+l.Addr().String()+"/", "text/plain", strings.NewReader(strings.Repeat("b", n)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if resp := post(1000); resp.StatusCode != 200 {
		t.Fatalf("1000 bytes: %d", resp.StatusCode)
	}
	resp := post(1001)
	if resp.StatusCode != 413 {
		t.Fatalf("1001 bytes: %d", resp.StatusCode)
	}
	if msg := errorBody(t, resp.Body); msg != "request body too large" {
		t.Fatalf("error %q", msg)
	}
}

func TestHeaderTimeoutCutsSlowClient(t *testing.T) {
	l := start(t, Service{Name: "t", HeaderTimeout: 200 * time.Millisecond, MaxHeaderBytes: 4096}, nil)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Half a request line, then nothing: the server must end it.
	if _, err := io.WriteString(c, "GET / HT"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("slow client was not cut off by the header timeout")
	}
}

func TestConnectionCapRefusesAndCounts(t *testing.T) {
	var c countRefusals
	l := start(t, Service{Name: "t", Limits: netlimit.Limits{MaxConns: 2}, MaxHeaderBytes: 4096}, &c)
	var open []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		open = append(open, conn)
	}
	waitFor(t, func() bool { return l.Limited().Open() == 2 })
	third, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := third.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("third connection served: %d %v", n, err)
	}
	if c.total.Load() != 1 {
		t.Fatalf("refusals counted %d", c.total.Load())
	}
	// A slot frees up: the next connection is served.
	open[0].Close()
	waitFor(t, func() bool { return l.Limited().Open() == 1 })
	resp, err := http.Get("http://" + l.Addr().String() + "/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after a close: %v", err)
	}
	resp.Body.Close()
}

func TestShutdownDrainsAndStopsAccepting(t *testing.T) {
	drained := make(chan struct{}, 2)
	l := start(t, Service{Name: "t", MaxHeaderBytes: 4096, Drain: func(context.Context) error { drained <- struct{}{}; return nil }}, nil)
	addr := l.Addr().String()
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-drained:
	default:
		t.Fatal("drain not called")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still accepting after shutdown")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
