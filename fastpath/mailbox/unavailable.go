package mailbox

import (
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
)

// errStorageUnavailable answers a request whose write the store refused
// (disk nearly full, store stalled or failed): nothing was stored, and the
// same request may be sent again after Retry-After.
var errStorageUnavailable = newProblem(503, "storage_unavailable")

// unavailable answers 503 storage_unavailable with Retry-After and
// reports true when err is the store refusing writes. The log line is one
// constant message, which the server's log limiter bounds however many
// requests are refused.
func (h *Handler) unavailable(ctx *fasthttp.RequestCtx, err error) bool {
	if !httpx.StoreUnavailable(ctx, err) {
		return false
	}
	h.log.Warn("mailbox write refused: store unavailable", "err", err)
	errStorageUnavailable.answer(ctx)
	return true
}
