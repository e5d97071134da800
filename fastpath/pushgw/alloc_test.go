package pushgw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/store"
)

// stubSender delivers instantly: it isolates the gateway's own work on a
// send from the provider client's.
type stubSender struct{}

func (stubSender) send(_ context.Context, msg *sendMessage, buf []byte) delivery {
	_ = appendAPNsPayload(buf[:0], msg, apnsCategory(msg))
	return delivery{outcome: delivered, status: 200}
}
func (stubSender) name() string { return "stub" }

func stubHandler(tb testing.TB, log *slog.Logger, metered bool) (*Handler, string) {
	tb.Helper()
	db, err := store.Open(tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	st, err := store.NewPushGateway(db, store.PushScopeShared)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := New(Config{Provider: ProviderAPNs, Store: st, RatePerMinute: 1 << 30, Metered: metered, DailyBudget: 1 << 30, Log: log})
	if err != nil {
		tb.Fatal(err)
	}
	h.sender = stubSender{}
	key := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if err := st.AddKey(store.PushKey{ID: "k", Hash: sha256.Sum256([]byte(key)), Label: "bench", Enabled: true, CreatedAt: time.Now()}); err != nil {
		tb.Fatal(err)
	}
	return h, key
}

const stubBody = `{"token":"a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90","title":"New message","body":"Alice: lunch at noon?","data":{"messageId":"msg-123","url":"/read"}}`

func stubCtx(key string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/send")
	ctx.Request.Header.Set("Authorization", "Bearer "+key)
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.SetBodyString(stubBody)
	return &ctx
}

// The gateway's own work on an accepted send (the token's claim already
// confirmed, no log output) stays within a small, fixed number of
// allocations; most are the store's read of the claim record.
func TestSendAllocations(t *testing.T) {
	h, key := stubHandler(t, nil, false)
	ctx := stubCtx(key)
	h.ServeHTTP(ctx)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	allocs := testing.AllocsPerRun(200, func() {
		ctx.Response.Reset()
		h.ServeHTTP(ctx)
	})
	t.Logf("%.0f allocations per accepted send (gateway only)", allocs)
	if allocs > 16 {
		t.Errorf("%.0f allocations per send, want at most 16", allocs)
	}
}

// BenchmarkSendGatewayOnly is the gateway's share of a send, provider
// excluded: routing, auth, parsing, the rate limit, the claim and its
// settle, the payload, the answer and (with log) the JSON log lines.
func BenchmarkSendGatewayOnly(b *testing.B) {
	for _, tc := range []struct {
		name    string
		log     *slog.Logger
		metered bool
	}{
		{"nolog", nil, false},
		{"jsonlog", slog.New(slog.NewJSONHandler(io.Discard, nil)), false},
		{"jsonlog-metered", slog.New(slog.NewJSONHandler(io.Discard, nil)), true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h, key := stubHandler(b, tc.log, tc.metered)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := stubCtx(key)
				for pb.Next() {
					ctx.Response.Reset()
					h.ServeHTTP(ctx)
					if ctx.Response.StatusCode() != 200 {
						b.Fatal("status " + strconv.Itoa(ctx.Response.StatusCode()))
					}
				}
			})
		})
	}
}

// panicSender fails the way a bug would.
type panicSender struct{}

func (panicSender) send(context.Context, *sendMessage, []byte) delivery { panic("provider bug") }
func (panicSender) name() string                                        { return "panic" }

// A panic during delivery still settles the claim (a fresh one is
// released, not leaked) and answers 500 with the gateway's error shape.
func TestPanicSettlesClaim(t *testing.T) {
	h, key := stubHandler(t, nil, false)
	h.sender = panicSender{}
	ctx := stubCtx(key)
	h.ServeHTTP(ctx)
	id := ctx.Response.Header.Peek("X-Request-Id")
	want := `{"error":"internal error","requestId":"` + string(id) + `"}`
	if ctx.Response.StatusCode() != 500 || string(ctx.Response.Body()) != want {
		t.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	tok := sha256.Sum256([]byte("a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"))
	if c, ok, err := h.store.ClaimOf(tok); ok || err != nil {
		t.Fatalf("claim leaked by a panic: %+v %v", c, err)
	}
}

// The header check the listener runs before every /send body allocates
// nothing: it decides from the key store's copy and a pooled URI.
func TestAnswersFromHeadersAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	h, key := stubHandler(t, nil, false)
	ctx := stubCtx(key)
	ctx.Request.Header.SetContentLength(len(stubBody))
	if h.AnswersFromHeaders(&ctx.Request.Header) {
		t.Fatal("a valid send is answered from its headers")
	}
	allocs := testing.AllocsPerRun(200, func() { _ = h.AnswersFromHeaders(&ctx.Request.Header) })
	if allocs != 0 {
		t.Errorf("%.0f allocations per header check, want 0", allocs)
	}
}

// A request whose body the listener withheld reaches the body read only
// when its key became usable between the headers and the handler; the
// headers' verdict (401) stands, and nothing is read or sent.
func TestWithheldBodyWithAKeyThatBecameValid(t *testing.T) {
	h, key := stubHandler(t, nil, false)
	ctx := stubCtx(key)
	ctx.Request.ResetBody()
	ctx.Request.Header.SetContentLength(0)
	ctx.Request.Header.Set("X-Edgerelay-Withheld-Length", "120") // as server.AnswerBeforeBody writes it
	h.ServeHTTP(ctx)
	if ctx.Response.StatusCode() != 401 || !bytes.Contains(ctx.Response.Body(), []byte(`"invalid api key"`)) {
		t.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	ctx.Response.Reset()
	ctx.Request.Header.Set("X-Edgerelay-Withheld-Length", "16385")
	h.ServeHTTP(ctx)
	if ctx.Response.StatusCode() != 413 {
		t.Fatalf("declared 16385: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}
