// Package mailbox is the mailbox relay: two devices of a link exchange
// end-to-end encrypted envelopes through a mailbox with two directions,
// stored durably (package store), watched over WebSockets, and rate-limited
// per mailbox. The relay checks only the outside of an envelope.
package mailbox

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/cors"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ws"
	routes "edgerelay/route"
	"edgerelay/store"
)

// Config wires a Handler.
type Config struct {
	// Store keeps the mailboxes and makes their decisions (who holds one,
	// whether an envelope is new, over a limit): store/mailboxlocal on a
	// single node, store/cluster/mailboxjs in a cluster.
	Store store.Mailboxes
	Apps  map[string]App
	Log   *slog.Logger
	// SweepEvery is how often Run asks the store to expire idle
	// mailboxes (default a minute; serve uses RELAY_IDLE/4 when shorter).
	SweepEvery time.Duration
	// MaxEnvelope is RELAY_MAX_ENVELOPE.
	MaxEnvelope int
	// PingInterval (30 s) and SilenceTimeout (75 s) of watch sockets.
	PingInterval, SilenceTimeout time.Duration
	// MaxBehind is how far a watcher may fall behind before 1013 (1 MiB).
	MaxBehind int
	Metrics   *Metrics
	// ICE configures the ice endpoint of apps that enable it.
	ICE ICEConfig
	// Push holds the loaded push modules.
	Push Pushers
	// Signals is where the two sides of a signal rendezvous meet (nil: on
	// this node, routes.NewLocalSignals; a cluster's meet across nodes).
	Signals routes.Signals
	// DetachSockets serves watch and signal sockets off fasthttp's hijack
	// goroutine (see ws.Options.Detach); the server must keep hijacked
	// connections.
	DetachSockets bool
	// Parker, with DetachSockets, parks idle watch and signal sockets off
	// their goroutines (ws.Options.Parker); nil: a reader goroutine per
	// socket.
	Parker *ws.Parker
	// Now is the clock (time.Now by default); tests move it to refill
	// buckets and expire mailboxes.
	Now func() time.Time
	// CORS lets pages on other origins call the endpoints
	// (cors.New(RELAY_CORS_ORIGINS, CORSRules())); nil is off.
	CORS *cors.Policy
}

// Handler serves the mailbox endpoints.
type Handler struct {
	cfg  Config
	apps map[string]*App
	log  *slog.Logger
	m    *Metrics
	// seed keys the per-mailbox rate-limit buckets by the name's hash.
	seed   maphash.Seed
	limits *limits
	group  ws.Group
	// watchWS and signalWS are the sockets' settings, shared by every
	// socket of each kind.
	watchWS, signalWS *ws.Settings
	// pushJobs queues wake-ups for the push senders (bounded).
	pushJobs chan pushJob
	// names pools the buffers a request's mailbox name is built in: the
	// name is handed to the store through an interface, so a stack buffer
	// would escape (one allocation per request).
	names sync.Pool
}

// Limits of the spec.
const (
	maxBatchLimit   = 1000
	defaultBatch    = 100
	maxBatchBytes   = 4 << 20
	foregroundFor   = 45 * time.Second
	minEnvelopeSize = 25
)

