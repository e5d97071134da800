// Package mailbox is the mailbox relay: two devices of a link exchange
// end-to-end encrypted envelopes through a mailbox with two directions,
// stored durably (package store), watched over WebSockets, and rate-limited
// per mailbox. The relay checks only the outside of an envelope.
package mailbox

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/envcache"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ws"
	"edgerelay/store"
)

// Config wires a Handler.
type Config struct {
	Store *store.EnvelopeLog
	Apps  map[string]App
	Log   *slog.Logger
	// Idle is RELAY_IDLE: a mailbox with no claim and no write for this
	// long is gone.
	Idle time.Duration
	// TouchEvery is how far a mailbox's last activity may run ahead of
	// what the store holds: a write stores the mailbox's record beside
	// the envelope only when it has moved this far, and a crash can make
	// a mailbox expire that much early. 0 (what serve uses) is a
	// hundredth of Idle, at most a minute. The benchmarks, whose clock
	// moves a second per reading, set it beyond their run so that, as
	// with a real clock at thousands of writes per second, a write
	// almost never carries the record.
	TouchEvery time.Duration
	// MaxEnvelope, MaxStored, MaxStoredBytes: RELAY_MAX_ENVELOPE,
	// RELAY_MAX_STORED, RELAY_MAX_STORED_BYTES.
	MaxEnvelope, MaxStored, MaxStoredBytes int
	// PingInterval (30 s) and SilenceTimeout (75 s) of watch sockets.
	PingInterval, SilenceTimeout time.Duration
	// MaxBehind is how far a watcher may fall behind before 1013 (1 MiB).
	MaxBehind int
	// EnvelopeCache is RELAY_ENVELOPE_CACHE: the bytes of recently read
	// envelopes kept in memory, so that reading one again skips Pebble's
	// read path. 0 is DefaultEnvelopeCache; negative, none.
	EnvelopeCache int
	// MaxLoaded bounds the mailboxes kept in memory (see cache): 0 is
	// DefaultMaxLoaded. Past it, a mailbox nothing holds is dropped and
	// read from the store again when next used.
	MaxLoaded int
	Metrics   *Metrics
	// ICE configures the ice endpoint of apps that enable it.
	ICE ICEConfig
	// Push holds the loaded push modules.
	Push Pushers
	// DetachSockets serves watch and signal sockets off fasthttp's hijack
	// goroutine (see ws.Options.Detach); the server must keep hijacked
	// connections.
	DetachSockets bool
	// Now is the clock (time.Now by default); tests move it to refill
	// buckets and expire mailboxes.
	Now func() time.Time
}

// Handler serves the mailbox endpoints.
type Handler struct {
	cfg   Config
	apps  map[string]*App
	log   *slog.Logger
	m     *Metrics
	cache *cache
	// envs holds copies of recent envelopes (nil: none), keyed by the
	// mailbox's epoch.
	envs   *envcache.Cache
	limits *limits
	group  ws.Group
	// pushJobs queues wake-ups for the push senders (bounded).
	pushJobs chan pushJob
}

// Limits of the spec.
const (
	maxBatchLimit   = 1000
	defaultBatch    = 100
	maxBatchBytes   = 4 << 20
	maxWatchers     = 8
	foregroundFor   = 45 * time.Second
	minEnvelopeSize = 25
)

// DefaultEnvelopeCache is RELAY_ENVELOPE_CACHE's default: 32 MiB.
const DefaultEnvelopeCache = 32 << 20

