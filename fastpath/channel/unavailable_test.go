package channel_test

import (
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// A claim while the store refuses writes (a reserve larger than any disk)
// answers 503 "storage unavailable" with Retry-After and spends nothing.
func TestClaimWhileStoreRefusesWrites(t *testing.T) {
	dir := t.TempDir()
	key := strings.Repeat("c", 64)
	db, err := store.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.NewChannelClaims(db).AddKey(httpx.Hash([]byte(key)), "box", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = store.OpenOptions(dir, nil, store.Options{DiskReserve: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	claims := store.NewChannelClaims(db)
	h := channel.New(channel.Config{Claims: claims})
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/claim")
	ctx.Request.Header.Set("Authorization", "Bearer "+key)
	ctx.Request.SetBodyString(`{"ownerToken":"` + strings.Repeat("a", 64) + `","phoneToken":"` + strings.Repeat("b", 64) + `"}`)
	h.ServeHTTP(&ctx)
	if got := ctx.Response.StatusCode(); got != 503 || string(ctx.Response.Body()) != `{"error":"storage unavailable"}` ||
		string(ctx.Response.Header.Peek("Retry-After")) != store.RetryAfter {
		t.Fatalf("claim with the store refusing writes: %d %s, Retry-After %q", got, ctx.Response.Body(), ctx.Response.Header.Peek("Retry-After"))
	}
	keys, err := claims.Keys()
	if err != nil || len(keys) != 1 || keys[0].Used {
		t.Fatalf("after the refused claim: %+v %v; want the key unused", keys, err)
	}
}
