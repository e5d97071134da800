package pushgw

import (
	"errors"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// adminFailed answers a key-management call whose store write failed:
// 503 "storage unavailable" with Retry-After when the store refuses writes
// (disk nearly full, stalled or failed; nothing was changed), else 500.
func adminFailed(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, store.ErrUnavailable) {
		ctx.Response.Header.Set("Retry-After", store.RetryAfter)
		httpx.Error(ctx, fasthttp.StatusServiceUnavailable, "storage unavailable")
		return
	}
	httpx.Error(ctx, fasthttp.StatusInternalServerError, "internal error")
}