// DefaultMaxLoaded is how many mailboxes stay in memory by default:
// 131,072 entries of about 500 bytes each (both directions loaded and a
// rate-limit bucket; TestLoadedMailboxBytes measures it) are about 64 MiB
// at most.
const DefaultMaxLoaded = 1 << 17

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
	if cfg.Idle <= 0 {
		cfg.Idle = 720 * time.Hour
	}
	if cfg.MaxEnvelope <= 0 {
		cfg.MaxEnvelope = 65536
	}
	if cfg.MaxStored <= 0 {
		cfg.MaxStored = 4096
	}
	if cfg.MaxStoredBytes <= 0 {
		cfg.MaxStoredBytes = 32 << 20
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
	if cfg.EnvelopeCache == 0 {
		cfg.EnvelopeCache = DefaultEnvelopeCache
	}
	if cfg.MaxLoaded <= 0 {
		cfg.MaxLoaded = DefaultMaxLoaded
	}
	envs := envcache.New(cfg.EnvelopeCache)
	cfg.Metrics.envelopeCache.Store(envs)
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
	h := &Handler{cfg: cfg, apps: apps, log: cfg.Log, m: cfg.Metrics, cache: newCache(cfg.MaxLoaded), envs: envs, limits: lim,
		pushJobs: make(chan pushJob, pushQueue)}
	cfg.Metrics.loaded.Store(h.cache)
	return h, nil
}

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(ctx *fasthttp.RequestCtx) {
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
	var nb [store.MaxMailboxName]byte
	name := append(append(append(nb[:0], r.app.Name...), '/'), r.id...)
	now := h.cfg.Now().UnixNano()
	tokHash := httpx.Hash(tok)

	method := string(ctx.Method())
	claim := r.kind == routeMailbox && method == fasthttp.MethodPut
	if claim && len(ctx.Request.Body()) != 0 {
		errBadRequest.answer(ctx)
		return
	}
	m := h.mailboxFor(ctx, name, tokHash, now, claim)
	if m == nil {
		return
	}
	defer h.cache.release(m)
	if claim {
		h.claim(ctx, m, tokHash, now)
		return
	}
	if ok := h.authorize(ctx, m, tokHash, now); !ok {
		return
	}
	switch {
	case r.kind == routeMailbox && method == fasthttp.MethodDelete:
		if h.take(ctx, h.limits.fetches, m.key, now) {
			h.erase(ctx, m)
		}
	case r.kind == routeEnvelope && method == fasthttp.MethodPut:
		h.put(ctx, m, r, tok, now)
	case r.kind == routeEnvelope && (method == fasthttp.MethodGet || method == fasthttp.MethodHead):
		if h.take(ctx, h.limits.fetches, m.key, now) {
			h.getOne(ctx, m, r, method == fasthttp.MethodHead)
		}
	case r.kind == routeDirection && method == fasthttp.MethodGet:
		if h.take(ctx, h.limits.fetches, m.key, now) {
			h.batch(ctx, m, r)
		}
	case r.kind == routeDirection && method == fasthttp.MethodHead:
		if h.take(ctx, h.limits.fetches, m.key, now) {
			h.head(ctx, m, r)
		}
	case r.kind == routeDirection && method == fasthttp.MethodDelete:
		if h.take(ctx, h.limits.fetches, m.key, now) {
			h.prune(ctx, m, r)
		}
	case r.kind == routeWatch && method == fasthttp.MethodGet:
		h.watch(ctx, m, r, now)
	case r.kind == routeSignal && method == fasthttp.MethodGet:
		h.signal(ctx, m, r, now)
	case r.kind == routeICE && method == fasthttp.MethodGet:
		h.ice(ctx, m, now)
	case r.kind == routePush:
		h.register(ctx, m, r, tok, now)
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

// touchEvery is Config.TouchEvery in nanoseconds, its default filled in.
func (h *Handler) touchEvery() int64 {
	if h.cfg.TouchEvery > 0 {
		return int64(h.cfg.TouchEvery)
	}
	return min(int64(h.cfg.Idle)/100, int64(time.Minute))
}

// expired reports whether a loaded mailbox has been idle too long (mu held).
func (h *Handler) expired(m *mailbox, now int64) bool {
	return m.exists && now-m.rec.LastActive > int64(h.cfg.Idle)
}

// authorize checks that the mailbox exists (and has not expired) and that
// tok is its token; it answers 404 or 403 otherwise.
func (h *Handler) authorize(ctx *fasthttp.RequestCtx, m *mailbox, tok store.Hash, now int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastUse = now
	if err := m.load(h.cfg.Store); err != nil {
		h.internal(ctx, err)
		return false
	}
	if !m.exists || h.expired(m, now) {
		errNotFound.answer(ctx)
		return false
	}
	if subtle.ConstantTimeCompare(m.rec.Token[:], tok[:]) != 1 {
		errForbidden.answer(ctx)
		return false
	}
	return true
}

// mailboxFor returns the mailbox of a request, held (release it), or nil
// when it has answered. A mailbox in memory is returned as it is, for
// authorize or claim to decide under its lock. One that is not is first
// read from the store without making an entry, and only a request that
// would pass authorize (or a claim that would not be 409) makes one: a
// refused request keeps nothing, so unauthenticated requests of random
// ids cannot fill memory. The entry made loads the record again under its
// lock, since the store may have changed between the two reads.
func (h *Handler) mailboxFor(ctx *fasthttp.RequestCtx, name []byte, tok store.Hash, now int64, claim bool) *mailbox {
	if m := h.cache.lookup(name); m != nil {
		return m
	}
	key := string(name) // a miss reads the store anyway
	rec, err := h.cfg.Store.Mailbox(key)
	exists := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.internal(ctx, fmt.Errorf("mailbox: peek %s: %w", key, err))
		return nil
	}
	live := exists && now-rec.LastActive <= int64(h.cfg.Idle)
	mine := live && subtle.ConstantTimeCompare(rec.Token[:], tok[:]) == 1
	switch {
	case claim && live && !mine:
		errTaken.answer(ctx)
		return nil
	case claim:
	case !live:
		errNotFound.answer(ctx)
		return nil
	case !mine:
		errForbidden.answer(ctx)
		return nil
	}
	return h.cache.acquire(name)
}

func (h *Handler) internal(ctx *fasthttp.RequestCtx, err error) {
	if h.unavailable(ctx, err) {
		return
	}
	h.log.Error("mailbox request failed", "err", err)
	errInternal.answer(ctx)
}

// claim is PUT /v1/<app>/mailbox/<id>.
func (h *Handler) claim(ctx *fasthttp.RequestCtx, m *mailbox, tok store.Hash, now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastUse = now
	if err := m.load(h.cfg.Store); err != nil {
		h.internal(ctx, err)
		return
	}
	expired := h.expired(m, now)
	taken := m.exists && !expired && subtle.ConstantTimeCompare(m.rec.Token[:], tok[:]) != 1
	if taken {
		errTaken.answer(ctx)
		return
	}
	// A claim refused as taken spends no token: like a 403, it keeps
	// nothing for the mailbox (no bucket) for a request it refuses.
	if !h.take(ctx, h.limits.fetches, m.key, now) {
		return
	}
	if m.exists && !expired {
		// A heartbeat: restarts the idle timer like a write, durably.
		rec := store.MailboxRecord{Token: tok, LastActive: now}
		if err := h.cfg.Store.Claim(m.name, rec, m.persisted, false); err != nil {
			h.internal(ctx, err)
			return
		}
		m.rec, m.persisted = rec, now
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	if expired {
		h.waitInflight(m)
		for _, c := range m.forget() {
			c.Close(ws.CloseNormal, "mailbox expired")
		}
	}
	rec := store.MailboxRecord{Token: tok, LastActive: now}
	// Only an expired holder can have left anything behind (erase and
	// the sweep remove everything at once); a fresh claim of a name never
	// used writes no range deletion, which would slow every later read.
	if err := h.cfg.Store.Claim(m.name, rec, 0, expired); err != nil {
		h.internal(ctx, err)
		return
	}
	m.exists, m.rec, m.persisted = true, rec, now
	m.epoch = h.cache.nextEpoch()
	for i := range m.dirs {
		m.dirs[i].loaded = false
	}
	h.m.mailboxesCreated.Inc()
	ctx.SetStatusCode(fasthttp.StatusCreated)
}

// waitInflight waits until no write of m is in flight (mu held on entry
// and on return), so that an erase cannot be overtaken by a write's sync.
func (h *Handler) waitInflight(m *mailbox) {
	for {
		var ch chan struct{}
		for i := range m.dirs {
			for seq := range m.dirs[i].inflight {
				ch, _ = m.dirs[i].settled(seq)
				break
			}
		}
		if ch == nil {
			return
		}
		m.mu.Unlock()
		<-ch
		m.mu.Lock()
	}
}

// erase is DELETE /v1/<app>/mailbox/<id>.
func (h *Handler) erase(ctx *fasthttp.RequestCtx, m *mailbox) {
	m.mu.Lock()
	h.waitInflight(m)
	if err := h.cfg.Store.Erase(m.name); err != nil {
		m.mu.Unlock()
		h.internal(ctx, err)
		return
	}
	conns := m.forget()
	m.mu.Unlock()
	for _, c := range conns {
		c.Close(ws.CloseNormal, "mailbox erased")
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// Drain closes every watch socket with 1001 and waits, or until ctx ends.
func (h *Handler) Drain(ctx context.Context) error {
	return h.group.Drain(ctx, ws.CloseGoingAway)
}

// Open is the number of open watch sockets.
func (h *Handler) Open() int { return h.group.Len() }
