// Package channel is the private channel relay (botharness-private-v1 and
// v2): computers keep one control socket, phones open channels that the
// relay multiplexes onto it. The relay never opens a frame; it wraps phone
// frames into control messages and unwraps the computer's answers with the
// hand-written codec in package control.
package channel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel/control"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ws"
	"edgerelay/route"
	"edgerelay/store"
)

// The protocol's fixed numbers.
const (
	// MaxPhones is how many phone channels one computer may hold.
	MaxPhones = route.ChannelMaxPhones
	// MaxFrame is the largest phone frame, in bytes.
	MaxFrame = control.MaxData
	// MaxClaimBody is the largest POST /claim body.
	MaxClaimBody = 1024
	// maxControlFrame bounds a computer's frame on the wire: data may be
	// written entirely in \u escapes (6 bytes for each byte of data), plus
	// room for the envelope and unknown keys.
	maxControlFrame = 6*MaxFrame + 4096
)

// Config wires a Handler.
type Config struct {
	Claims store.ChannelClaimStore
	// Route carries the frames between control sockets and phones: this
	// node's (route.NewLocalChannel, the default) or a cluster's.
	Route route.Channel
	Log   *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// PingInterval is how often every socket is pinged (25 s by default).
	PingInterval time.Duration
	// MaxQueue is the send-queue bound of every socket (2 MiB by default).
	MaxQueue int
	// Now is the clock (time.Now by default).
	Now func() time.Time
	// DetachSockets serves sockets off fasthttp's hijack goroutine (see
	// ws.Options.Detach); the server must keep hijacked connections.
	DetachSockets bool
	// Parker, with DetachSockets, parks idle control sockets and phone
	// channels off their goroutines (ws.Options.Parker); nil: a reader
	// goroutine per socket.
	Parker *ws.Parker
}

// Handler serves the private channel relay's HTTP and WebSocket endpoints.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	m     *Metrics
	group ws.Group
	route route.Channel
	// control and phone are the sockets' settings, shared by every socket
	// of each kind.
	control, phone *ws.Settings
}

// New returns a Handler.
func New(cfg Config) *Handler {
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 25 * time.Second
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 2 << 20
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Route == nil {
		cfg.Route = route.NewLocalChannel()
	}
	h := &Handler{cfg: cfg, log: cfg.Log, m: cfg.Metrics, route: cfg.Route}
	h.control, h.phone = h.wsSettings(maxControlFrame), h.wsSettings(MaxFrame)
	return h
}

var healthBody = []byte(`{"protocol":"botharness-private-v1","protocols":["botharness-private-v1","botharness-private-v2"]}`)

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	switch path {
	case "/health":
		if !ctx.IsGet() && !ctx.IsHead() {
			httpx.Error(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
			return
		}
		httpx.JSON(ctx, fasthttp.StatusOK, healthBody)
	case "/claim":
		switch {
		case ctx.IsPost():
			h.claim(ctx)
		case ctx.IsDelete():
			h.release(ctx)
		default:
			httpx.Error(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		}
	case "/status":
		if !ctx.IsGet() {
			httpx.Error(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
			return
		}
		h.status(ctx)
	case "/host":
		h.openControl(ctx)
	case "/botharness-device/channel":
		h.openPhone(ctx)
	default:
		httpx.Error(ctx, fasthttp.StatusNotFound, "not found")
	}
}

type claimBody struct {
	OwnerToken *string `json:"ownerToken"`
	PhoneToken *string `json:"phoneToken"`
}

func (h *Handler) claim(ctx *fasthttp.RequestCtx) {
	key := httpx.Bearer(ctx)
	if key == nil {
		h.m.claims.WithLabelValues("no_bearer").Inc()
		httpx.Error(ctx, fasthttp.StatusUnauthorized, "missing bearer token")
		return
	}
	body := ctx.PostBody()
	if len(body) > MaxClaimBody {
		h.m.claims.WithLabelValues("too_large").Inc()
		httpx.Error(ctx, fasthttp.StatusRequestEntityTooLarge, "body over 1 KiB")
		return
	}
	// Everything about the body is checked before the key is consulted,
	// so a bad request never spends a claim key.
	var cb claimBody
	if err := json.Unmarshal(body, &cb); err != nil || cb.OwnerToken == nil || cb.PhoneToken == nil {
		h.m.claims.WithLabelValues("bad_body").Inc()
		httpx.Error(ctx, fasthttp.StatusBadRequest, "malformed body: want a JSON object with ownerToken and phoneToken")
		return
	}
	owner, phone := []byte(*cb.OwnerToken), []byte(*cb.PhoneToken)
	if !httpx.IsLowerHex(owner, 64) || !httpx.IsLowerHex(phone, 64) {
		h.m.claims.WithLabelValues("bad_body").Inc()
		httpx.Error(ctx, fasthttp.StatusBadRequest, "tokens must be 64 lowercase hex characters")
		return
	}
	if string(owner) == string(phone) {
		h.m.claims.WithLabelValues("bad_body").Inc()
		httpx.Error(ctx, fasthttp.StatusBadRequest, "ownerToken and phoneToken must differ")
		return
	}
	host, err := h.cfg.Claims.Claim(httpx.Hash(key), httpx.Hash(owner), httpx.Hash(phone), h.cfg.Now())
	switch {
	case errors.Is(err, store.ErrUnknownKey):
		h.m.claims.WithLabelValues("unknown_key").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "unknown claim key")
	case errors.Is(err, store.ErrKeyUsed):
		h.m.claims.WithLabelValues("used").Inc()
		httpx.Error(ctx, fasthttp.StatusConflict, "claim key already used")
	case errors.Is(err, store.ErrTokenInUse):
		h.m.claims.WithLabelValues("token_in_use").Inc()
		httpx.Error(ctx, fasthttp.StatusBadRequest, "token already in use")
	case err != nil:
		h.storeFailed(ctx, "claim failed", err)
	default:
		h.m.claims.WithLabelValues("claimed").Inc()
		h.log.Info("computer claimed", "host", host)
		out, _ := json.Marshal(struct {
			Claimed bool   `json:"claimed"`
			Host    string `json:"host"`
		}{true, host})
		httpx.JSON(ctx, fasthttp.StatusOK, out)
	}
}

func (h *Handler) release(ctx *fasthttp.RequestCtx) {
	tok := httpx.Bearer(ctx)
	if tok == nil {
		httpx.Error(ctx, fasthttp.StatusNotFound, "unknown token")
		return
	}
	k, err := h.cfg.Claims.Release(httpx.Hash(tok))
	switch {
	case errors.Is(err, store.ErrUnknownToken):
		httpx.Error(ctx, fasthttp.StatusNotFound, "unknown token")
		return
	case err != nil:
		h.storeFailed(ctx, "release failed", err)
		return
	}
	h.disconnect(k.Hash, ws.CloseNormal)
	h.log.Info("computer released", "host", k.Host)
	httpx.JSON(ctx, fasthttp.StatusOK, []byte(`{"released":true}`))
}

// Revoke removes host's claim key for the operator and disconnects the
// computer if it is connected.
func (h *Handler) Revoke(host string) error {
	k, err := h.cfg.Claims.Revoke(host)
	if err != nil {
		return err
	}
	h.disconnect(k.Hash, ws.CloseNormal)
	h.log.Info("claim key revoked", "host", host)
	return nil
}

// Forget closes the control socket and phone channels of the computer
// whose claim key hashes to key, as a release or revocation through this
// node does: for one made through another node of a cluster (the cluster
// backend's watch calls it). Nothing happens when this node holds none of
// that computer's sockets.
func (h *Handler) Forget(key store.Hash) { h.disconnect(key, ws.CloseNormal) }

// Connected reports whether the computer of claim key hash has its control
// socket open (on any node), for the operator's key list; a router that
// cannot tell right now says false.
func (h *Handler) Connected(key store.Hash) bool {
	ok, err := h.connected(key)
	if err != nil {
		h.log.Warn("control socket state unknown", "err", err)
	}
	return ok
}

func (h *Handler) connected(key store.Hash) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), routeTimeout)
	defer cancel()
	return h.route.Connected(ctx, key)
}

