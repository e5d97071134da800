package agent_test

import (
	"testing"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/cors"
	"edgerelay/store"
)

// corsHandler is a Handler served in-process, with CORS from origins.
func corsHandler(t *testing.T, origins string) *agent.Handler {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	key, err := agent.LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	o, err := cors.ParseOrigins(origins)
	if err != nil {
		t.Fatal(err)
	}
	h, err := agent.New(agent.Config{Store: store.NewAgentStore(db), Key: key, CORS: cors.New(o, agent.CORSRules())})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func serveCtx(h *agent.Handler, method, path string, hdr ...string) *fasthttp.RequestCtx {
	ctx := new(fasthttp.RequestCtx)
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(path)
	for i := 0; i+1 < len(hdr); i += 2 {
		ctx.Request.Header.Set(hdr[i], hdr[i+1])
	}
	h.ServeHTTP(ctx)
	return ctx
}

const corsPage = "https://setup.example.com"

// TestCORSRedeem: a page on a listed origin passes the preflight of
// POST /v1/pair/redeem and reads its answer; another origin, another
// method or header, and CORS off get no CORS header.
func TestCORSRedeem(t *testing.T) {
	t.Parallel()
	h := corsHandler(t, corsPage)
	pre := func(origin, method, headers string) *fasthttp.RequestCtx {
		return serveCtx(h, "OPTIONS", "/v1/pair/redeem", "Origin", origin,
			"Access-Control-Request-Method", method, "Access-Control-Request-Headers", headers)
	}
	ctx := pre(corsPage, "POST", "content-type")
	if ctx.Response.StatusCode() != 204 || string(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != corsPage ||
		string(ctx.Response.Header.Peek("Access-Control-Allow-Methods")) != "POST" ||
		string(ctx.Response.Header.Peek("Access-Control-Allow-Headers")) != "Content-Type" {
		t.Fatalf("preflight: %d %s", ctx.Response.StatusCode(), &ctx.Response.Header)
	}
	for _, c := range [][3]string{
		{"https://evil.example.com", "POST", "content-type"},
		{corsPage, "PUT", "content-type"},
		{corsPage, "POST", "content-type,authorization"},
	} {
		ctx := pre(c[0], c[1], c[2])
		if ctx.Response.StatusCode() != 204 || len(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != 0 {
			t.Errorf("preflight %v: %d %s", c, ctx.Response.StatusCode(), &ctx.Response.Header)
		}
	}
	ctx = serveCtx(h, "POST", "/v1/pair/redeem", "Origin", corsPage, "Content-Type", "application/json")
	if ctx.Response.StatusCode() != 400 || string(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != corsPage ||
		string(ctx.Response.Header.Peek("Vary")) != "Origin" {
		t.Fatalf("redeem: %d %s", ctx.Response.StatusCode(), &ctx.Response.Header)
	}
	// The link is no endpoint of a page's: no CORS header there.
	ctx = serveCtx(h, "GET", "/v1/connect", "Origin", corsPage)
	if len(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != 0 {
		t.Fatalf("/v1/connect answer: %s", &ctx.Response.Header)
	}

	off := corsHandler(t, "")
	ctx = serveCtx(off, "OPTIONS", "/v1/pair/redeem", "Origin", corsPage, "Access-Control-Request-Method", "POST")
	if ctx.Response.StatusCode() != 405 || len(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != 0 {
		t.Fatalf("preflight with CORS off: %d %s", ctx.Response.StatusCode(), &ctx.Response.Header)
	}
}
