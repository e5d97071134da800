package cors_test

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/alloctest"
	"edgerelay/fastpath/cors"
)

func TestParseOriginsNormalizes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{" , ", ""},
		{"*", "*"},
		{" * ", "*"},
		{"*,*", "*"},
		{"https://app.example.com", "https://app.example.com"},
		{"HTTPS://App.Example.COM", "https://app.example.com"},
		{"https://app.example.com:443", "https://app.example.com"},
		{"http://localhost:80", "http://localhost"},
		{"http://localhost:3000", "http://localhost:3000"},
		{"https://a.example:80", "https://a.example:80"},
		{"http://[::1]:8080", "http://[::1]:8080"},
		{"http://127.0.0.1:65535", "http://127.0.0.1:65535"},
		{"capacitor://localhost", "capacitor://localhost"},
		{"https://a.example, https://b.example,https://a.example", "https://a.example,https://b.example"},
		{"https://a.example,", "https://a.example"},
	} {
		o, err := cors.ParseOrigins(c.in)
		if err != nil {
			t.Errorf("ParseOrigins(%q): %v", c.in, err)
			continue
		}
		if o.String() != c.want || o.On() != (c.want != "") || o.Any() != (c.want == "*") {
			t.Errorf("ParseOrigins(%q) = %q (on %v, any %v), want %q", c.in, o, o.On(), o.Any(), c.want)
		}
	}
}

func TestParseOriginsRefuses(t *testing.T) {
	for _, c := range []struct{ in, says string }{
		{"https://app.example.com/", "has a path"},
		{"https://app.example.com/app", "has a path"},
		{"https://app.example.com?x=1", "has a query"},
		{"https://app.example.com?", "has a query"},
		{"https://app.example.com#top", "has a fragment"},
		{"https://user@app.example.com", "user info"},
		{"app.example.com", "no scheme://host"},
		{"localhost:3000", "no scheme://host"},
		{"https://", "no scheme://host"},
		{"https://app.example.com:", "empty port"},
		{"https://app.example.com:0", "not 1 to 65535"},
		{"https://app.example.com:65536", "not 1 to 65535"},
		{"https://app.example.com:080", "not 1 to 65535"},
		{"https://app.example.com:x", "https://app.example.com:x"},
		{"https://*.example.com", "wildcard"},
		{"*,https://app.example.com", "cannot be mixed"},
		{"https://app.example.com, *", "cannot be mixed"},
		{"null", "refused"},
	} {
		_, err := cors.ParseOrigins(c.in)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ParseOrigins(%q) = %v, want an error saying %q", c.in, err, c.says)
		}
	}
}

var rules = cors.Rules{
	Methods:        []string{"GET", "HEAD", "PUT", "DELETE"},
	RequestHeaders: []string{"Authorization", "Content-Type", "X-Relay-Notify"},
	ExposeHeaders:  []string{"X-Relay-More", "Retry-After"},
}

func policy(t testing.TB, origins string) *cors.Policy {
	t.Helper()
	o, err := cors.ParseOrigins(origins)
	if err != nil {
		t.Fatal(err)
	}
	return cors.New(o, rules)
}

// request builds a request ctx; hdr is name, value pairs.
func request(method string, hdr ...string) *fasthttp.RequestCtx {
	ctx := new(fasthttp.RequestCtx)
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI("/v1/notes/mailbox/x")
	for i := 0; i+1 < len(hdr); i += 2 {
		ctx.Request.Header.Set(hdr[i], hdr[i+1])
	}
	return ctx
}

func header(ctx *fasthttp.RequestCtx, name string) string {
	return string(ctx.Response.Header.Peek(name))
}

const (
	listed   = "https://app.example.com"
	unlisted = "https://evil.example.com"
)

func TestPreflight(t *testing.T) {
	p := policy(t, listed+",http://localhost:3000")
	for _, c := range []struct {
		name, origin, method, headers string
		allowed                       bool
	}{
		{"listed", listed, "PUT", "authorization,content-type,x-relay-notify", true},
		{"listed, second", "http://localhost:3000", "GET", "authorization", true},
		{"header case and spaces", listed, "DELETE", " Authorization , X-RELAY-NOTIFY,", true},
		{"no request headers", listed, "GET", "", true},
		{"unlisted", unlisted, "PUT", "authorization", false},
		{"listed with a path", listed + "/", "PUT", "authorization", false},
		{"case differs from a browser's", "https://App.example.com", "PUT", "authorization", false},
		{"no origin", "", "PUT", "authorization", false},
		{"disallowed header", listed, "PUT", "authorization,x-custom", false},
		{"disallowed header alone", listed, "GET", "if-match", false},
		{"disallowed method", listed, "POST", "authorization", false},
		{"lowercase method", listed, "put", "authorization", false},
		{"no method", listed, "", "authorization", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var hdr []string
			if c.origin != "" {
				hdr = append(hdr, "Origin", c.origin)
			}
			if c.method != "" {
				hdr = append(hdr, "Access-Control-Request-Method", c.method)
			}
			if c.headers != "" {
				hdr = append(hdr, "Access-Control-Request-Headers", c.headers)
			}
			ctx := request("OPTIONS", hdr...)
			if !p.Preflight(ctx) {
				t.Fatal("Preflight did not answer an OPTIONS")
			}
			if got := ctx.Response.StatusCode(); got != 204 {
				t.Fatalf("status %d, want 204", got)
			}
			if got := header(ctx, "Vary"); got != "Origin, Access-Control-Request-Method, Access-Control-Request-Headers" {
				t.Errorf("Vary %q", got)
			}
			want := map[string]string{
				"Access-Control-Allow-Origin":      c.origin,
				"Access-Control-Allow-Methods":     "GET, HEAD, PUT, DELETE",
				"Access-Control-Allow-Headers":     "Authorization, Content-Type, X-Relay-Notify",
				"Access-Control-Max-Age":           "7200",
				"Access-Control-Expose-Headers":    "",
				"Access-Control-Allow-Credentials": "",
			}
			for name, v := range want {
				if !c.allowed || name == "Access-Control-Expose-Headers" || name == "Access-Control-Allow-Credentials" {
					v = ""
				}
				if got := header(ctx, name); got != v {
					t.Errorf("%s %q, want %q", name, got, v)
				}
			}
		})
	}
}