// routeTimeout bounds one question to the router (in a cluster, a
// request to another node or a lease read).
const routeTimeout = 5 * time.Second

// authenticate finds the claimed computer a presented token belongs to
// (lookup is ByOwner or ByPhone). When there is none it answers refusal
// with "unknown token" and returns false; a store failure is logged, never
// the token. A store that cannot answer right now (store.ErrUnavailable:
// in cluster mode a lost quorum or a timeout) says nothing about the
// token, so it is answered 503 with Retry-After: a refusal would make the
// computer or phone discard a token that is still good.
func (h *Handler) authenticate(ctx *fasthttp.RequestCtx, tok []byte, lookup func(store.Hash) (store.ChannelKey, error), refusal int) (store.ChannelKey, bool) {
	if len(tok) == 0 {
		httpx.Error(ctx, refusal, "unknown token")
		return store.ChannelKey{}, false
	}
	k, err := lookup(httpx.Hash(tok))
	if err != nil {
		if errors.Is(err, store.ErrUnavailable) {
			h.storeFailed(ctx, "token lookup failed", err)
			return store.ChannelKey{}, false
		}
		if !errors.Is(err, store.ErrUnknownToken) {
			h.log.Error("token lookup failed", "path", string(ctx.Path()), "err", err)
		}
		httpx.Error(ctx, refusal, "unknown token")
		return store.ChannelKey{}, false
	}
	return k, true
}

func (h *Handler) status(ctx *fasthttp.RequestCtx) {
	k, ok := h.authenticate(ctx, httpx.Bearer(ctx), h.cfg.Claims.ByOwner, fasthttp.StatusNotFound)
	if !ok {
		return
	}
	connected, err := h.connected(k.Hash)
	if err != nil {
		h.storeFailed(ctx, "control socket state", err)
		return
	}
	out, _ := json.Marshal(struct {
		Connected bool   `json:"connected"`
		Host      string `json:"host"`
	}{connected, k.Host})
	httpx.JSON(ctx, fasthttp.StatusOK, out)
}

// disconnect closes a computer's control socket with code; its phones
// follow with 1001 when the control socket's reader ends.
func (h *Handler) disconnect(key store.Hash, code int) { h.route.Shutdown(key, code) }

// Drain closes every socket with 1001 and waits for their writers, or for
// ctx to end.
func (h *Handler) Drain(ctx context.Context) error {
	return h.group.Drain(ctx, ws.CloseGoingAway)
}

// Open is the number of open sockets (control and phone).
func (h *Handler) Open() int { return h.group.Len() }

func newID() (control.ID, error) {
	var raw [16]byte
	var id control.ID
	if _, err := rand.Read(raw[:]); err != nil {
		return id, err
	}
	hex.Encode(id[:], raw[:])
	return id, nil
}
