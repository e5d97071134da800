package ws

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// acceptGUID is the fixed GUID of RFC 6455 section 1.3.
const acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// IsUpgrade reports whether the request asks for a WebSocket upgrade.
func IsUpgrade(ctx *fasthttp.RequestCtx) bool {
	return ctx.IsGet() &&
		headerHasToken(ctx.Request.Header.Peek("Connection"), "upgrade") &&
		headerHasToken(ctx.Request.Header.Peek("Upgrade"), "websocket")
}

// HandshakeError explains why a request is not a valid WebSocket handshake.
type HandshakeError string

func (e HandshakeError) Error() string { return "ws: bad handshake: " + string(e) }

// errVersion is the refusal RFC 6455 section 4.2.2 answers with 426.
const errVersion HandshakeError = "Sec-WebSocket-Version is not 13"

// CheckHandshake validates the parts of the handshake that the upgrade
// itself needs; callers check authentication first so that a refusal is an
// ordinary HTTP answer with the protocol's own error body, its status and
// headers from Refusal.
func CheckHandshake(ctx *fasthttp.RequestCtx) error {
	switch {
	case !ctx.IsGet():
		return HandshakeError("method is not GET")
	case !ctx.Request.Header.IsHTTP11():
		// RFC 6455 4.2.1 asks for HTTP/1.1 or higher, and an HTTP/1.0
		// server must ignore Upgrade (RFC 9110 7.8).
		return HandshakeError("HTTP/1.0 cannot upgrade")
	case !headerHasToken(ctx.Request.Header.Peek("Connection"), "upgrade"):
		return HandshakeError("Connection header lacks upgrade")
	case !headerHasToken(ctx.Request.Header.Peek("Upgrade"), "websocket"):
		return HandshakeError("Upgrade header lacks websocket")
	case len(ctx.Request.Header.Peek("Sec-WebSocket-Version")) == 0:
		return HandshakeError("Sec-WebSocket-Version is missing")
	case string(ctx.Request.Header.Peek("Sec-WebSocket-Version")) != "13":
		return errVersion
	case len(ctx.Request.Header.Peek("Sec-WebSocket-Key")) == 0:
		return HandshakeError("Sec-WebSocket-Key is missing")
	case !validKey(ctx.Request.Header.Peek("Sec-WebSocket-Key")):
		return HandshakeError("Sec-WebSocket-Key is not 16 bytes in base64")
	}
	return nil
}

// Refusal returns the status that answers a handshake CheckHandshake
// refused with err, and sets the headers that go with it: 426 Upgrade
// Required with Sec-WebSocket-Version: 13 for a version the relay does not
// speak (RFC 6455 4.2.2), 400 for anything else. The caller writes its
// protocol's error body with that status, keeping the headers.
func Refusal(ctx *fasthttp.RequestCtx, err error) int {
	if errors.Is(err, errVersion) {
		ctx.Response.Header.Set("Sec-WebSocket-Version", "13")
		return fasthttp.StatusUpgradeRequired
	}
	return fasthttp.StatusBadRequest
}

// validKey reports whether key is the base64 encoding of 16 bytes, as RFC
// 6455 section 4.2.1 requires of the client's key.
func validKey(key []byte) bool {
	if len(key) != 24 { // checked first: Decode would overrun b
		return false
	}
	var b [18]byte
	n, err := base64.StdEncoding.Decode(b[:], key)
	return err == nil && n == 16
}

// Upgrade answers 101 and hands the hijacked connection, wrapped in a Conn,
// to serve, which runs on its own goroutine and should read until the
// connection ends. subprotocol is echoed when not empty. Call CheckHandshake
// first. The Conn is closed and its writer finished when serve returns.
//
// Exactly one of serve and abandon (when not nil) runs, as with Hijack:
// abandon when fasthttp closes the connection without handing it over,
// which happens when the answers to requests pipelined before the upgrade
// cannot be flushed. A caller that reserves something for the socket
// before Upgrade (a watcher slot, a control-socket claim) gives it back in
// abandon, and in serve as usual. serve runs even when the client is gone
// by the time the 101 is written (its first read fails). opts are the
// Conn's own from then on (see Settings).
func Upgrade(ctx *fasthttp.RequestCtx, opts *Settings, subprotocol string, abandon func(), serve func(*Conn)) {
	// The 101 is written by the hijacked goroutine itself rather than by
	// fasthttp: fasthttp skips the hijack handler when its own flush of
	// the answer fails, and serve would then not run for an upgrade whose
	// answer could not be written.
	resp := make([]byte, 0, 160+len(subprotocol))
	resp = append(resp, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "...)
	resp = append(resp, acceptKey(ctx.Request.Header.Peek("Sec-WebSocket-Key"))...)
	if subprotocol != "" {
		resp = append(resp, "\r\nSec-WebSocket-Protocol: "...)
		resp = append(resp, subprotocol...)
	}
	resp = append(resp, "\r\n\r\n"...)
	Hijack(ctx, abandon, func(nc net.Conn) {
		if !opts.Detach {
			run(nc, resp, opts, serve)
			return
		}
		// A client may send nothing before our 101 (RFC 6455 4.1), so
		// fasthttp's read buffer holds nothing of the socket: read the
		// connection itself and let fasthttp have its buffer and request
		// context back at once. That is about 10 KiB per idle socket.
		if u, ok := nc.(interface{ UnsafeConn() net.Conn }); ok {
			nc = u.UnsafeConn()
		}
		go run(nc, resp, opts, serve)
	})
}

// run writes the 101 and serves the socket until serve returns.
func run(nc net.Conn, resp []byte, opts *Settings, serve func(*Conn)) {
	// The HTTP server's header and idle deadlines do not apply to a
	// WebSocket: pings decide when it is dead. The answer itself is
	// bounded like a close, and written before the Conn's writer exists
	// so that nothing can overtake it.
	_ = nc.SetDeadline(time.Now().Add(opts.CloseTimeout))
	_, werr := nc.Write(resp)
	_ = nc.SetDeadline(time.Time{})
	c := newConn(nc, opts)
	if werr != nil {
		c.Abort() // serve still runs: its first read fails and it cleans up
	}
	serve(c)
	if !c.serving {
		c.finish()
	} // else the end of Serve's reading finishes it
}

func acceptKey(key []byte) string {
	h := sha1.New()
	h.Write(key)
	h.Write([]byte(acceptGUID))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// headerHasToken reports whether a comma-separated header value holds
// token, compared case-insensitively.
func headerHasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var part []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			part, v = v[:i], v[i+1:]
		} else {
			part, v = v, nil
		}
		if bytes.EqualFold(bytes.TrimSpace(part), []byte(token)) {
			return true
		}
	}
	return false
}

// Subprotocols returns the values of the Sec-WebSocket-Protocol header in
// the order the client sent them, calling fn for each until it returns false.
func Subprotocols(ctx *fasthttp.RequestCtx, fn func(proto []byte) bool) {
	stopped := false
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		if stopped || !bytes.EqualFold(k, []byte("Sec-WebSocket-Protocol")) {
			return
		}
		for len(v) > 0 {
			var part []byte
			if i := bytes.IndexByte(v, ','); i >= 0 {
				part, v = v[:i], v[i+1:]
			} else {
				part, v = v, nil
			}
			if p := bytes.TrimSpace(part); len(p) > 0 && !fn(p) {
				stopped = true
				return
			}
		}
	})
}