func TestPreflightAnyOrigin(t *testing.T) {
	p := policy(t, "*")
	ctx := request("OPTIONS", "Origin", unlisted, "Access-Control-Request-Method", "PUT", "Access-Control-Request-Headers", "authorization")
	if !p.Preflight(ctx) || header(ctx, "Access-Control-Allow-Origin") != "*" || header(ctx, "Access-Control-Allow-Headers") == "" {
		t.Fatalf("preflight with *: %s", &ctx.Response.Header)
	}
	// * still refuses a header the listener does not take.
	ctx = request("OPTIONS", "Origin", unlisted, "Access-Control-Request-Method", "PUT", "Access-Control-Request-Headers", "authorization,x-custom")
	if !p.Preflight(ctx) || header(ctx, "Access-Control-Allow-Origin") != "" || ctx.Response.StatusCode() != 204 {
		t.Fatalf("preflight with * and a disallowed header: %s", &ctx.Response.Header)
	}
}

func TestPreflightLeavesOtherMethods(t *testing.T) {
	p := policy(t, listed)
	for _, m := range []string{"GET", "HEAD", "PUT", "DELETE", "POST"} {
		ctx := request(m, "Origin", listed, "Access-Control-Request-Method", "PUT")
		if p.Preflight(ctx) {
			t.Errorf("Preflight answered a %s", m)
		}
		if len(ctx.Response.Header.Peek("Vary")) != 0 || ctx.Response.StatusCode() != 200 {
			t.Errorf("Preflight touched the answer of a %s: %s", m, &ctx.Response.Header)
		}
	}
}

func TestDecorate(t *testing.T) {
	for _, c := range []struct {
		name, origins, origin, allow, vary string
	}{
		{"listed", listed, listed, listed, "Origin"},
		{"unlisted", listed, unlisted, "", "Origin"},
		{"no origin", listed, "", "", "Origin"},
		{"any", "*", unlisted, "*", ""},
		{"any without origin", "*", "", "*", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var hdr []string
			if c.origin != "" {
				hdr = []string{"Origin", c.origin}
			}
			ctx := request("PUT", hdr...)
			policy(t, c.origins).Decorate(ctx)
			expose := ""
			if c.allow != "" {
				expose = "X-Relay-More, Retry-After"
			}
			if got := header(ctx, "Access-Control-Allow-Origin"); got != c.allow {
				t.Errorf("Allow-Origin %q, want %q", got, c.allow)
			}
			if got := header(ctx, "Access-Control-Expose-Headers"); got != expose {
				t.Errorf("Expose-Headers %q, want %q", got, expose)
			}
			if got := header(ctx, "Vary"); got != c.vary {
				t.Errorf("Vary %q, want %q", got, c.vary)
			}
			for _, h := range []string{"Access-Control-Allow-Methods", "Access-Control-Allow-Headers", "Access-Control-Max-Age", "Access-Control-Allow-Credentials"} {
				if got := header(ctx, h); got != "" {
					t.Errorf("%s %q on an answer that is no preflight", h, got)
				}
			}
		})
	}
}

// TestOffIsNil: an empty setting makes no policy, and a nil policy
// neither answers nor adds anything.
func TestOffIsNil(t *testing.T) {
	var p *cors.Policy = policy(t, "")
	if p != nil {
		t.Fatal("an empty setting made a policy")
	}
	ctx := request("OPTIONS", "Origin", listed, "Access-Control-Request-Method", "PUT")
	if p.Preflight(ctx) {
		t.Fatal("a nil policy answered a preflight")
	}
	p.Decorate(ctx)
	ctx.Response.Header.VisitAll(func(k, v []byte) {
		if k := string(k); k != "Content-Type" && k != "Server" && k != "Date" {
			t.Errorf("a nil policy set %s: %s", k, v)
		}
	})
}

// TestDecisionsAllocNothing: with CORS on, a preflight and a decorated
// answer allocate nothing once the response header's buffers have grown.
func TestDecisionsAllocNothing(t *testing.T) {
	alloctest.SkipUnderRace(t)
	for _, origins := range []string{listed, "*"} {
		p := policy(t, origins)
		pre := request("OPTIONS", "Origin", listed, "Access-Control-Request-Method", "PUT",
			"Access-Control-Request-Headers", "authorization,content-type,x-relay-notify")
		put := request("PUT", "Origin", listed)
		other := request("PUT", "Origin", unlisted)
		for name, step := range map[string]func() error{
			"preflight": func() error { pre.Response.Reset(); p.Preflight(pre); return nil },
			"listed":    func() error { put.Response.Reset(); p.Decorate(put); return nil },
			"unlisted":  func() error { other.Response.Reset(); p.Decorate(other); return nil },
		} {
			if c := alloctest.Measure(t, 100, 1000, step); c.PerRun != 0 || c.Mallocs != 0 {
				t.Errorf("%s %s: %v allocations a run (%d over %d)", origins, name, c.PerRun, c.Mallocs, c.Runs)
			}
		}
		if header(pre, "Access-Control-Allow-Origin") == "" || header(put, "Access-Control-Allow-Origin") == "" {
			t.Fatalf("%s: the measured steps were not allowed", origins)
		}
	}
}
