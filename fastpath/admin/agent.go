package admin

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// AgentPath is the root of the agent relay's operator endpoints.
const AgentPath = "/v1/keys/agent"

// AccountRequest is the body of POST /v1/keys/agent/accounts.
type AccountRequest struct {
	Name string `json:"name"`
}

// SecretResponse carries a secret minted once (client token, pairing key).
type SecretResponse struct {
	Secret string `json:"secret"`
}

// PairKeyRequest is the body of POST /v1/keys/agent/pair-keys.
type PairKeyRequest struct {
	Account string        `json:"account"`
	TTL     time.Duration `json:"ttl"` // 0 = 15 minutes
}

// agentKeys serves the agent endpoints:
//
//	GET    /v1/keys/agent/relay-key        {"relay_public_key":"…"}
//	GET    /v1/keys/agent/accounts         [AccountInfo]
//	POST   /v1/keys/agent/accounts         {"name":…} → {"secret":<client token>}
//	POST   /v1/keys/agent/pair-keys        {"account":…,"ttl":ns} → {"secret":<pairing key>}
//	GET    /v1/keys/agent/instances        [InstanceInfo]
//	DELETE /v1/keys/agent/instances/<id>   revoke
func (h *Handler) agentKeys(ctx *fasthttp.RequestCtx, rest string) {
	keys := h.cfg.AgentKeys
	switch {
	case rest == "relay-key" && ctx.IsGet():
		out, _ := json.Marshal(map[string]string{"relay_public_key": h.cfg.AgentPublicKey})
		httpx.JSON(ctx, fasthttp.StatusOK, out)
	case rest == "accounts" && ctx.IsGet():
		list, err := keys.Accounts()
		h.answerList(ctx, list, err)
	case rest == "accounts" && ctx.IsPost():
		var req AccountRequest
		if json.Unmarshal(ctx.PostBody(), &req) != nil {
			httpx.Error(ctx, fasthttp.StatusBadRequest, "body must be a JSON object with name")
			return
		}
		tok, err := keys.AddAccount(req.Name)
		h.answerSecret(ctx, tok, err)
	case rest == "pair-keys" && ctx.IsPost():
		var req PairKeyRequest
		if json.Unmarshal(ctx.PostBody(), &req) != nil || req.TTL < 0 {
			httpx.Error(ctx, fasthttp.StatusBadRequest, "body must be a JSON object with account and ttl")
			return
		}
		key, err := keys.PairKey(req.Account, req.TTL)
		h.answerSecret(ctx, key, err)
	case rest == "instances" && ctx.IsGet():
		list, err := keys.Instances()
		h.answerList(ctx, list, err)
	case strings.HasPrefix(rest, "instances/") && ctx.IsDelete():
		h.agentError(ctx, keys.RevokeInstance(strings.TrimPrefix(rest, "instances/")), func() {
			httpx.JSON(ctx, fasthttp.StatusOK, []byte(`{"revoked":true}`))
		})
	default:
		httpx.Error(ctx, fasthttp.StatusNotFound, "not found")
	}
}

func (h *Handler) answerList(ctx *fasthttp.RequestCtx, list any, err error) {
	h.agentError(ctx, err, func() {
		out, _ := json.Marshal(list)
		httpx.JSON(ctx, fasthttp.StatusOK, out)
	})
}

func (h *Handler) answerSecret(ctx *fasthttp.RequestCtx, secret string, err error) {
	h.agentError(ctx, err, func() {
		out, _ := json.Marshal(SecretResponse{Secret: secret})
		httpx.JSON(ctx, fasthttp.StatusCreated, out)
	})
}

// agentError maps the agent key errors to statuses, or calls ok.
func (h *Handler) agentError(ctx *fasthttp.RequestCtx, err error, ok func()) {
	switch {
	case err == nil:
		ok()
	case errors.Is(err, agent.ErrBadAccountName):
		httpx.Error(ctx, fasthttp.StatusBadRequest, "bad account name")
	case errors.Is(err, store.ErrAccountExists):
		httpx.Error(ctx, fasthttp.StatusConflict, "account already exists")
	case errors.Is(err, store.ErrUnknownAccount):
		httpx.Error(ctx, fasthttp.StatusNotFound, "unknown account")
	case errors.Is(err, store.ErrUnknownInstance):
		httpx.Error(ctx, fasthttp.StatusNotFound, "unknown instance")
	default:
		h.internal(ctx, err)
	}
}
