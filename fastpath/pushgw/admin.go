package pushgw

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
)

// AdminPath is where the admin listener serves push-gateway key
// management for the command line:
//
//	GET    /v1/keys/push[?mount=fcm|apns]       list keys
//	POST   /v1/keys/push[?mount=fcm|apns]       create: {"label":"…","expiresAt":"RFC 3339"|null}
//	POST   /v1/keys/push/<id>/disable           disable
//	POST   /v1/keys/push/<id>/enable            enable again
//	DELETE /v1/keys/push/<id>                   revoke (delete)
//
// mount is needed only when the mounts keep separate key stores; ids are
// unique across stores, so the per-key calls find the key wherever it is.
// The admin handler authenticates the caller before delegating here.
const AdminPath = "/v1/keys/push"

// CreateKeyRequest is the body of POST /v1/keys/push.
type CreateKeyRequest struct {
	Label     string     `json:"label"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

// Admin serves AdminPath.
type Admin struct {
	byMount map[string]*Keys
	stores  []*Keys // distinct, in a stable order
}

// NewAdmin serves the key stores of the mounts that run, by mount name
// (ProviderFCM, ProviderAPNs). Mounts whose Keys hold the same
// store value share one store.
func NewAdmin(byMount map[string]*Keys) *Admin {
	a := &Admin{byMount: byMount}
	for _, m := range []string{ProviderFCM, ProviderAPNs} {
		k := byMount[m]
		if k == nil {
			continue
		}
		dup := false
		for _, s := range a.stores {
			dup = dup || s.Store == k.Store
		}
		if !dup {
			a.stores = append(a.stores, k)
		}
	}
	return a
}

// ServeHTTP answers one request under AdminPath.
func (a *Admin) ServeHTTP(ctx *fasthttp.RequestCtx) {
	rest, ok := strings.CutPrefix(string(ctx.Path()), AdminPath)
	if !ok || (rest != "" && rest[0] != '/') {
		httpx.Error(ctx, fasthttp.StatusNotFound, "not found")
		return
	}
	rest = strings.Trim(rest, "/")
	if len(a.stores) == 0 {
		httpx.Error(ctx, fasthttp.StatusNotFound, "push gateway is off")
		return
	}
	if rest == "" {
		keys, msg := a.pick(string(ctx.QueryArgs().Peek("mount")))
		if keys == nil {
			httpx.Error(ctx, fasthttp.StatusBadRequest, msg)
			return
		}
		switch {
		case ctx.IsGet():
			list, err := keys.List()
			if err != nil {
				httpx.Error(ctx, fasthttp.StatusInternalServerError, "internal error")
				return
			}
			out, _ := json.Marshal(list)
			httpx.JSON(ctx, fasthttp.StatusOK, out)
		case ctx.IsPost():
			var req CreateKeyRequest
			if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
				httpx.Error(ctx, fasthttp.StatusBadRequest, `body must be {\"label\":\"…\",\"expiresAt\":\"RFC 3339\"}`)
				return
			}
			var exp time.Time
			if req.ExpiresAt != nil {
				exp = *req.ExpiresAt
			}
			nk, err := keys.Create(req.Label, exp)
			switch {
			case errors.Is(err, ErrBadLabel):
				httpx.Error(ctx, fasthttp.StatusBadRequest, "a label is 1 to 64 characters")
			case errors.Is(err, ErrBadExpiry):
				httpx.Error(ctx, fasthttp.StatusBadRequest, "the expiry must be in the future")
			case err != nil:
				httpx.StoreError(ctx, err) // 503 with Retry-After when the store refuses writes, else 500
			default:
				out, _ := json.Marshal(nk)
				httpx.JSON(ctx, fasthttp.StatusCreated, out)
			}
		default:
			httpx.Error(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		}
		return
	}

	id, verb, _ := strings.Cut(rest, "/")
	var op func(*Keys, string) error
	var done string
	switch {
	case verb == "" && ctx.IsDelete():
		op, done = (*Keys).Revoke, `{"revoked":true}`
	case verb == "disable" && ctx.IsPost():
		op, done = (*Keys).Disable, `{"disabled":true}`
	case verb == "enable" && ctx.IsPost():
		op, done = (*Keys).Enable, `{"enabled":true}`
	default:
		httpx.Error(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		return
	}
	for _, keys := range a.stores {
		if _, ok := keys.Store.KeyByID(id); !ok {
			continue
		}
		if err := op(keys, id); err != nil {
			httpx.StoreError(ctx, err) // 503 with Retry-After when the store refuses writes, else 500
			return
		}
		httpx.JSON(ctx, fasthttp.StatusOK, []byte(done))
		return
	}
	httpx.Error(ctx, fasthttp.StatusNotFound, "unknown key")
}

// pick returns the store of mount ("" when there is only one store).
func (a *Admin) pick(mount string) (*Keys, string) {
	if mount == "" {
		if len(a.stores) == 1 {
			return a.stores[0], ""
		}
		return nil, "the mounts keep separate key stores: add mount=fcm or mount=apns"
	}
	if mount != ProviderFCM && mount != ProviderAPNs {
		return nil, "mount is fcm or apns"
	}
	if k := a.byMount[mount]; k != nil {
		return k, ""
	}
	return nil, "that push gateway mount is off"
}
