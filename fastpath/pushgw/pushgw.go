// Package pushgw is the push gateway (spec/push-gateway.md): a mount that
// lets self-hosted servers deliver native push to one published app
// through the operator's FCM service account or APNs key, with a per-server
// API key. Existing clients of the reference gateway (two Cloudflare
// Workers) call it, so routes, status codes, error strings, headers and
// body shapes are the reference's, byte for byte.
//
// One Handler is one mount and delivers through one provider. Two mounts in
// one process share a key store (store.PushGatewayStore: keys, device-token
// claims, daily budget, minute limits) or keep one each, as the operator
// configures. The store is Pebble's (one process) or the cluster's; the
// handler does not know which.
//
// # Listener settings
//
// The gateway answers body-size refusals itself, with its own error shape
// and a request id, so its listener must be run with:
//
//	MaxRequestBodySize: MaxBodyBytes
//	StreamRequestBody:  true                   // the handler sees the request before its body
//	ErrorHandler:       h.ServeError           // fasthttp's own refusals in the gateway's shape
//	AnswerBeforeBody:   h.AnswersFromHeaders   // server.Service; server.AnswerBeforeBody for a bare fasthttp.Server
//
// With StreamRequestBody the order of checks is the spec's exactly: a
// caller without a key gets 401 even for an oversized body, and a
// Content-Length over the limit is refused from the header, the body never
// buffered. fasthttp still reads up to 8 KiB of a body before it calls the
// handler, and answers "Expect: 100-continue" with "100 Continue" first;
// AnswersFromHeaders tells the listener which requests are refused from
// their headers, so that those are answered at once, before any body byte
// is read, and an Expect gets the refusal. Without StreamRequestBody,
// fasthttp refuses an oversized body before the handler runs, reading
// nothing of a too-long Content-Length; ServeError answers that with the
// same 413, but it then precedes the key check.
//
// Per-key minute limits are kept per mount (as the reference kept them per
// worker), in the key store so that they are exact across cluster nodes;
// the daily budget and the device-token claims belong to the key store,
// so mounts that share a store share them.
package pushgw

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/server"
	"edgerelay/push/apns"
	"edgerelay/push/fcm"
	"edgerelay/store"
)

// Providers, the values of Config.Provider.
const (
	ProviderFCM  = "fcm"
	ProviderAPNs = "apns"
)

// Body limits.
const (
	// MaxBodyBytes is the largest /send body; the listener's
	// MaxRequestBodySize must be this.
	MaxBodyBytes = 16 << 10
	// maxRegisterBody is the largest /register body.
	maxRegisterBody = 4 << 10
)

// Limits of /register.
const (
	registerPerMinute = 5
	// retryMinute is the Retry-After of both minute limits: the reference
	// reports its fixed window, not the exact wait.
	retryMinute = 60
)

// Config wires one gateway mount.
type Config struct {
	// Provider is ProviderFCM or ProviderAPNs.
	Provider string
	// APNs and APNsTopic deliver for an APNs mount; APNsEnvironment is
	// RELAY_APNS_ENVIRONMENT as the operator wrote it. A nil client (no
	// usable key) leaves the mount unconfigured: /health says so and /send
	// answers 500 "relay not configured" after validating the request.
	APNs            *apns.Client
	APNsTopic       string
	APNsEnvironment string
	// FCM delivers for an FCM mount; nil leaves it unconfigured.
	FCM *fcm.Client
	// Store is the mount's key store. Mounts that share keys share one
	// store value.
	Store store.PushGatewayStore
	// Registration opens POST /register.
	Registration bool
	// RatePerMinute is the per-key send limit (>= 1).
	RatePerMinute int
	// DailyBudget is the number of sends per UTC day, all keys together,
	// when Metered; 0 closes the gateway. Not Metered: unmetered.
	DailyBudget int
	Metered     bool
	// TrustedProxyHeader names the header a trusted reverse proxy sets to
	// the client's address (CF-Connecting-IP, X-Forwarded-For, ...). When
	// set, /register buckets by it (its last comma-separated element) and
	// refuses requests without a usable one; when empty, by the
	// connection's address.
	TrustedProxyHeader string
	// Log receives one JSON line per request and event lines; nil discards.
	Log *slog.Logger
	// Metrics is shared by the mounts of a process; nil: unregistered.
	Metrics *Metrics
	// Now is the clock, for tests; nil means time.Now.
	Now func() time.Time
}

