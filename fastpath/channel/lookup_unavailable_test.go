package channel_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// unavailableLookups is a claim store whose token lookups fail as a
// cluster's do without quorum.
type unavailableLookups struct{ store.ChannelClaimStore }

func (unavailableLookups) ByOwner(store.Hash) (store.ChannelKey, error) {
	return store.ChannelKey{}, fmt.Errorf("cluster: read owner hint: %w: no quorum", store.ErrUnavailable)
}

func (unavailableLookups) ByPhone(store.Hash) (store.ChannelKey, error) {
	return store.ChannelKey{}, fmt.Errorf("cluster: read phone hint: %w: no quorum", store.ErrUnavailable)
}

// A token lookup the store cannot answer is 503 with Retry-After on every
// path that authenticates by token, never the "unknown token" refusal that
// would make a client forget a good token; a token the store does not know
// is still refused as before.
func TestTokenLookupUnavailableIs503(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	claims := store.NewChannelClaims(db)
	key := strings.Repeat("c", 64)
	owner, phone := strings.Repeat("a", 64), strings.Repeat("b", 64)
	if err := claims.AddKey(httpx.Hash([]byte(key)), "box", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := claims.Claim(httpx.Hash([]byte(key)), httpx.Hash([]byte(owner)), httpx.Hash([]byte(phone)), time.Now()); err != nil {
		t.Fatal(err)
	}
	serve := func(h *channel.Handler, method, path, bearer string) *fasthttp.RequestCtx {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.Set("Authorization", "Bearer "+bearer)
		// A websocket handshake, so that only the token decides.
		ctx.Request.Header.Set("Connection", "Upgrade")
		ctx.Request.Header.Set("Upgrade", "websocket")
		ctx.Request.Header.Set("Sec-WebSocket-Version", "13")
		ctx.Request.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		h.ServeHTTP(&ctx)
		return &ctx
	}
	down := channel.New(channel.Config{Claims: unavailableLookups{claims}})
	up := channel.New(channel.Config{Claims: claims})
	for _, c := range []struct {
		method, path, tok string
		unknown           int
	}{
		{"GET", "/status", owner, 404},
		{"GET", "/host", owner, 403},
		{"GET", "/botharness-device/channel", phone, 403},
	} {
		ctx := serve(down, c.method, c.path, c.tok)
		if got := ctx.Response.StatusCode(); got != 503 || string(ctx.Response.Body()) != `{"error":"storage unavailable"}` ||
			string(ctx.Response.Header.Peek("Retry-After")) != store.RetryAfter {
			t.Fatalf("%s %s with lookups unavailable: %d %s, Retry-After %q", c.method, c.path, got, ctx.Response.Body(), ctx.Response.Header.Peek("Retry-After"))
		}
		ctx = serve(up, c.method, c.path, strings.Repeat("f", 64))
		if got := ctx.Response.StatusCode(); got != c.unknown {
			t.Fatalf("%s %s with an unknown token: %d %s, want %d", c.method, c.path, got, ctx.Response.Body(), c.unknown)
		}
	}
}
