package mailbox

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/server"
)

// Error answers are fixed JSON bodies: {"error":"<code>","status":<n>}.
type problem struct {
	status int
	body   []byte
}

func newProblem(status int, code string) problem {
	return problem{status: status, body: []byte(`{"error":"` + code + `","status":` + strconv.Itoa(status) + `}`)}
}

var (
	errBadRequest      = newProblem(400, "bad_request")
	errUnauthorized    = newProblem(401, "unauthorized")
	errForbidden       = newProblem(403, "forbidden")
	errNotFound        = newProblem(404, "not_found")
	errTaken           = newProblem(409, "taken")
	errConflict        = newProblem(409, "conflict")
	errTooLarge        = newProblem(413, "too_large")
	errRateLimited     = newProblem(429, "rate_limited")
	errTooManyWatchers = newProblem(429, "too_many_watchers")
	errUpgradeRequired = newProblem(426, "upgrade_required") // a WebSocket version other than 13
	errMailboxFull     = newProblem(507, "mailbox_full")
	errInternal        = newProblem(500, "internal")
	errUpstreamUnavail = newProblem(502, "upstream_unavailable")
	_                  = errUpstreamUnavail
	// Refusals the listener makes before the handler runs (see ServeError);
	// the spec's table has no code for them, so they get codes of their own.
	errTimeout         = newProblem(408, "timeout")
	errHeadersTooLarge = newProblem(431, "headers_too_large")
)

// ServeError answers the requests the listener refuses before the handler
// runs (headers over the limit, a body over the limit, a client too slow,
// garbage) in the mailbox's error shape. Use it as the listener's
// ErrorHandler.
func (h *Handler) ServeError(ctx *fasthttp.RequestCtx, err error) {
	// A page must be able to read a 413 too, so that it can tell an
	// envelope too large from a network failure.
	h.cfg.CORS.Decorate(ctx)
	switch status, _ := server.Refusal(err); status {
	case fasthttp.StatusRequestHeaderFieldsTooLarge:
		errHeadersTooLarge.answer(ctx)
	case fasthttp.StatusRequestEntityTooLarge:
		errTooLarge.answer(ctx)
	case fasthttp.StatusRequestTimeout:
		errTimeout.answer(ctx)
	default:
		errBadRequest.answer(ctx)
	}
}

func (p problem) answer(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(p.status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(p.body)
}

// rateLimited answers 429 with Retry-After in whole seconds, at least 1.
func rateLimited(ctx *fasthttp.RequestCtx, retryAfterNanos int64) {
	secs := (retryAfterNanos + 1e9 - 1) / 1e9
	if secs < 1 {
		secs = 1
	}
	var b [20]byte
	ctx.Response.Header.SetBytesV("Retry-After", strconv.AppendInt(b[:0], secs, 10))
	errRateLimited.answer(ctx)
}
