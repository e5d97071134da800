// Package cors lets web pages on other origins call a listener's HTTP
// endpoints (RELAY_CORS_ORIGINS). The setting is parsed once into Origins;
// each listener turns it into a Policy with the Rules of its protocol
// (which methods and request headers its endpoints take, which response
// headers a page reads). Every header value is built by New, so that on a
// request the decision is a map lookup and a few header writes that
// allocate nothing. A nil *Policy is CORS off: both methods return at once.
//
// Credentials are a bearer header, never cookies, so no answer carries
// Access-Control-Allow-Credentials: a listed page may send Authorization
// because the preflight allows that header, and the browser sends no
// ambient credential that another page could ride on.
package cors

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// Origins is the parsed RELAY_CORS_ORIGINS: nothing (off), every origin
// (*), or a list of serialized origins (scheme://host[:port], lowercase,
// without the scheme's default port), the form a browser's Origin header
// takes, so that a check is an exact lookup.
type Origins struct {
	any  bool
	list []string
}

// On reports whether any origin is allowed.
func (o Origins) On() bool { return o.any || len(o.list) > 0 }

// Any reports whether every origin is allowed (*).
func (o Origins) Any() bool { return o.any }

// List returns the allowed origins in the order given, normalized; nil
// for * or off.
func (o Origins) List() []string { return append([]string(nil), o.list...) }

// String is the setting in its normalized form.
func (o Origins) String() string {
	if o.any {
		return "*"
	}
	return strings.Join(o.list, ",")
}

// ParseOrigins reads the setting: empty (off), "*", or origins separated
// by commas. An origin is scheme://host[:port] and nothing more: a path
// (even "/"), query, fragment or user info is refused rather than cut off,
// because a browser never sends one and the operator meant something else.
// "null" is refused: sandboxed frames and file: pages all send it, so
// allowing it would allow all of them. Blank entries are skipped and
// duplicates kept once.
func ParseOrigins(s string) (Origins, error) {
	var o Origins
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			continue
		case f == "*":
			o.any = true
			continue
		}
		origin, err := parseOrigin(f)
		if err != nil {
			return Origins{}, err
		}
		if !seen[origin] {
			seen[origin] = true
			o.list = append(o.list, origin)
		}
	}
	if o.any && len(o.list) > 0 {
		return Origins{}, errors.New(`"*" allows every origin and cannot be mixed with a list of origins: give either * or the list`)
	}
	return o, nil
}

// parseOrigin checks one origin and returns it serialized as a browser
// would send it.
func parseOrigin(f string) (string, error) {
	const form = "an origin is scheme://host[:port], e.g. https://app.example.com"
	if strings.EqualFold(f, "null") {
		return "", fmt.Errorf("origin %q is refused: sandboxed frames and file pages all send it, so it would allow any of them", f)
	}
	if strings.Contains(f, "*") {
		return "", fmt.Errorf("origin %q has a wildcard: only the whole setting may be *; list each origin", f)
	}
	u, err := url.Parse(f)
	switch {
	case err != nil:
		return "", fmt.Errorf("origin %q: %v (%s)", f, err, form)
	case u.Scheme == "" || u.Opaque != "" || u.Host == "":
		return "", fmt.Errorf("origin %q has no scheme://host (%s)", f, form)
	case u.User != nil:
		return "", fmt.Errorf("origin %q has user info (%s)", f, form)
	case u.Path != "" || u.RawPath != "":
		return "", fmt.Errorf("origin %q has a path %q (%s)", f, u.Path, form)
	case u.RawQuery != "" || u.ForceQuery:
		return "", fmt.Errorf("origin %q has a query (%s)", f, form)
	case u.Fragment != "" || strings.Contains(f, "#"):
		return "", fmt.Errorf("origin %q has a fragment (%s)", f, form)
	case u.Hostname() == "":
		return "", fmt.Errorf("origin %q has no host (%s)", f, form)
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("origin %q has an empty port (%s)", f, form)
	}
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 || port[0] == '0' {
			return "", fmt.Errorf("origin %q has port %q, not 1 to 65535 (%s)", f, port, form)
		}
		if (scheme == "http" && n == 80) || (scheme == "https" && n == 443) {
			port = "" // a browser leaves the default port out
		}
	}
	if strings.Contains(host, ":") { // IPv6, bracketed in an origin
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host, nil
}

// Rules are what one listener's endpoints take and give, from its spec.
type Rules struct {
	// Methods a preflight may ask for (Access-Control-Request-Method).
	Methods []string
	// RequestHeaders a page may send beyond the CORS-safelisted ones
	// (Authorization, a Content-Type other than the form types, the
	// protocol's own headers). Case does not matter.
	RequestHeaders []string
	// ExposeHeaders are the response headers a page may read beyond the
	// safelisted ones (Content-Type, Content-Length, Cache-Control, …).
	ExposeHeaders []string
}

// MaxAge is how long a browser may keep a preflight's answer. Chromium
// caps it at 2 hours, Firefox at 24: 2 hours spares every page all but
// one preflight per endpoint and method in that time.
const MaxAge = 7200

// Policy answers the preflights of one listener and decorates its
// answers. Its fields are written by New only; a Policy serves every
// request concurrently.
type Policy struct {
	any     bool
	origins map[string][]byte // allowed origin -> the Allow-Origin value, the same bytes
	methods [][]byte
	headers [][]byte // lowercase

	allowMethods, allowHeaders, expose, maxAge []byte
}

