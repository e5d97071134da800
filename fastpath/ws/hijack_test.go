package ws_test

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/netlimit"
	"edgerelay/fastpath/ws"
)

// Exactly one of serve and abandon runs for every Upgrade on a connection
// that reports its close (netlimit's, as in the relay): serve when fasthttp
// hands the connection over, abandon when it closes it instead, which it
// does when the answer to a request pipelined before the upgrade cannot be
// flushed.

// abandonServer upgrades every valid handshake on a netlimit listener,
// counting Upgrade calls, serve calls and abandon calls. GET /plain is an
// ordinary request answered "plain". Before each Upgrade the handler waits
// until the client's reset has arrived, so that whatever is written next
// fails.
type abandonServer struct {
	ln       *netlimit.Listener
	addr     string
	arrived  chan struct{}
	resets   chan error
	upgrades atomic.Int32
	serves   atomic.Int32
	abandons atomic.Int32
	// closedInServe counts serves that found their abandon already run.
	closedInServe atomic.Int32
}

// eachAbandonServer runs f as a subtest on a server whose upgrades stay
// attached to fasthttp, then on one whose upgrades are detached.
func eachAbandonServer(t *testing.T, f func(t *testing.T, as *abandonServer)) {
	for _, detach := range []bool{false, true} {
		name := "attached"
		if detach {
			name = "detached"
		}
		t.Run(name, func(t *testing.T) { f(t, startAbandonServer(t, detach)) })
	}
}

func startAbandonServer(t *testing.T, detach bool) *abandonServer {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := netlimit.New(raw, netlimit.Limits{}, nil)
	as := &abandonServer{ln: ln, addr: ln.Addr().String(), arrived: make(chan struct{}, 64), resets: make(chan error, 64)}
	srv := &fasthttp.Server{KeepHijackedConns: detach, Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/plain" {
			ctx.SetBodyString("plain")
			return
		}
		if err := ws.CheckHandshake(ctx); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadRequest)
			return
		}
		as.arrived <- struct{}{}
		as.resets <- waitForReset(ctx.Conn().(interface{ NetConn() net.Conn }).NetConn())
		as.upgrades.Add(1)
		var abandoned atomic.Bool
		ws.Upgrade(ctx, ws.NewSettings(ws.Options{Detach: detach}), "", func() {
			abandoned.Store(true)
			as.abandons.Add(1)
		}, func(c *ws.Conn) {
			if abandoned.Load() {
				as.closedInServe.Add(1)
			}
			as.serves.Add(1)
			_, _, _ = c.ReadMessage()
		})
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = ln.Close() })
	return as
}

// hostile sends request in one write, waits for the handler to reach the
// upgrade, and resets the connection (linger 0).
func (as *abandonServer) hostile(t *testing.T, request string) {
	t.Helper()
	nc, err := net.Dial("tcp", as.addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(nc, request); err != nil {
		t.Fatal(err)
	}
	select {
	case <-as.arrived:
	case <-time.After(waitTimeout):
		t.Fatal("the upgrade never reached the handler")
	}
	if err := nc.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	_ = nc.Close()
	if err := <-as.resets; err != nil {
		t.Fatal(err)
	}
}

func TestUpgradeAbandonsWhenTheConnectionIsNeverHandedOver(t *testing.T) {
	const clients = 10
	eachAbandonServer(t, func(t *testing.T, as *abandonServer) {
		for range clients {
			// Both requests arrive in one segment: fasthttp keeps the
			// answer to the first for the pipeline, and its flush,
			// just before the hijack, fails on the reset.
			as.hostile(t, "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n"+upgradeRequest(as.addr))
		}
		waitFor(t, "abandon to run for every upgrade", func() bool { return as.abandons.Load() >= clients })
		if got := as.abandons.Load(); got != clients {
			t.Errorf("abandon ran %d times for %d upgrades", got, clients)
		}
		if got := as.serves.Load(); got != 0 {
			t.Errorf("serve ran %d times for upgrades that fasthttp never handed over", got)
		}
	})
}

// An upgrade that fasthttp does hand over is served, even when its 101
// cannot be written, and is never abandoned, not even by the close of its
// connection after serve.
func TestUpgradeServedIsNeverAbandoned(t *testing.T) {
	const clients = 10
	eachAbandonServer(t, func(t *testing.T, as *abandonServer) {
		for range clients {
			as.hostile(t, upgradeRequest(as.addr))
		}
		waitFor(t, "serve to run for every upgrade", func() bool { return as.serves.Load() >= clients })
		// The connections are closed once serve returns: wait for
		// that to be over before looking for a late abandon.
		waitFor(t, "every connection to close", func() bool { return as.ln.Open() == 0 })
		if got := as.serves.Load(); got != clients {
			t.Errorf("serve ran %d times for %d upgrades", got, clients)
		}
		if got := as.abandons.Load(); got != 0 {
			t.Errorf("abandon ran %d times for upgrades that were served", got)
		}
		if got := as.closedInServe.Load(); got != 0 {
			t.Errorf("%d serves ran after their abandon", got)
		}
	})
}
