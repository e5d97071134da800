// Package httpx holds the small HTTP helpers every protocol handler shares:
// JSON answers with Cache-Control: no-store, the store-refusal answer,
// bearer extraction, and token hashing. Nothing here allocates on a request path beyond what fasthttp does.
package httpx

import (
	"bytes"
	"crypto/sha256"
	"errors"

	"github.com/valyala/fasthttp"

	"edgerelay/store"
)

// JSON answers status with a pre-encoded JSON body and Cache-Control: no-store.
func JSON(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(body)
}

// Error answers status with {"error":"<msg>"}. msg must need no JSON
// escaping: every message is a constant of the calling package.
func Error(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	b := ctx.Response.BodyWriter()
	_, _ = b.Write([]byte(`{"error":"`))
	_, _ = b.Write([]byte(msg))
	_, _ = b.Write([]byte(`"}`))
}

// StoreUnavailable reports whether err is the store refusing writes (disk
// nearly full, stalled or failed: nothing was changed, the request may be
// repeated) and then sets Retry-After on the answer; the caller writes its
// protocol's 503 body.
func StoreUnavailable(ctx *fasthttp.RequestCtx, err error) bool {
	if !errors.Is(err, store.ErrUnavailable) {
		return false
	}
	ctx.Response.Header.Set("Retry-After", store.RetryAfter)
	return true
}

// StoreError answers a store call that failed in the {"error":"<msg>"}
// shape: 503 "storage unavailable" with Retry-After when the store refuses
// writes (and reports true), else 500 "internal error".
func StoreError(ctx *fasthttp.RequestCtx, err error) (unavailable bool) {
	if StoreUnavailable(ctx, err) {
		Error(ctx, fasthttp.StatusServiceUnavailable, "storage unavailable")
		return true
	}
	Error(ctx, fasthttp.StatusInternalServerError, "internal error")
	return false
}

var bearerPrefix = []byte("bearer ")

// Bearer returns the token of an "Authorization: Bearer <token>" header
// (scheme case-insensitive), or nil.
func Bearer(ctx *fasthttp.RequestCtx) []byte {
	return BearerValue(ctx.Request.Header.Peek("Authorization"))
}

// BearerValue extracts the token from one Authorization header value.
func BearerValue(v []byte) []byte {
	if len(v) <= len(bearerPrefix) || !bytes.EqualFold(v[:len(bearerPrefix)], bearerPrefix) {
		return nil
	}
	tok := bytes.TrimSpace(v[len(bearerPrefix):])
	if len(tok) == 0 {
		return nil
	}
	return tok
}

// Hash is the SHA-256 of a presented secret: the form in which secrets are
// looked up and stored.
func Hash(secret []byte) [32]byte { return sha256.Sum256(secret) }

// IsLowerHex reports whether s is exactly n lowercase hex characters.
func IsLowerHex(s []byte, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
