package mailbox_test

import (
	"testing"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

// A store that refuses writes (here: a reserve larger than any disk)
// makes every write answer 503 storage_unavailable with Retry-After, and
// reads answer as usual.
func TestStoreRefusingWritesAnswers503(t *testing.T) {
	db, err := store.OpenOptions(t.TempDir(), nil, store.Options{DiskReserve: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	apps, err := mailbox.ParseApps("notes")
	if err != nil {
		t.Fatal(err)
	}
	st, err := mailboxlocal.New(mailboxlocal.Config{Log: store.NewEnvelopeLog(db)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := mailbox.New(mailbox.Config{Store: st, Apps: apps})
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path string) *fasthttp.Response {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.Set("Authorization", "Bearer refused-token-0123456789")
		h.ServeHTTP(&ctx)
		var resp fasthttp.Response
		ctx.Response.CopyTo(&resp)
		return &resp
	}
	resp := call("PUT", "/v1/notes/mailbox/refused-mailbox-0001")
	if resp.StatusCode() != 503 || string(resp.Body()) != `{"error":"storage_unavailable","status":503}` ||
		string(resp.Header.Peek("Retry-After")) != store.RetryAfter || string(resp.Header.Peek("Cache-Control")) != "no-store" {
		t.Fatalf("claim with the store refusing writes: %d %s, headers %s", resp.StatusCode(), resp.Body(), resp.Header.String())
	}
	// The refused claim stored nothing: the mailbox does not exist.
	if resp := call("HEAD", "/v1/notes/mailbox/refused-mailbox-0001/p2c"); resp.StatusCode() != 404 {
		t.Fatalf("HEAD after a refused claim: %d, want 404", resp.StatusCode())
	}
}
