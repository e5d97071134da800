package signalbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	baseline "edgerelay/bench/baseline/signal"
	"edgerelay/fastpath/mailbox"
	"edgerelay/fastpath/server"
	"edgerelay/store"
)

// The benchmark's app and the bearer every benchmark mailbox is claimed
// with (the shape of a real access token: 43 characters of base64url).
const (
	app   = "bench"
	token = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
)

// mailboxPath is the URL path of the i-th benchmark mailbox; its id has
// the 22 characters of a real link id.
func mailboxPath(i int) string { return fmt.Sprintf("/v1/%s/mailbox/bench%017d", app, i) }

// stepClock is both relays' clock here: every reading moves it one second
// on. A signal socket reads the clock once per frame to take from its
// side's bucket (400 frames, 50 per second), so every frame finds the
// bucket refilled and the limit never refuses a benchmark at any speed,
// while the bucket is still consulted on every frame as in production.
type stepClock struct{ ns atomic.Int64 }

func newStepClock() *stepClock {
	c := &stepClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *stepClock) Now() time.Time { return time.Unix(0, c.ns.Add(int64(time.Second))) }

// Pings and the silence rule are pushed beyond any run, so that no ping
// frame interleaves with the load and a socket idle while the other relay
// is measured is not closed. Ours still sets a read deadline per frame
// (SilenceTimeout is set, as in the binary), the baseline per message.
const (
	pingInterval   = time.Hour
	silenceTimeout = 2 * time.Hour
	// idleForever is RELAY_IDLE: a hundred years of the step clock.
	idleForever = 100 * 365 * 24 * time.Hour
)

// Relay is one relay under test, listening on loopback.
type Relay struct {
	Name string
	Addr string // host:port
	// Close stops the server and waits for its sockets.
	Close func() error
}

// StartOurs serves the real mailbox handler (fastpath/mailbox, the app
// with the signal option) through fastpath/server as the binary does:
// hijacked connections kept, sockets detached from fasthttp's buffers, the
// binary's timeouts and limits. The store lives in dir (a temporary
// directory, removed by Close, when empty); the clock is the step clock.
func StartOurs(dir string) (*Relay, error) {
	tmp := ""
	if dir == "" {
		d, err := os.MkdirTemp("", "signalbench-")
		if err != nil {
			return nil, err
		}
		tmp, dir = d, d
	}
	removeTmp := func() error {
		if tmp == "" {
			return nil
		}
		return os.RemoveAll(tmp)
	}
	db, err := store.Open(dir, nil)
	if err != nil {
		return nil, errors.Join(err, removeTmp())
	}
	h, err := mailbox.New(mailbox.Config{
		Store:          store.NewEnvelopeLog(db),
		Apps:           map[string]mailbox.App{app: {Name: app, Signal: true}},
		Idle:           idleForever,
		PingInterval:   pingInterval,
		SilenceTimeout: silenceTimeout,
		DetachSockets:  true,
		Now:            newStepClock().Now,
	})
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeTmp())
	}
	l, err := server.Listen(server.Service{
		Name:              "mailbox",
		Addr:              "127.0.0.1:0",
		Handler:           h.ServeHTTP,
		KeepHijackedConns: true,
		HeaderTimeout:     10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    8192,
		MaxBodyBytes:      65536 + 4096,
		Drain:             h.Drain,
	}, noCounters{}, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeTmp())
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve() }()
	return &Relay{
		Name: "ours",
		Addr: l.Addr().String(),
		Close: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := l.Shutdown(ctx)
			return errors.Join(err, <-served, db.Close(), removeTmp())
		},
	}, nil
}

// StartBaseline serves the net/http + gorilla/websocket baseline with the
// same timeouts, header limit and clock.
func StartBaseline() (*Relay, error) {
	h := baseline.New(baseline.Config{Apps: []string{app}, Now: newStepClock().Now, PingInterval: pingInterval})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    8192,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return &Relay{
		Name: "baseline",
		Addr: ln.Addr().String(),
		Close: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			h.CloseSockets()
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