// WriteBufferSize is the mailbox listener's answer buffer (see
// server.Service): 16 answers of 1 KiB envelopes to pipelined GETs leave
// in two writes instead of five with fasthttp's 4 KiB, which took a GET
// from 3.7 to 2.5 µs of server CPU (pinnedcompare, 16 pipelined). An
// idle keep-alive connection holds it; a watch socket, hijacked, does not.
const WriteBufferSize = 16 << 10

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Minute
	}
	if cfg.MaxEnvelope <= 0 {
		cfg.MaxEnvelope = 65536
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 30 * time.Second
	}
	if cfg.SilenceTimeout <= 0 {
		cfg.SilenceTimeout = 75 * time.Second
	}
	if cfg.MaxBehind <= 0 {
		cfg.MaxBehind = 1 << 20
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	lim, err := newLimits()
	if err != nil {
		return nil, err
	}
	apps := make(map[string]*App, len(cfg.Apps))
	for name, a := range cfg.Apps {
		if a.ICE && !cfg.ICE.Enabled() {
			return nil, fmt.Errorf("RELAY_APPS: app %q enables ice, but neither RELAY_TURN_SECRET (with the TURN listener or RELAY_TURN_RELAY_IP) nor RELAY_CF_TURN_KEY_ID and RELAY_CF_TURN_API_TOKEN are set", name)
		}
		apps[name] = &a
	}
	if cfg.Store == nil {
		return nil, errors.New("mailbox: no store")
	}
	if cfg.Signals == nil {
		cfg.Signals = routes.NewLocalSignals()
	}
	h := &Handler{cfg: cfg, apps: apps, log: cfg.Log, m: cfg.Metrics, seed: maphash.MakeSeed(), limits: lim,
		pushJobs: make(chan pushJob, pushQueue)}
	h.names.New = func() any { return new([store.MaxMailboxName]byte) }
	h.watchWS = ws.NewSettings(ws.Options{
		MaxMessage:     1024,
		MaxQueue:       cfg.MaxBehind,
		OverflowCode:   ws.CloseTryAgainLater,
		PingInterval:   cfg.PingInterval,
		SilenceTimeout: cfg.SilenceTimeout,
		ReadBufferSize: 512,
		Detach:         cfg.DetachSockets,
		Parker:         cfg.Parker,
		// watchFrame never blocks (a mark under a mutex, a queued pong):
		// a parked watch's text ping is answered on the parker's goroutine.
		InlineMessages: true,
	})
	h.signalWS = ws.NewSettings(ws.Options{
		MaxMessage:     maxSignalFrame,
		MaxQueue:       cfg.MaxBehind,
		OverflowCode:   ws.CloseTryAgainLater,
		PingInterval:   cfg.PingInterval,
		SilenceTimeout: cfg.SilenceTimeout,
		ReadBufferSize: 4096,
		Detach:         cfg.DetachSockets,
		Parker:         cfg.Parker,
	})
	if r, ok := cfg.Store.(store.MailboxStatsReporter); ok {
		cfg.Metrics.stats.Store(&r)
	}
	// Every node closes its sockets of a mailbox erased or expired
	// anywhere (a watch ends by itself; signal sockets are the router's).
	cfg.Store.OnGone(cfg.Signals.CloseAll)
	return h, nil
}

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(ctx *fasthttp.RequestCtx) {
	// A browser's preflight carries no bearer: it is answered before
	// anything is parsed or authorized, and keeps nothing.
	if h.cfg.CORS.Preflight(ctx) {
		return
	}
	h.cfg.CORS.Decorate(ctx)
	r, problem := parsePath(ctx.Path(), h.apps)
	switch problem {
	case pathNotFound:
		errNotFound.answer(ctx)
		return
	case pathBad:
		errBadRequest.answer(ctx)
		return
	}
	// An extension the app has not enabled answers exactly like an
	// unknown path.
	if (r.kind == routePush && r.app.PushTopic == "") || (r.kind == routeSignal && !r.app.Signal) || (r.kind == routeICE && !r.app.ICE) {
		errNotFound.answer(ctx)
		return
	}
	tok := h.bearer(ctx, r.kind == routeWatch || r.kind == routeSignal)
	if !validBearer(tok) {
		errUnauthorized.answer(ctx)
		return
	}
	nb := h.names.Get().(*[store.MaxMailboxName]byte)
	defer h.names.Put(nb)
	name := append(append(append(nb[:0], r.app.Name...), '/'), r.id...)
	now := h.cfg.Now().UnixNano()
	tokHash := httpx.Hash(tok)

	method := string(ctx.Method())
	if r.kind == routeMailbox && method == fasthttp.MethodPut {
		if len(ctx.Request.Body()) != 0 {
			errBadRequest.answer(ctx)
			return
		}
		h.claim(ctx, name, tokHash, now)
		return
	}
	m, err := h.cfg.Store.Open(context.Background(), name, tokHash, now)
	if err != nil {
		h.refuse(ctx, err)
		return
	}
	defer m.Release()
	key := maphash.Bytes(h.seed, name)
	switch {
	case r.kind == routeMailbox && method == fasthttp.MethodDelete:
		if h.take(ctx, h.limits.fetches, key, now) {
			h.erase(ctx, m)
		}
	case r.kind == routeEnvelope && method == fasthttp.MethodPut:
		h.put(ctx, m, r, tok, tokHash, now)
	case r.kind == routeEnvelope && (method == fasthttp.MethodGet || method == fasthttp.MethodHead):
		if h.take(ctx, h.limits.fetches, key, now) {
			h.getOne(ctx, m, r, method == fasthttp.MethodHead)
		}
	case r.kind == routeDirection && method == fasthttp.MethodGet:
		if h.take(ctx, h.limits.fetches, key, now) {
			h.batch(ctx, m, r)
		}
	case r.kind == routeDirection && method == fasthttp.MethodHead:
		if h.take(ctx, h.limits.fetches, key, now) {
			h.head(ctx, m, r)
		}
	case r.kind == routeDirection && method == fasthttp.MethodDelete:
		if h.take(ctx, h.limits.fetches, key, now) {
			h.prune(ctx, m, r)
		}
	case r.kind == routeWatch && method == fasthttp.MethodGet:
		h.watch(ctx, m, r, key, now)
	case r.kind == routeSignal && method == fasthttp.MethodGet:
		h.signal(ctx, m, r, key, tokHash, now)
	case r.kind == routeICE && method == fasthttp.MethodGet:
		h.ice(ctx, key, now)
	case r.kind == routePush:
		h.register(ctx, m, r, tok, key, now)
	default:
		errNotFound.answer(ctx)
	}
}