// Handler serves one gateway mount.
type Handler struct {
	provider    string
	sender      sender // nil: not configured
	store       store.PushGatewayStore
	register    bool
	perMinute   int
	metered     bool
	budget      int64
	proxyHeader string
	rate        store.PushRateLimiter // per API key, this mount's
	regRate     store.PushRateLimiter // per address bucket, this mount's
	log         *slog.Logger
	m           *mountMetrics
	now         func() time.Time
	health      []byte // the /health body, fixed at New
	scratch     sync.Pool
	lastSweep   atomic.Int64
}

// New checks cfg and returns the mount's handler. It refuses what would
// otherwise fail silently later: an unknown provider, no store, a rate
// limit under 1, a negative budget.
func New(cfg Config) (*Handler, error) {
	if cfg.Provider != ProviderFCM && cfg.Provider != ProviderAPNs {
		return nil, fmt.Errorf("pushgw: provider %q: want %q or %q", cfg.Provider, ProviderFCM, ProviderAPNs)
	}
	if cfg.Store == nil {
		return nil, errors.New("pushgw: no key store")
	}
	if cfg.RatePerMinute < 1 {
		return nil, fmt.Errorf("pushgw: rate per minute %d: want at least 1", cfg.RatePerMinute)
	}
	if cfg.Metered && cfg.DailyBudget < 0 {
		return nil, fmt.Errorf("pushgw: daily budget %d: want 0 (closed) or more", cfg.DailyBudget)
	}
	rate, err := cfg.Store.RateLimiter("send."+cfg.Provider, cfg.RatePerMinute)
	if err != nil {
		return nil, fmt.Errorf("pushgw: rate limit: %w", err)
	}
	regRate, err := cfg.Store.RateLimiter("register."+cfg.Provider, registerPerMinute)
	if err != nil {
		return nil, fmt.Errorf("pushgw: registration limit: %w", err)
	}
	h := &Handler{
		provider: cfg.Provider, store: cfg.Store, register: cfg.Registration,
		perMinute: cfg.RatePerMinute, metered: cfg.Metered, budget: int64(cfg.DailyBudget),
		proxyHeader: strings.TrimSpace(cfg.TrustedProxyHeader),
		rate:        rate, regRate: regRate,
		log: cfg.Log, now: cfg.Now,
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	metrics := cfg.Metrics
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	h.m = metrics.mount(cfg.Provider)
	switch cfg.Provider {
	case ProviderAPNs:
		if cfg.APNs != nil && strings.TrimSpace(cfg.APNsTopic) != "" && apnsEnvironmentOK(cfg.APNsEnvironment) {
			h.sender = &apnsSender{c: cfg.APNs, topic: strings.TrimSpace(cfg.APNsTopic)}
		}
	case ProviderFCM:
		if cfg.FCM != nil {
			h.sender = &fcmSender{c: cfg.FCM}
		}
	}
	h.health = fmt.Appendf(nil, `{"ok":true,"configured":%t,"rateLimits":{"perMinute":%d},"registrationEnabled":%t}`,
		h.sender != nil, h.perMinute, h.register)
	h.scratch.New = func() any { return newScratch() }
	return h, nil
}

// apnsEnvironmentOK accepts what the reference accepts: empty,
// "production" or "sandbox", case-insensitive, trimmed. Anything else
// leaves the mount unconfigured rather than guessing a host.
func apnsEnvironmentOK(env string) bool {
	switch strings.ToLower(strings.TrimSpace(env)) {
	case "", "production", "sandbox":
		return true
	}
	return false
}

// Configured reports whether the mount can deliver (what /health says).
func (h *Handler) Configured() bool { return h.sender != nil }

// Drain writes the daily budget's exact count in place of its reservation
// (see store.PushGateway.FlushBudget; a no-op where the budget is exact), so that a clean stop forfeits no
// budget. Sends still running, and those that keep-alive connections
// bring before the listener's shutdown closes them, count exactly too:
// after the flush every draw writes its count. It fits
// server.Service.Drain.
func (h *Handler) Drain(context.Context) error {
	if err := h.store.FlushBudget(); err != nil {
		return fmt.Errorf("pushgw: %w", err)
	}
	return nil
}

// ServeHTTP routes one request. Exactly GET /health, POST /send and POST
// /register exist; a trailing slash and the query are ignored; everything
// else is 404. Every answer carries a fresh X-Request-Id.
func (h *Handler) ServeHTTP(ctx *fasthttp.RequestCtx) {
	r := request{start: time.Now()}
	newUUID(&r.id)
	ctx.Response.Header.SetBytesV("X-Request-Id", r.id[:])
	defer h.finish(ctx, &r)

	path := ctx.Path()
	if len(path) > 1 && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	switch string(path) {
	case "/health":
		if ctx.IsGet() {
			r.route = routeHealth
			h.json(ctx, &r, fasthttp.StatusOK, h.health)
			return
		}
	case "/send":
		if ctx.IsPost() {
			r.route = routeSend
			h.send(ctx, &r)
			return
		}
	case "/register":
		if ctx.IsPost() {
			r.route = routeRegister
			h.registerKey(ctx, &r)
			return
		}
	}
	h.fail(ctx, &r, fasthttp.StatusNotFound, "not found")
}

// ServeError answers the refusals fasthttp makes before the handler runs
// (oversized body or headers, a timeout, garbage) in the gateway's shape,
// with a request id. Use it as the listener's ErrorHandler.
func (h *Handler) ServeError(ctx *fasthttp.RequestCtx, err error) {
	r := request{start: time.Now()}
	newUUID(&r.id)
	ctx.Response.Header.SetBytesV("X-Request-Id", r.id[:])
	defer h.finish(ctx, &r)
	status, msg := server.Refusal(err)
	h.fail(ctx, &r, status, msg)
}

// finish logs the request line and counts the answer. It also turns a
// panic into a 500: by the time it runs, every claim of the request has
// been settled by its own deferred call.
func (h *Handler) finish(ctx *fasthttp.RequestCtx, r *request) {
	if p := recover(); p != nil {
		h.log.Error("panic", "event", "panic", "requestId", string(r.id[:]), "panic", fmt.Sprint(p))
		ctx.Response.ResetBody()
		ctx.Response.Header.Del("Retry-After")
		h.fail(ctx, r, fasthttp.StatusInternalServerError, "internal error")
	}
	status := ctx.Response.StatusCode()
	h.m.answer(r.route, status)
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
	}
	if !h.log.Enabled(context.Background(), level) {
		return
	}
	path := ctx.Path()
	if len(path) > 200 {
		path = path[:200]
	}
	h.log.LogAttrs(context.Background(), level, "request",
		slog.Int64("ts", r.start.UnixMilli()),
		slog.String("requestId", string(r.id[:])),
		slog.String("event", "request"),
		slog.String("method", string(ctx.Method())),
		slog.String("path", string(path)),
		slog.Int("status", status),
		slog.Float64("durationMs", float64(time.Since(r.start).Microseconds())/1000),
	)
}

// sweep evicts idle rate-limit buckets at most once a minute, from the
// request that notices it is due, so memory follows the active keys and
// addresses without a background goroutine (where the store holds them in
// the process).
func (h *Handler) sweep(now time.Time) {
	n := now.UnixNano()
	last := h.lastSweep.Load()
	if n-last < int64(time.Minute) || !h.lastSweep.CompareAndSwap(last, n) {
		return
	}
	go func() {
		h.rate.Sweep(now)
		h.regRate.Sweep(now)
	}()
}

// retryAfterHeader sets Retry-After to s seconds.
func retryAfterHeader(ctx *fasthttp.RequestCtx, s int64) {
	var b [20]byte
	ctx.Response.Header.SetBytesV("Retry-After", strconv.AppendInt(b[:0], s, 10))
}
