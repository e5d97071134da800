package pushgw

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"net/netip"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
)

// errBodyWithheld: the listener withheld the body (AnswersFromHeaders said
// the handler would not need it), yet the handler got as far as reading
// it. Only a key that became usable between the headers and the handler
// does that.
var errBodyWithheld = errors.New("pushgw: body withheld")

// AnswersFromHeaders reports whether the request whose headers are hdr is
// answered without reading its body: its route is unknown, or a check the
// headers decide refuses it before the body is read, in the spec's order
// (/send: no key, an unknown, disabled or expired key, a Content-Length
// over MaxBodyBytes; /register: registration closed, no usable address in
// the trusted proxy header, a Content-Length over its 4 KiB). Use it as
// the listener's server.Service.AnswerBeforeBody: such refusals are then
// answered at once, without waiting for body bytes the client may never
// send, and an "Expect: 100-continue" gets the refusal instead of
// "100 Continue".
//
// It decides only whether the body is needed; the handler still runs every
// check itself, in order, and answers. Checks that need the connection or
// change state (the /register address and its minute limit) stay in the
// handler: /register's body limit is withheld for every caller, so the
// handler reaches its 413 after them, as the reference does.
func (h *Handler) AnswersFromHeaders(hdr *fasthttp.RequestHeader) bool {
	if !hdr.IsPost() {
		return true // GET /health reads no body; every other method is 404
	}
	u := fasthttp.AcquireURI()
	defer fasthttp.ReleaseURI(u)
	// The same parse and path normalization as ctx.Path() in ServeHTTP, so
	// that both see the same route.
	if err := u.Parse(nil, hdr.RequestURI()); err != nil {
		return false // let fasthttp and the handler refuse it
	}
	path := u.Path()
	if len(path) > 1 && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	switch string(path) {
	case "/send":
		tok := httpx.BearerValue(hdr.Peek("Authorization"))
		if tok == nil {
			return true
		}
		key, ok := h.store.KeyByHash(sha256.Sum256(tok))
		if !ok || !key.Enabled || key.Expired(h.now()) {
			return true
		}
		return hdr.ContentLength() > MaxBodyBytes
	case "/register":
		if !h.register {
			return true
		}
		if h.proxyHeader != "" {
			if _, ok := proxyBucket(hdr.Peek(h.proxyHeader)); !ok {
				return true
			}
		}
		return hdr.ContentLength() > maxRegisterBody
	}
	return true // 404
}

// proxyBucket is the address bucket of a trusted proxy header's value.
// X-Forwarded-For style lists: the proxy appends the address it saw, so
// only the last element is the proxy's word.
func proxyBucket(v []byte) (string, bool) {
	if i := bytes.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	a, err := netip.ParseAddr(string(bytes.TrimSpace(v)))
	if err != nil {
		return "", false
	}
	return addressBucket(a)
}