// bearer reads the token from Authorization, or for a WebSocket from the
// zerobyte.bearer.<token> subprotocol that browsers must use.
func (h *Handler) bearer(ctx *fasthttp.RequestCtx, socket bool) []byte {
	if tok := httpx.Bearer(ctx); tok != nil || !socket {
		return tok
	}
	var tok []byte
	ws.Subprotocols(ctx, func(p []byte) bool {
		if t, ok := cutPrefix(p, "zerobyte.bearer."); ok {
			tok = t
			return false
		}
		return true
	})
	return tok
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return nil, false
	}
	return b[len(prefix):], true
}

// take spends one token of set for key, answering 429 when it is empty.
func (h *Handler) take(ctx *fasthttp.RequestCtx, set interface {
	Take(uint64, int64) (bool, time.Duration)
}, key uint64, now int64) bool {
	ok, retry := set.Take(key, now)
	if !ok {
		h.m.rateLimited.Inc()
		rateLimited(ctx, int64(retry))
	}
	return ok
}

// refuse answers an Open the store refused.
func (h *Handler) refuse(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		errNotFound.answer(ctx)
	case errors.Is(err, store.ErrForbidden):
		errForbidden.answer(ctx)
	default:
		h.internal(ctx, err)
	}
}

func (h *Handler) internal(ctx *fasthttp.RequestCtx, err error) {
	if h.unavailable(ctx, err) {
		return
	}
	h.log.Error("mailbox request failed", "err", err)
	errInternal.answer(ctx)
}

// claim is PUT /v1/<app>/mailbox/<id>. A claim refused as taken spends no
// token: like a 403, it keeps nothing for the mailbox (no bucket) for a
// request it refuses, so whether another token holds it is asked first.
func (h *Handler) claim(ctx *fasthttp.RequestCtx, name []byte, tok store.Hash, now int64) {
	bg := context.Background()
	switch m, err := h.cfg.Store.Open(bg, name, tok, now); {
	case err == nil:
		m.Release()
	case errors.Is(err, store.ErrForbidden):
		errTaken.answer(ctx)
		return
	case !errors.Is(err, store.ErrNotFound):
		h.internal(ctx, err)
		return
	}
	if !h.take(ctx, h.limits.fetches, maphash.Bytes(h.seed, name), now) {
		return
	}
	outcome, err := h.cfg.Store.Claim(bg, name, tok, now)
	switch {
	case err != nil:
		h.internal(ctx, err)
	case outcome == store.ClaimCreated:
		h.m.mailboxesCreated.Inc()
		ctx.SetStatusCode(fasthttp.StatusCreated)
	case outcome == store.ClaimSame:
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	default:
		errTaken.answer(ctx)
	}
}

// erase is DELETE /v1/<app>/mailbox/<id>: the store ends every watch of
// it on every node, and OnGone closes the signal sockets.
func (h *Handler) erase(ctx *fasthttp.RequestCtx, m store.Mailbox) {
	if err := m.Erase(context.Background()); err != nil {
		h.internal(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// Drain closes every watch socket with 1001 and waits, or until ctx ends.
func (h *Handler) Drain(ctx context.Context) error {
	return h.group.Drain(ctx, ws.CloseGoingAway)
}

// Open is the number of open watch sockets.
func (h *Handler) Open() int { return h.group.Len() }
