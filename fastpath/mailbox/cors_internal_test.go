package mailbox

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/cors"
)

func withCORS(t *testing.T, s *stateHandler, origins string) {
	t.Helper()
	o, err := cors.ParseOrigins(origins)
	if err != nil {
		t.Fatal(err)
	}
	s.h.cfg.CORS = cors.New(o, CORSRules())
}

// TestCORSPreflightKeepsNothing: preflights, whatever bearer they carry,
// make no bucket and load no mailbox.
func TestCORSPreflightKeepsNothing(t *testing.T) {
	s := newStateHandler(t, 0)
	withCORS(t, s, "https://app.example.com")
	for _, tok := range []string{"", "bad", stateToken} {
		for _, path := range []string{"/v1/chat/mailbox/preflight0000001", "/v1/chat/mailbox/preflight0000001/p2c/1", "/v1/chat/mailbox/preflight0000001/ice"} {
			if got := s.do("OPTIONS", path, tok, nil, "Origin", "https://app.example.com", "Access-Control-Request-Method", "PUT"); got != 204 {
				t.Fatalf("preflight of %s: %d, want 204", path, got)
			}
		}
	}
	if b, n := s.bucketsHeld(), s.loaded(); b != 0 || n != 0 {
		t.Fatalf("preflights left %d buckets and %d mailboxes in memory", b, n)
	}
}

// TestCORSAuthorizedReadsAllocNothing: with CORS on, the authorized reads
// of TestAuthorizedReadsAllocNothing from a listed origin (and from *),
// decorated, and a preflight still allocate nothing.
func TestCORSAuthorizedReadsAllocNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	const origin = "https://app.example.com"
	for _, origins := range []string{origin + ",http://localhost:3000", "*"} {
		s := newStateHandler(t, 0)
		withCORS(t, s, origins)
		base := "/v1/chat/mailbox/alloc00000000001"
		if got := s.do("PUT", base, stateToken, nil); got != 201 {
			t.Fatalf("claim: %d", got)
		}
		if got := s.do("PUT", base+"/p2c/1", stateToken, testEnvelope(1)); got != 201 {
			t.Fatalf("put: %d", got)
		}
		for _, r := range []struct {
			method, path string
			status       int
		}{
			{"HEAD", base + "/p2c", 200}, {"GET", base + "/p2c/1", 200}, {"OPTIONS", base + "/p2c/1", 204},
		} {
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod(r.method)
			ctx.Request.SetRequestURI(r.path)
			ctx.Request.Header.Set("Origin", origin)
			if r.method == "OPTIONS" {
				ctx.Request.Header.Set("Access-Control-Request-Method", "PUT")
				ctx.Request.Header.Set("Access-Control-Request-Headers", "authorization,content-type,x-relay-notify")
			} else {
				ctx.Request.Header.Set("Authorization", "Bearer "+stateToken)
			}
			if allocs, status := s.allocsPerServe(&ctx); allocs != 0 || status != r.status {
				t.Errorf("%s %s %s: %v allocations, status %d; want 0 and %d", origins, r.method, r.path, allocs, status, r.status)
			}
			if len(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) == 0 {
				t.Errorf("%s %s %s: not decorated", origins, r.method, r.path)
			}
		}
	}
}

// BenchmarkCORSAuthorizedHEAD is the handler's cost of an authorized HEAD
// of a direction with CORS off, with a list of origins and with *: the
// off case is the baseline the other two are read against.
func BenchmarkCORSAuthorizedHEAD(b *testing.B) {
	for _, c := range []struct{ name, origins string }{{"off", ""}, {"list", "https://app.example.com,http://localhost:3000"}, {"any", "*"}} {
		b.Run(c.name, func(b *testing.B) {
			s := newStateHandler(b, 0)
			o, err := cors.ParseOrigins(c.origins)
			if err != nil {
				b.Fatal(err)
			}
			s.h.cfg.CORS = cors.New(o, CORSRules())
			base := "/v1/chat/mailbox/bench00000000001"
			if got := s.do("PUT", base, stateToken, nil); got != 201 {
				b.Fatalf("claim: %d", got)
			}
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("HEAD")
			ctx.Request.SetRequestURI(base + "/p2c")
			ctx.Request.Header.Set("Authorization", "Bearer "+stateToken)
			ctx.Request.Header.Set("Origin", "https://app.example.com")
			b.ReportAllocs()
			for b.Loop() {
				s.now += int64(time.Second / 4) // a fetch token a call
				ctx.Response.Reset()
				s.h.ServeHTTP(&ctx)
			}
			if ctx.Response.StatusCode() != 200 {
				b.Fatalf("status %d", ctx.Response.StatusCode())
			}
		})
	}
}
