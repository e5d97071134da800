package mailbox_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/cors"
	"edgerelay/fastpath/mailbox"
)

const (
	pageOrigin  = "https://app.example.com"
	otherOrigin = "https://evil.example.com"
	// What a browser asks before an envelope PUT with X-Relay-Notify.
	askedHeaders = "authorization,content-type,x-relay-notify"
	exposed      = "X-Relay-First, X-Relay-Last, X-Relay-Count, X-Relay-More, Retry-After"
)

func startCORS(t *testing.T, origins string) *relay {
	t.Helper()
	o, err := cors.ParseOrigins(origins)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, opts{cors: cors.New(o, mailbox.CORSRules())})
}

// preflight sends what a browser sends before a cross-origin request:
// no bearer, the method and headers it is about to use.
func (r *relay) preflight(path, origin, method, headers string, extra ...string) answer {
	r.t.Helper()
	hdr := append([]string{"Access-Control-Request-Method", method}, extra...)
	if origin != "" {
		hdr = append(hdr, "Origin", origin)
	}
	if headers != "" {
		hdr = append(hdr, "Access-Control-Request-Headers", headers)
	}
	return r.do("OPTIONS", path, "", nil, hdr...)
}

// corsHeaders returns every Access-Control-* header of an answer.
func corsHeaders(h http.Header) map[string]string {
	m := map[string]string{}
	for k, v := range h {
		if strings.HasPrefix(k, "Access-Control-") {
			m[k] = strings.Join(v, ",")
		}
	}
	return m
}

func expectAllowedPreflight(t *testing.T, a answer, origin string) {
	t.Helper()
	want := map[string]string{
		"Access-Control-Allow-Origin":  origin,
		"Access-Control-Allow-Methods": "GET, HEAD, PUT, DELETE",
		"Access-Control-Allow-Headers": "Authorization, Content-Type, X-Relay-Notify",
		"Access-Control-Max-Age":       "7200",
	}
	if a.status != http.StatusNoContent || len(a.body) != 0 {
		t.Fatalf("preflight %d %q, want 204 and no body", a.status, a.body)
	}
	if got := corsHeaders(a.header); !equalMaps(got, want) {
		t.Fatalf("preflight headers %v, want %v", got, want)
	}
}

func expectRefusedPreflight(t *testing.T, a answer) {
	t.Helper()
	if a.status != http.StatusNoContent || len(a.body) != 0 {
		t.Fatalf("refused preflight %d %q, want 204 and no body", a.status, a.body)
	}
	if got := corsHeaders(a.header); len(got) != 0 {
		t.Fatalf("refused preflight carries %v", got)
	}
}

