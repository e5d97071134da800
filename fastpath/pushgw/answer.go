package pushgw

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/valyala/fasthttp"
)

// route labels an answer in metrics.
type route uint8

const (
	routeOther route = iota
	routeHealth
	routeSend
	routeRegister
	numRoutes
)

func (r route) String() string {
	switch r {
	case routeHealth:
		return "health"
	case routeSend:
		return "send"
	case routeRegister:
		return "register"
	}
	return "other"
}

// request is the per-request state the answer and the log need.
type request struct {
	id    [36]byte // UUID v4, also the X-Request-Id
	start time.Time
	route route
}

// newUUID writes a fresh random (version 4) UUID into dst. A request id
// is never taken from the caller: it must be unique in the operator's log.
func newUUID(dst *[36]byte) {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	hex.Encode(dst[0:8], b[0:4])
	dst[8] = '-'
	hex.Encode(dst[9:13], b[4:6])
	dst[13] = '-'
	hex.Encode(dst[14:18], b[6:8])
	dst[18] = '-'
	hex.Encode(dst[19:23], b[8:10])
	dst[23] = '-'
	hex.Encode(dst[24:36], b[10:16])
}

// json answers status with body, Content-Type: application/json.
func (h *Handler) json(ctx *fasthttp.RequestCtx, _ *request, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.SetBody(body)
}

// fail answers {"error":msg,"requestId":id}. msg is a constant of this
// package and needs no escaping.
func (h *Handler) fail(ctx *fasthttp.RequestCtx, r *request, status int, msg string) {
	var buf [128]byte
	b := appendErrorHead(buf[:0], r, msg)
	h.json(ctx, r, status, append(b, '}'))
}

// appendErrorHead appends `{"error":"msg","requestId":"id"` without the
// closing brace, for answers with extra members.
func appendErrorHead(b []byte, r *request, msg string) []byte {
	b = append(b, `{"error":"`...)
	b = append(b, msg...)
	b = append(b, `","requestId":"`...)
	b = append(b, r.id[:]...)
	return append(b, '"')
}
