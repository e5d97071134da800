package agent

import (
	"encoding/json"
	"errors"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// MaxRedeemBody bounds the body of POST /v1/pair/redeem.
const MaxRedeemBody = 4 << 10

// maxInstanceName bounds instance_name (a host name), in bytes.
const maxInstanceName = 256

// RedeemRequest is the body of POST /v1/pair/redeem.
type RedeemRequest struct {
	Key          string `json:"key"`
	InstanceName string `json:"instance_name"`
}

// RedeemResponse is its answer: the instance token is shown this once.
type RedeemResponse struct {
	InstanceToken  string `json:"instance_token"`
	InstanceID     string `json:"instance_id"`
	AccountID      string `json:"account_id"`
	RelayPublicKey string `json:"relay_public_key"`
}

// redeem serves POST /v1/pair/redeem: a runtime trades a one-time pairing
// key for its instance id and token, and learns the key to pin.
func (h *Handler) redeem(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		answerError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		return
	}
	body := ctx.PostBody()
	// Everything about the body is checked before the key is consulted,
	// so a malformed request never spends a pairing key.
	var req RedeemRequest
	if len(body) > MaxRedeemBody || json.Unmarshal(body, &req) != nil || req.Key == "" || !validName(req.InstanceName) {
		h.m.redeems.WithLabelValues("malformed").Inc()
		answerError(ctx, fasthttp.StatusBadRequest, "body must be a JSON object with key and instance_name, a printable name of at most 256 bytes")
		return
	}
	id, token := newID("inst-"), newSecret()
	inst, err := h.cfg.Store.RedeemPairingKey(httpx.Hash([]byte(req.Key)), id, req.InstanceName, httpx.Hash([]byte(token)), h.cfg.Now())
	switch {
	case errors.Is(err, store.ErrPairingUnknown):
		h.m.redeems.WithLabelValues("unknown").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "unknown pairing key")
		return
	case errors.Is(err, store.ErrPairingUsed):
		h.m.redeems.WithLabelValues("used").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "pairing key already used")
		return
	case errors.Is(err, store.ErrPairingExpired):
		h.m.redeems.WithLabelValues("expired").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "pairing key expired")
		return
	case err != nil:
		h.m.redeems.WithLabelValues("error").Inc()
		h.storeFailed(ctx, "pairing failed", err)
		return
	}
	h.m.redeems.WithLabelValues("paired").Inc()
	h.log.Info("instance paired", "instance", inst.ID, "account", inst.Account, "name", inst.Name)
	out, _ := json.Marshal(RedeemResponse{
		InstanceToken:  token,
		InstanceID:     inst.ID,
		AccountID:      inst.Account,
		RelayPublicKey: h.pubString,
	})
	httpx.JSON(ctx, fasthttp.StatusOK, out)
}

// validName reports whether an instance name is 1 to 256 bytes of UTF-8
// without control characters: it is shown to operators and logged.
func validName(s string) bool {
	if s == "" || len(s) > maxInstanceName || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}
