// Package relayserve starts the servers the benchmarks compare, on
// loopback, the one way every benchmark package starts them: ours through
// fastpath/server, the listener the binary serves every service with, and
// the baselines on net/http with the same timeouts and header limit. One
// place sets those numbers, so that no comparison measures a relay served
// differently from the others (or from the binary), and a change to how
// the binary serves reaches every benchmark at once.
//
// It also holds what the mailbox benchmarks share about their relays: the
// benchmark app and bearer, and the step clock that keeps the per-mailbox
// rate limits from refusing a benchmark.
package relayserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/mailbox"
	"edgerelay/fastpath/server"
)

// The binary's default listener limits (cmd/edgerelay's configuration):
// every relay under test, ours and baseline, gets them.
const (
	HeaderTimeout  = 10 * time.Second
	IdleTimeout    = 120 * time.Second
	MaxHeaderBytes = 8192
)

// Loopback is where the relays listen unless told otherwise: any free
// port of 127.0.0.1.
const Loopback = "127.0.0.1:0"

// Relay is one server under test, listening.
type Relay struct {
	Name string
	Addr string // host:port
	// Close stops the server: ours drains its sockets (the service's
	// Drain), the baseline closes its own (closeSockets) and waits for
	// its handlers.
	Close func() error
}

// Ours serves svc through fastpath/server as the binary does, filling in
// what svc leaves zero: Addr (Loopback), the binary's default timeouts
// and header limit. It sets no connection caps: a cap of 1,000 per IP
// would refuse the memory figures' sockets, which all come from
// 127.0.0.1. Close shuts the listener down, which drains svc.Drain.
func Ours(name string, svc server.Service) (*Relay, error) {
	if svc.Name == "" {
		svc.Name = name
	}
	if svc.Addr == "" {
		svc.Addr = Loopback
	}
	if svc.HeaderTimeout == 0 {
		svc.HeaderTimeout = HeaderTimeout
	}
	if svc.IdleTimeout == 0 {
		svc.IdleTimeout = IdleTimeout
	}
	if svc.MaxHeaderBytes == 0 {
		svc.MaxHeaderBytes = MaxHeaderBytes
	}
	l, err := server.Listen(svc, noCounters{}, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("relayserve: %s: %w", name, err)
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve() }()
	return &Relay{
		Name: name,
		Addr: l.Addr().String(),
		Close: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := l.Shutdown(ctx)
			return errors.Join(err, <-served)
		},
	}, nil
}

// Baseline serves h on net/http at addr (Loopback when empty) with the
// binary's timeouts and header limit, over TLS when tlsConf is not nil.
// closeSockets, when not nil, is how Close ends the handler's hijacked
// WebSockets, which http.Server.Shutdown does not track.
func Baseline(name, addr string, h http.Handler, tlsConf *tls.Config, closeSockets func()) (*Relay, error) {
	if addr == "" {
		addr = Loopback
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("relayserve: %s: %w", name, err)
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: HeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return &Relay{
		Name: name,
		Addr: ln.Addr().String(),
		Close: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if closeSockets != nil {
				closeSockets()
			}
			err := srv.Shutdown(ctx)
			if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			return err
		},
	}, nil
}

type noCounters struct{}

func (noCounters) Refused(string) {}

// The mailbox benchmarks' app and the bearer every benchmark mailbox is
// claimed with (the shape of a real access token: 43 characters of
// base64url).
const (
	App   = "bench"
	Token = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
)

// MailboxID is the i-th benchmark mailbox's id, 22 characters like a real
// link id, so that keys and paths have their production length.
func MailboxID(i int) string { return fmt.Sprintf("bench%017d", i) }

// MailboxPath is the URL path of the i-th benchmark mailbox.
func MailboxPath(i int) string { return "/v1/" + App + "/mailbox/" + MailboxID(i) }

// IdleForever is RELAY_IDLE for the benchmark relays: a hundred years of
// a step clock is three billion readings.
const IdleForever = 100 * 365 * 24 * time.Hour

// StepClock is the mailbox relays' clock in the benchmarks: every reading
// moves it Step on (a second unless set otherwise), so every request or
// frame finds its mailbox's rate-limit buckets refilled and the limits
// never refuse a benchmark at any speed, while the buckets are still
// consulted as in production. That holds as long as no two requests in
// flight share a bucket: every writer, connection or rendezvous has
// mailboxes of its own.
type StepClock struct {
	ns   atomic.Int64
	step time.Duration
}

// NewStepClock starts a step clock at the present time.
func NewStepClock(step time.Duration) *StepClock {
	if step <= 0 {
		step = time.Second
	}
	c := &StepClock{step: step}
	c.ns.Store(time.Now().UnixNano())
	return c
}

// Now reads the clock, moving it on.
func (c *StepClock) Now() time.Time { return time.Unix(0, c.ns.Add(int64(c.step))) }

// Mailbox serves a mailbox handler (fastpath/mailbox) on addr as the
// binary serves the mailbox listener: sockets detached from fasthttp's
// buffers (the handler must be configured with DetachSockets), hijacked
// connections kept, bodies up to the largest envelope plus room for the
// headers of the request.
func Mailbox(addr string, h *mailbox.Handler) (*Relay, error) {
	return Ours("ours", server.Service{
		Name:              "mailbox",
		Addr:              addr,
		Handler:           h.ServeHTTP,
		KeepHijackedConns: true,
		MaxBodyBytes:      65536 + 4096, // the spec's largest envelope, and room
		WriteBufferSize:   mailbox.WriteBufferSize,
		Drain:             h.Drain,
	})
}

// Channel serves a private channel handler (fastpath/channel) on addr as
// the binary serves the channel listener (the handler configured with
// DetachSockets).
func Channel(addr string, h *channel.Handler) (*Relay, error) {
	return Ours("ours", server.Service{
		Name:              "channel",
		Addr:              addr,
		Handler:           h.ServeHTTP,
		KeepHijackedConns: true,
		MaxBodyBytes:      64 << 10,
		Drain:             h.Drain,
	})
}

// Agent serves an agent relay handler (fastpath/agent) on addr over TLS
// as the binary serves the agent listener: TLS 1.3 only, serverTLS being
// the listener's configuration (tlsconf.ServerConfig with TLS 1.3 on).
func Agent(addr string, h *agent.Handler, serverTLS *tls.Config) (*Relay, error) {
	return Ours("ours", server.Service{
		Name:         "agent",
		Addr:         addr,
		Handler:      h.ServeHTTP,
		TLS:          serverTLS,
		MaxBodyBytes: 64 << 10,
		Drain:        h.Drain,
	})
}