// Header names in fasthttp's canonical form, for PeekCanonical and
// SetCanonical, which then neither copy nor normalize the name.
var (
	hOrigin         = []byte("Origin")
	hRequestMethod  = []byte("Access-Control-Request-Method")
	hRequestHeaders = []byte("Access-Control-Request-Headers")
	hAllowOrigin    = []byte("Access-Control-Allow-Origin")
	hAllowMethods   = []byte("Access-Control-Allow-Methods")
	hAllowHeaders   = []byte("Access-Control-Allow-Headers")
	hExposeHeaders  = []byte("Access-Control-Expose-Headers")
	hMaxAge         = []byte("Access-Control-Max-Age")
	hVary           = []byte("Vary")
	star            = []byte("*")
	varyOrigin      = []byte("Origin")
	// A preflight's answer depends on the three request headers it reads.
	varyPreflight = []byte("Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
)

// New returns the policy of origins under rules, or nil (CORS off) when
// origins allows none.
func New(origins Origins, rules Rules) *Policy {
	if !origins.On() {
		return nil
	}
	p := &Policy{
		any:          origins.any,
		origins:      make(map[string][]byte, len(origins.list)),
		allowMethods: []byte(strings.Join(rules.Methods, ", ")),
		allowHeaders: []byte(strings.Join(rules.RequestHeaders, ", ")),
		expose:       []byte(strings.Join(rules.ExposeHeaders, ", ")),
		maxAge:       []byte(strconv.Itoa(MaxAge)),
	}
	for _, o := range origins.list {
		p.origins[o] = []byte(o)
	}
	for _, m := range rules.Methods {
		p.methods = append(p.methods, []byte(m))
	}
	for _, h := range rules.RequestHeaders {
		p.headers = append(p.headers, []byte(strings.ToLower(h)))
	}
	return p
}

// allowOrigin is the Access-Control-Allow-Origin value for a request from
// origin, or nil when it is not allowed. With * it is * even without an
// Origin header, so that the answer does not depend on one.
func (p *Policy) allowOrigin(origin []byte) []byte {
	if p.any {
		return star
	}
	if len(origin) == 0 {
		return nil
	}
	return p.origins[string(origin)] // no allocation: the conversion is only the key
}

// Preflight answers an OPTIONS request, before any authorization (a
// browser sends a preflight without credentials), and reports whether it
// did; the caller then returns. Any other method, or a nil Policy, is
// left to the caller. The answer is always 204 with no body; it carries
// the CORS headers only for an allowed origin asking for an allowed
// method and allowed headers, so the browser refuses the rest. 204 rather
// than 403 for a refusal: the missing headers already refuse, a 403 would
// read in logs and metrics like the protocol's bearer mismatch, and
// whether a preflight is allowed is the same for every path of the
// listener.
func (p *Policy) Preflight(ctx *fasthttp.RequestCtx) bool {
	if p == nil { // inlined: CORS off costs the caller one comparison
		return false
	}
	return p.preflight(ctx)
}

func (p *Policy) preflight(ctx *fasthttp.RequestCtx) bool {
	if !ctx.IsOptions() {
		return false
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	hdr := &ctx.Response.Header
	hdr.SetCanonical(hVary, varyPreflight)
	req := &ctx.Request.Header
	allow := p.allowOrigin(req.PeekCanonical(hOrigin))
	if allow == nil || !p.methodAllowed(req.PeekCanonical(hRequestMethod)) || !p.headersAllowed(req.PeekCanonical(hRequestHeaders)) {
		return true
	}
	hdr.SetCanonical(hAllowOrigin, allow)
	hdr.SetCanonical(hAllowMethods, p.allowMethods)
	if len(p.allowHeaders) > 0 {
		hdr.SetCanonical(hAllowHeaders, p.allowHeaders)
	}
	hdr.SetCanonical(hMaxAge, p.maxAge)
	return true
}

// methodAllowed: methods are compared exactly, as browsers send them
// (the standard ones uppercase).
func (p *Policy) methodAllowed(m []byte) bool {
	for _, a := range p.methods {
		if bytes.Equal(m, a) {
			return true
		}
	}
	return false
}

// headersAllowed reports whether every name of a comma-separated
// Access-Control-Request-Headers value is allowed (empty: none asked).
// The allowed list is a handful of names, so a scan beats a map.
func (p *Policy) headersAllowed(list []byte) bool {
	for len(list) > 0 {
		var name []byte
		if i := bytes.IndexByte(list, ','); i >= 0 {
			name, list = list[:i], list[i+1:]
		} else {
			name, list = list, nil
		}
		name = bytes.TrimSpace(name)
		if len(name) == 0 {
			continue
		}
		ok := false
		for _, a := range p.headers {
			if bytes.EqualFold(name, a) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Decorate adds the CORS headers to the answer of any request but a
// preflight: Access-Control-Allow-Origin and -Expose-Headers for an
// allowed origin. Call it before the answer is written; nothing here
// survives a Response.Reset. With a list of origins every answer carries
// Vary: Origin, since it depends on it (a cache must not hand one
// origin's answer to another, or a plain answer to a page); with * every
// answer, with or without an Origin header, carries the same headers and
// needs no Vary. A nil Policy does nothing.
func (p *Policy) Decorate(ctx *fasthttp.RequestCtx) {
	if p == nil { // inlined, like Preflight's
		return
	}
	p.decorate(ctx)
}

func (p *Policy) decorate(ctx *fasthttp.RequestCtx) {
	hdr := &ctx.Response.Header
	if !p.any {
		hdr.SetCanonical(hVary, varyOrigin)
	}
	allow := p.allowOrigin(ctx.Request.Header.PeekCanonical(hOrigin))
	if allow == nil {
		return
	}
	hdr.SetCanonical(hAllowOrigin, allow)
	if len(p.expose) > 0 {
		hdr.SetCanonical(hExposeHeaders, p.expose)
	}
}