// expectDecorated asserts an answer a page on origin may read.
func expectDecorated(t *testing.T, a answer, allow string, vary bool) {
	t.Helper()
	want := map[string]string{}
	if allow != "" {
		want = map[string]string{"Access-Control-Allow-Origin": allow, "Access-Control-Expose-Headers": exposed}
	}
	if got := corsHeaders(a.header); !equalMaps(got, want) {
		t.Fatalf("answer %d carries %v, want %v", a.status, got, want)
	}
	if got := a.header.Get("Vary"); (got == "Origin") != vary || (!vary && got != "") {
		t.Fatalf("answer %d Vary %q, want Origin: %v", a.status, got, vary)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestCORSListedOrigin: a page on a listed origin is let through the
// preflight and can read every answer of a claim, a PUT, a HEAD, a batch
// and a 429, including the headers the client reads.
func TestCORSListedOrigin(t *testing.T) {
	t.Parallel()
	r := startCORS(t, pageOrigin+",http://localhost:3000")
	expectAllowedPreflight(t, r.preflight(mb("notes"), pageOrigin, "PUT", "authorization"), pageOrigin)
	expectAllowedPreflight(t, r.preflight(mb("notes")+"/p2c/1", pageOrigin, "PUT", askedHeaders), pageOrigin)
	expectAllowedPreflight(t, r.preflight(mb("notes")+"/p2c", "http://localhost:3000", "HEAD", "authorization"), "http://localhost:3000")

	o := []string{"Origin", pageOrigin}
	a := r.do("PUT", mb("notes"), token, nil, o...)
	expect(t, a, 201, "")
	expectDecorated(t, a, pageOrigin, true)
	a = r.put("notes", "p2c", 1, envelope(1, 8, 'a'), append(o, "X-Relay-Notify", "silent")...)
	expect(t, a, 201, "")
	expectDecorated(t, a, pageOrigin, true)
	a = r.do("HEAD", mb("notes")+"/p2c", token, nil, o...)
	expect(t, a, 200, "")
	expectDecorated(t, a, pageOrigin, true)
	if a.header.Get("X-Relay-Last") != "1" || a.header.Get("X-Relay-Count") != "1" {
		t.Fatalf("HEAD headers %v", a.header)
	}
	a = r.do("GET", mb("notes")+"/p2c?after=0", token, nil, o...)
	expect(t, a, 200, "")
	expectDecorated(t, a, pageOrigin, true)
	// Errors too: a page tells 403 from a network failure.
	a = r.do("GET", mb("notes")+"/p2c/1", other, nil, o...)
	expect(t, a, 403, "forbidden")
	expectDecorated(t, a, pageOrigin, true)
	// The fetch bucket (240) runs dry under the test's stopped clock: the
	// 429's Retry-After is readable.
	for i := 0; ; i++ {
		a = r.do("HEAD", mb("notes")+"/p2c", token, nil, o...)
		if a.status == 429 || i > 300 {
			break
		}
	}
	if a.status != 429 || a.header.Get("Retry-After") == "" {
		t.Fatalf("no 429 with Retry-After: %d %v", a.status, a.header)
	}
	expectDecorated(t, a, pageOrigin, true)
}

// TestCORSUnlistedOrigin: another origin gets no CORS header from a
// preflight or an answer; the request itself is served as without CORS
// (the bearer decides, not the origin).
func TestCORSUnlistedOrigin(t *testing.T) {
	t.Parallel()
	r := startCORS(t, pageOrigin)
	expectRefusedPreflight(t, r.preflight(mb("notes"), otherOrigin, "PUT", "authorization"))
	// An origin a browser would never send (a path, other case) is another origin.
	expectRefusedPreflight(t, r.preflight(mb("notes"), pageOrigin+"/", "PUT", "authorization"))
	expectRefusedPreflight(t, r.preflight(mb("notes"), "https://APP.example.com", "PUT", "authorization"))
	a := r.do("PUT", mb("notes"), token, nil, "Origin", otherOrigin)
	expect(t, a, 201, "")
	expectDecorated(t, a, "", true)
}

// TestCORSAnyOrigin: * lets every origin through, with no Vary, and
// still refuses a header the mailbox does not take.
func TestCORSAnyOrigin(t *testing.T) {
	t.Parallel()
	r := startCORS(t, "*")
	expectAllowedPreflight(t, r.preflight(mb("notes")+"/p2c/1", otherOrigin, "PUT", askedHeaders), "*")
	expectRefusedPreflight(t, r.preflight(mb("notes")+"/p2c/1", otherOrigin, "PUT", askedHeaders+",x-custom"))
	a := r.do("PUT", mb("notes"), token, nil, "Origin", otherOrigin)
	expect(t, a, 201, "")
	expectDecorated(t, a, "*", false)
	// Without an Origin the answer is the same, so a cache may share it.
	a = r.do("HEAD", mb("notes")+"/p2c", token, nil)
	expect(t, a, 200, "")
	expectDecorated(t, a, "*", false)
}

// TestCORSNoOrigin: a client that is not a browser page (no Origin) gets
// no CORS header, only the Vary that keeps caches honest.
func TestCORSNoOrigin(t *testing.T) {
	t.Parallel()
	r := startCORS(t, pageOrigin)
	expectRefusedPreflight(t, r.preflight(mb("notes"), "", "PUT", "authorization"))
	a := r.do("PUT", mb("notes"), token, nil)
	expect(t, a, 201, "")
	expectDecorated(t, a, "", true)
}

// TestCORSPreflightDisallowed: a listed origin asking for a header or a
// method the mailbox does not take gets no CORS header, so the browser
// never sends the request.
func TestCORSPreflightDisallowed(t *testing.T) {
	t.Parallel()
	r := startCORS(t, pageOrigin)
	for _, c := range []struct{ method, headers string }{
		{"PUT", askedHeaders + ",x-custom"},
		{"GET", "authorization,if-none-match"}, // the spec has no conditional requests
		{"POST", "authorization"},
		{"PATCH", ""},
	} {
		expectRefusedPreflight(t, r.preflight(mb("notes")+"/p2c/1", pageOrigin, c.method, c.headers))
	}
	// At the edge: the allowed headers alone pass, one more does not.
	expectAllowedPreflight(t, r.preflight(mb("notes")+"/p2c/1", pageOrigin, "PUT", askedHeaders), pageOrigin)
}

// TestCORSPreflightBeforeAuthorization: a preflight is answered 204
// before the bearer is looked at, whatever it carries, and keeps
// nothing: the mailbox it names does not exist afterwards.
func TestCORSPreflightBeforeAuthorization(t *testing.T) {
	t.Parallel()
	r := startCORS(t, pageOrigin)
	for _, bearer := range []string{"Bearer bad", "Bearer " + other, "Bearer " + token, "Basic eA=="} {
		expectAllowedPreflight(t, r.preflight(mb("notes"), pageOrigin, "PUT", "authorization", "Authorization", bearer), pageOrigin)
	}
	// Unknown apps and paths are answered alike: nothing is parsed first.
	expectAllowedPreflight(t, r.preflight("/v1/nope/mailbox/"+id, pageOrigin, "GET", "authorization"), pageOrigin)
	expect(t, r.do("GET", mb("notes")+"/p2c/1", token, nil), 404, "not_found")
	expect(t, r.do("PUT", mb("notes"), other, nil), 201, "") // not taken by the preflights' bearer
}

// TestCORSOff: without RELAY_CORS_ORIGINS nothing changes: a preflight
// is a request like any other (401: no bearer), and no answer carries a
// CORS header or Vary.
func TestCORSOff(t *testing.T) {
	t.Parallel()
	r := start(t, opts{})
	a := r.preflight(mb("notes"), pageOrigin, "PUT", "authorization")
	expect(t, a, 401, "unauthorized")
	expectDecorated(t, a, "", false)
	a = r.do("PUT", mb("notes"), token, nil, "Origin", pageOrigin)
	expect(t, a, 201, "")
	expectDecorated(t, a, "", false)
}

// TestCORSListenerRefusals: the answers the listener makes before the
// handler (ServeError: a body over the limit, …) are readable too.
func TestCORSListenerRefusals(t *testing.T) {
	t.Parallel()
	o, err := cors.ParseOrigins(pageOrigin)
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, opts{cors: cors.New(o, mailbox.CORSRules())})
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("PUT")
	ctx.Request.SetRequestURI(mb("notes") + "/p2c/1")
	ctx.Request.Header.Set("Origin", pageOrigin)
	r.h.ServeError(&ctx, fasthttp.ErrBodyTooLarge)
	if ctx.Response.StatusCode() != 413 || string(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != pageOrigin {
		t.Fatalf("ServeError answer %d with %s", ctx.Response.StatusCode(), &ctx.Response.Header)
	}
}
