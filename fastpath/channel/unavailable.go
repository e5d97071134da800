package channel

import (
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
)

// storeFailed answers a store call that failed: 503 "storage unavailable"
// with Retry-After when the store refuses writes (disk nearly full,
// stalled or failed; nothing was changed, the request may be repeated),
// else 500. msg is the log line's message.
func (h *Handler) storeFailed(ctx *fasthttp.RequestCtx, msg string, err error) {
	if httpx.StoreError(ctx, err) {
		h.log.Warn(msg+": store unavailable", "err", err)
		return
	}
	h.log.Error(msg, "err", err)
}
