// Package pushgwbench measures the push gateway end to end: POST /send
// over loopback HTTP into the real handler (fastpath/pushgw) on a fasthttp
// listener configured as the relay runs it, delivered over HTTP/2 to the
// fake APNs of push/pushtest, which verifies every provider token and
// payload. Everything runs in one process, so the CPU figures include the
// load generator and the fake provider: they understate the gateway's own
// throughput.
package pushgwbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/pushgw"
	"edgerelay/push/apns"
	"edgerelay/push/pushtest"
	"edgerelay/store"
)

// Options shape a rig.
type Options struct {
	// Metered turns the daily budget on (with a budget that never runs
	// out), so that every send also draws from it.
	Metered bool
	// Tokens is how many distinct device tokens the sends cycle through
	// (each is claimed by its first send); 0 means 1024.
	Tokens int
}

// Rig is one gateway mount with its fake APNs and a client.
type Rig struct {
	APNs   *pushtest.FakeAPNs
	h      *pushgw.Handler
	db     *store.DB
	srv    *fasthttp.Server
	client *fasthttp.HostClient
	key    string
	bodies [][]byte
	next   atomic.Uint64
}

// NewRig starts a rig; it stops when tb ends.
func NewRig(tb testing.TB, o Options) *Rig {
	tb.Helper()
	if o.Tokens <= 0 {
		o.Tokens = 1024
	}
	const team, kid, topic = "TEAM123456", "KEY1234567", "com.example.mail"
	p8, priv := pushtest.NewAPNsKey(tb)
	fake := pushtest.NewAPNs(tb, team, kid, &priv.PublicKey)
	fake.RequireTopic(topic)
	ac, err := apns.New(apns.Config{KeyFile: pushtest.WriteFile(tb, "AuthKey.p8", p8), KeyID: kid, TeamID: team,
		BaseURL: fake.URL(), RootCAs: fake.RootCAs()})
	if err != nil {
		tb.Fatal(err)
	}
	db, err := store.Open(tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := store.NewPushGateway(db, store.PushScopeShared)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := pushgw.New(pushgw.Config{
		Provider: pushgw.ProviderAPNs, APNs: ac, APNsTopic: topic, Store: st,
		RatePerMinute: 1 << 30, Metered: o.Metered, DailyBudget: 1 << 40,
		// Production logging, written nowhere: its cost is part of a send.
		Log: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	nk, err := (&pushgw.Keys{Store: st}).Create("bench", time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &Rig{APNs: fake, h: h, db: db, key: nk.Key}
	r.srv = &fasthttp.Server{
		Handler: h.ServeHTTP, ErrorHandler: h.ServeError,
		MaxRequestBodySize: pushgw.MaxBodyBytes, StreamRequestBody: true, NoDefaultServerHeader: true,
	}
	go func() { _ = r.srv.Serve(ln) }()
	r.client = &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 512}
	for i := range o.Tokens {
		r.bodies = append(r.bodies, fmt.Appendf(nil,
			`{"token":"%064x","title":"New message","body":"Alice: lunch at noon?","data":{"messageId":"msg-%d","url":"/read"}}`, i+1, i))
	}
	tb.Cleanup(func() {
		_ = r.srv.Shutdown()
		_ = h.Drain(context.Background())
		ac.Close()
		_ = db.Close()
	})
	return r
}

// Send posts one push and checks that it was delivered.
func (r *Rig) Send(req *fasthttp.Request, resp *fasthttp.Response) error {
	req.Reset()
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://" + r.client.Addr + "/send")
	req.Header.Set("Authorization", "Bearer "+r.key)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(r.bodies[r.next.Add(1)%uint64(len(r.bodies))])
	if err := r.client.Do(req, resp); err != nil {
		return fmt.Errorf("pushgwbench: %w", err)
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("pushgwbench: status %s: %s", strconv.Itoa(resp.StatusCode()), resp.Body())
	}
	return nil
}

// CPUTime is the process's user plus system CPU time so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
