package server

import (
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Answering from the headers alone.
//
// With StreamRequestBody, fasthttp reads the first min(Content-Length,
// MaxRequestBodySize, 8 KiB) bytes of a body before it calls the handler,
// and answers "Expect: 100-continue" with "100 Continue" before that. A
// refusal that the headers decide (no credentials, a Content-Length over
// the limit) would then wait for body bytes the client may never send,
// and a client that asked to be told first would be told to go on.
//
// HeaderReceived is the one hook fasthttp calls between the headers and
// the body. There, a service's decide function says whether the handler
// will answer without the body; if so the request's framing is rewritten
// to an empty body (Content-Length: 0, no Expect), so fasthttp reads
// nothing and runs the handler at once, and the declared length is kept
// in a header the client cannot set (it is deleted from every request
// first) for BodyWithheld. The connection cannot carry another request,
// as the body's bytes may follow; after the answer it reads and discards
// what the client still sends of the body, up to lingerBytes for at most
// lingerTime, then closes, so that a client still writing its body reads
// the answer rather than a reset (closing a socket with unread data sends
// an RST, which can destroy the answer in the client's receive buffer).

// withheldHeader carries the declared body length of a withheld request
// from HeaderReceived to the handler.
const withheldHeader = "X-Edgerelay-Withheld-Length"

// Bounds of the drain after answering a request whose body was withheld.
const (
	lingerBytes = 1 << 20 // a refused body larger than this is abuse, and gets the reset
	lingerTime  = 2 * time.Second
)

// AnswerBeforeBody makes srv ask decide, with each request's headers and
// before any byte of its body is read, whether its handler will answer
// from the headers alone; see BodyWithheld. Requests without a body are
// not asked: nothing would be waited for. Listen calls it for a
// Service.AnswerBeforeBody; tests that build their own fasthttp.Server
// call it directly, after setting srv.Handler.
func AnswerBeforeBody(srv *fasthttp.Server, decide func(h *fasthttp.RequestHeader) bool) {
	srv.HeaderReceived = func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
		h.Del(withheldHeader)
		n := h.ContentLength() // -1 chunked, -2 neither length nor chunked
		if (n > 0 || n == -1) && decide(h) {
			var b [20]byte
			h.SetBytesV(withheldHeader, strconv.AppendInt(b[:0], int64(n), 10))
			h.SetContentLength(0)
			h.Del(fasthttp.HeaderExpect)
		}
		return fasthttp.RequestConfig{}
	}
	next := srv.Handler
	srv.Handler = func(ctx *fasthttp.RequestCtx) {
		next(ctx)
		if _, ok := BodyWithheld(ctx); ok && !ctx.Hijacked() {
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(c net.Conn) { answerAndLinger(ctx, c) })
		}
	}
}

// BodyWithheld reports whether the request's body was withheld (see
// AnswerBeforeBody) and the Content-Length it declared (-1: chunked). The
// request then has an empty body.
func BodyWithheld(ctx *fasthttp.RequestCtx) (declared int, ok bool) {
	v := ctx.Request.Header.Peek(withheldHeader)
	if v == nil {
		return 0, false
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return 0, false // only HeaderReceived writes it, always a number
	}
	return n, true
}

// answerAndLinger writes the handler's answer with Connection: close and
// then drains the rest of the body, bounded, before fasthttp closes c.
// fasthttp has not written the answer (HijackSetNoResponse): written here,
// it can say that the connection ends, which an answer fasthttp writes
// before a hijack cannot.
func answerAndLinger(ctx *fasthttp.RequestCtx, c net.Conn) {
	ctx.Response.Header.SetConnectionClose()
	if err := c.SetDeadline(time.Now().Add(lingerTime)); err != nil {
		return
	}
	if _, err := ctx.Response.WriteTo(c); err != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c, lingerBytes)
}
