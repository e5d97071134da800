// Package admin serves the operator's listener (loopback by default):
// /metrics for Prometheus, /healthz and /readyz for supervisors, and the
// key-management and backup endpoints that the command line uses while
// the server runs. Those endpoints need the admin token that the server
// writes to <data dir>/admin.token at start (mode 0600): whoever can read
// the data dir can manage keys and take backups, nobody else on the
// machine can.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/pushgw"
	"edgerelay/store"
)

// Config wires the admin handler.
type Config struct {
	Gatherer prometheus.Gatherer
	// TokenHash is SHA-256 of the admin token.
	TokenHash [32]byte
	// ChannelKeys is nil when the channel service is off.
	ChannelKeys *channel.Keys
	// PushKeys manages the push gateway's API keys; nil when it is off.
	PushKeys *pushgw.Admin
	// AgentKeys manages agent accounts, pairing keys and instances; nil
	// when the agent relay is off. AgentPublicKey is its relay key.
	AgentKeys      *agent.Keys
	AgentPublicKey string
	// Storage reports why the store refuses writes (nil while it takes
	// them); /readyz answers 503 meanwhile. Nil: not consulted.
	Storage func() error
	// Backup writes a checkpoint of the server's store into an absolute
	// directory (store.DB.Checkpoint); nil when there is none to back up
	// (cluster mode keeps its state in NATS).
	Backup func(dir string) (store.BackupInfo, error)
	Log    *slog.Logger
}

// Handler is the admin listener's handler.
type Handler struct {
	cfg     Config
	metrics fasthttp.RequestHandler
	ready   atomic.Bool
}

// New returns the admin handler; it answers /readyz 503 until SetReady(true).
func New(cfg Config) *Handler {
	return &Handler{
		cfg:     cfg,
		metrics: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})),
	}
}

// SetReady flips /readyz: true once every listener serves, false when the
// drain starts so load balancers stop sending new clients.
func (h *Handler) SetReady(ok bool) { h.ready.Store(ok) }

// readyz is 200 while serving with a store that takes writes. A store
// that refuses them (disk nearly full, stalled, failed) makes it 503 so
// that a balancer sends writers to another node; reads still work here.
func (h *Handler) readyz(ctx *fasthttp.RequestCtx) {
	switch {
	case !h.ready.Load():
		httpx.JSON(ctx, fasthttp.StatusServiceUnavailable, []byte(`{"status":"not ready"}`))
	case h.cfg.Storage != nil && h.cfg.Storage() != nil:
		httpx.JSON(ctx, fasthttp.StatusServiceUnavailable, []byte(`{"status":"storage unavailable"}`))
	default:
		httpx.JSON(ctx, fasthttp.StatusOK, []byte(`{"status":"ready"}`))
	}
}

// ServeHTTP routes one admin request.
func (h *Handler) ServeHTTP(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	switch {
	case path == "/metrics":
		h.metrics(ctx)
	case path == "/healthz":
		httpx.JSON(ctx, fasthttp.StatusOK, []byte(`{"status":"ok"}`))
	case path == "/readyz":
		h.readyz(ctx)
	case strings.HasPrefix(path, AgentPath+"/"):
		if !h.authorized(ctx) {
			httpx.Error(ctx, fasthttp.StatusUnauthorized, "admin token required")
			return
		}
		if h.cfg.AgentKeys == nil {
			httpx.Error(ctx, fasthttp.StatusNotFound, "agent relay is off")
			return
		}
		h.agentKeys(ctx, strings.TrimPrefix(path, AgentPath+"/"))
	case path == pushgw.AdminPath || strings.HasPrefix(path, pushgw.AdminPath+"/"):
		if !h.authorized(ctx) {
			httpx.Error(ctx, fasthttp.StatusUnauthorized, "admin token required")
			return
		}
		if h.cfg.PushKeys == nil {
			httpx.Error(ctx, fasthttp.StatusNotFound, "push gateway is off")
			return
		}
		h.cfg.PushKeys.ServeHTTP(ctx)
	case path == BackupPath:
		if !h.authorized(ctx) {
			httpx.Error(ctx, fasthttp.StatusUnauthorized, "admin token required")
			return
		}
		h.backup(ctx)
	case path == "/v1/keys/channel" || strings.HasPrefix(path, "/v1/keys/channel/"):
		if !h.authorized(ctx) {
			httpx.Error(ctx, fasthttp.StatusUnauthorized, "admin token required")
			return
		}
		if h.cfg.ChannelKeys == nil {
			httpx.Error(ctx, fasthttp.StatusNotFound, "channel service is off")
			return
		}
		h.channelKeys(ctx, strings.TrimPrefix(strings.TrimPrefix(path, "/v1/keys/channel"), "/"))
	default:
		httpx.Error(ctx, fasthttp.StatusNotFound, "not found")
	}
}

func (h *Handler) authorized(ctx *fasthttp.RequestCtx) bool {
	tok := httpx.Bearer(ctx)
	if tok == nil {
		return false
	}
	got := httpx.Hash(tok)
	return subtle.ConstantTimeCompare(got[:], h.cfg.TokenHash[:]) == 1
}

// AddKeyRequest is the body of POST /v1/keys/channel.
type AddKeyRequest struct {
	Host string `json:"host"`
}

// AddKeyResponse is its answer: the key, shown once.
type AddKeyResponse struct {
	Host string `json:"host"`
	Key  string `json:"key"`
}

func (h *Handler) channelKeys(ctx *fasthttp.RequestCtx, host string) {
	keys := h.cfg.ChannelKeys
	switch {
	case host == "" && ctx.IsGet():
		list, err := keys.List()
		if err != nil {
			h.internal(ctx, err)
			return
		}
		out, _ := json.Marshal(list)
		httpx.JSON(ctx, fasthttp.StatusOK, out)
	case host == "" && ctx.IsPost():
		var req AddKeyRequest
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
			httpx.Error(ctx, fasthttp.StatusBadRequest, "body must be {\\\"host\\\":\\\"NAME\\\"}")
			return
		}
		key, err := keys.Add(req.Host)
		switch {
		case errors.Is(err, channel.ErrBadHost):
			httpx.Error(ctx, fasthttp.StatusBadRequest, "bad host name")
		case errors.Is(err, store.ErrHostExists):
			httpx.Error(ctx, fasthttp.StatusConflict, "host already has a claim key")
		case err != nil:
			h.internal(ctx, err)
		default:
			h.cfg.Log.Info("claim key added", "host", req.Host)
			out, _ := json.Marshal(AddKeyResponse{Host: req.Host, Key: key})
			httpx.JSON(ctx, fasthttp.StatusCreated, out)
		}
	case host != "" && ctx.IsDelete():
		err := keys.Revoke(host)
		switch {
		case errors.Is(err, store.ErrUnknownHost):
			httpx.Error(ctx, fasthttp.StatusNotFound, "unknown host")
		case err != nil:
			h.internal(ctx, err)
		default:
			httpx.JSON(ctx, fasthttp.StatusOK, []byte(`{"revoked":true}`))
		}
	default:
		httpx.Error(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
	}
}

func (h *Handler) internal(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, store.ErrUnavailable) {
		h.cfg.Log.Warn("admin write refused: store unavailable", "path", string(ctx.Path()), "err", err)
		ctx.Response.Header.Set("Retry-After", store.RetryAfter)
		httpx.Error(ctx, fasthttp.StatusServiceUnavailable, "storage unavailable")
		return
	}
	h.cfg.Log.Error("admin request failed", "path", string(ctx.Path()), "err", err)
	httpx.Error(ctx, fasthttp.StatusInternalServerError, "internal error")
}
