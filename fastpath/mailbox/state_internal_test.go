package mailbox

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	routes "edgerelay/route"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

const (
	stateToken = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
	stateOther = "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
)

// stateHandler is a Handler over a fresh store, called directly, with a
// clock the test moves.
type stateHandler struct {
	h   *Handler
	st  *mailboxlocal.Store
	now int64
}

// loaded is how many mailboxes the store holds in memory.
func (s *stateHandler) loaded() int { return s.st.MailboxStats().Loaded }

// evict drops every mailbox nothing holds from memory.
func (s *stateHandler) evict() { s.st.Evict(s.now + 1) }

func newStateHandler(t testing.TB, maxLoaded int) *stateHandler {
	t.Helper()
	return newStateHandlerWith(t, maxLoaded, nil)
}

// newStateHandlerWith is newStateHandler with the Config changed by
// change (when not nil) before New.
func newStateHandlerWith(t testing.TB, maxLoaded int, change func(*Config)) *stateHandler {
	t.Helper()
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	apps, err := ParseApps("chat:push=com.example.chat,signal,ice")
	if err != nil {
		t.Fatal(err)
	}
	s := &stateHandler{now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	st, err := mailboxlocal.New(mailboxlocal.Config{Log: store.NewEnvelopeLog(db), MaxLoaded: maxLoaded})
	if err != nil {
		t.Fatal(err)
	}
	s.st = st
	cfg := Config{Store: st, Apps: apps,
		ICE: ICEConfig{Secret: "s", URLs: []string{"turn:127.0.0.1:3478"}},
		Now: func() time.Time { return time.Unix(0, s.now) }}
	if change != nil {
		change(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.h = h
	return s
}

// do calls the handler once and returns the status.
func (s *stateHandler) do(method, path, tok string, body []byte, hdr ...string) int {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(path)
	if tok != "" {
		ctx.Request.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		ctx.Request.Header.Set(hdr[i], hdr[i+1])
	}
	ctx.Request.SetBody(body)
	s.h.ServeHTTP(&ctx)
	return ctx.Response.StatusCode()
}

// bucketsHeld is how many rate-limit buckets exist, over every family.
func (s *stateHandler) bucketsHeld() int {
	n := 0
	for _, set := range s.h.limits.all() {
		n += set.Len()
	}
	return n
}

func testEnvelope(seq uint64) []byte {
	e := make([]byte, 64)
	e[0] = 0x01
	for i := range 8 {
		e[1+i] = byte(seq >> (56 - 8*i))
	}
	return e
}

// refusedRequests is one of each request a client without the mailbox's
// token can make, on mailbox id, each with its refusal.
func refusedRequests(id, tok string) []struct {
	method, path string
	body         []byte
	hdr          []string
	status       int
} {
	base := "/v1/chat/mailbox/" + id
	ws := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	return []struct {
		method, path string
		body         []byte
		hdr          []string
		status       int
	}{
		{"HEAD", base + "/p2c", nil, nil, 0},
		{"GET", base + "/p2c", nil, nil, 0},
		{"GET", base + "/p2c/1", nil, nil, 0},
		{"HEAD", base + "/c2p/7", nil, nil, 0},
		{"PUT", base + "/p2c/1", testEnvelope(1), []string{"X-Relay-Notify", "alert"}, 0},
		{"DELETE", base + "/p2c?through=3", nil, nil, 0},
		{"DELETE", base, nil, nil, 0},
		{"GET", base + "/p2c/watch", nil, ws, 0},
		{"GET", base + "/signal/primary", nil, ws, 0},
		{"GET", base + "/ice", nil, nil, 0},
		{"PUT", base + "/p2c/push", []byte(`{"service":"x","tag":"t"}`), nil, 0},
	}
}

// TestRefusedRequestsKeepNothing: every request refused for its mailbox
// (404 when it does not exist, 403 with another bearer, 409 for a claim
// of a mailbox another token holds) leaves no mailbox in memory and no
// rate-limit bucket, on every path; an authorized one keeps its mailbox.
func TestRefusedRequestsKeepNothing(t *testing.T) {
	s := newStateHandler(t, 0)
	for i := range 200 {
		id := fmt.Sprintf("missing%016d", i)
		for _, r := range refusedRequests(id, stateToken) {
			if got := s.do(r.method, r.path, stateToken, r.body, r.hdr...); got != 404 {
				t.Fatalf("%s %s of a missing mailbox: %d, want 404", r.method, r.path, got)
			}
		}
	}
	if n, b := s.loaded(), s.bucketsHeld(); n != 0 || b != 0 {
		t.Fatalf("requests of missing mailboxes left %d mailboxes and %d buckets in memory, want 0", n, b)
	}
	// A mailbox another token holds: 403 for each path, 409 for a claim.
	if got := s.do("PUT", "/v1/chat/mailbox/held000000000001", stateToken, nil); got != 201 {
		t.Fatalf("claim: %d", got)
	}
	s.evict() // out of memory: the refusals below must read the store
	s.h.limits.sweep(s.now + int64(time.Hour))
	if n, b := s.loaded(), s.bucketsHeld(); n != 0 || b != 0 {
		t.Fatalf("after eviction %d mailboxes, %d buckets; want 0", n, b)
	}
	for range 3 {
		for _, r := range refusedRequests("held000000000001", stateOther) {
			if got := s.do(r.method, r.path, stateOther, r.body, r.hdr...); got != 403 {
				t.Fatalf("%s %s with another bearer: %d, want 403", r.method, r.path, got)
			}
		}
		if got := s.do("PUT", "/v1/chat/mailbox/held000000000001", stateOther, nil); got != 409 {
			t.Fatalf("claim of a held mailbox: %d, want 409", got)
		}
	}
	if n, b := s.loaded(), s.bucketsHeld(); n != 0 || b != 0 {
		t.Fatalf("refused requests left %d mailboxes and %d buckets in memory, want 0", n, b)
	}
	// The same requests refused while the mailbox is in memory add no
	// bucket either.
	if got := s.do("HEAD", "/v1/chat/mailbox/held000000000001/p2c", stateToken, nil); got != 200 {
		t.Fatalf("HEAD by the holder: %d", got)
	}
	held := s.bucketsHeld()
	if n := s.loaded(); n != 1 || held != 1 {
		t.Fatalf("the holder's HEAD: %d mailboxes, %d buckets; want 1 and 1", n, held)
	}
	if got := s.do("PUT", "/v1/chat/mailbox/held000000000001", stateOther, nil); got != 409 {
		t.Fatalf("claim of a held mailbox in memory: %d, want 409", got)
	}
	if got := s.do("GET", "/v1/chat/mailbox/held000000000001/ice", stateOther, nil); got != 403 {
		t.Fatalf("ice with another bearer: %d, want 403", got)
	}
	if b := s.bucketsHeld(); b != held {
		t.Fatalf("refusals of a mailbox in memory made buckets: %d, want %d", b, held)
	}
}

// TestExpiredMailboxNotInMemoryIs404: the peek of a mailbox not in memory
// applies RELAY_IDLE like authorize does, and a claim then makes it anew.
func TestExpiredMailboxNotInMemoryIs404(t *testing.T) {
	s := newStateHandler(t, 0)
	path := "/v1/chat/mailbox/expiring00000001"
	if got := s.do("PUT", path, stateToken, nil); got != 201 {
		t.Fatalf("claim: %d", got)
	}
	s.evict()
	s.now += int64(store.DefaultMailboxLimits().Idle) // at the limit: still there
	if got := s.do("HEAD", path+"/p2c", stateToken, nil); got != 200 {
		t.Fatalf("HEAD at the idle limit: %d, want 200", got)
	}
	s.evict()
	s.now++ // one past it
	if got := s.do("HEAD", path+"/p2c", stateToken, nil); got != 404 {
		t.Fatalf("HEAD one past the idle limit: %d, want 404", got)
	}
	if n := s.loaded(); n != 0 {
		t.Fatalf("the 404 kept %d mailboxes in memory", n)
	}
	if got := s.do("PUT", path, stateOther, nil); got != 201 {
		t.Fatalf("claim of the expired mailbox by another token: %d, want 201", got)
	}
}

// TestCacheBoundEvictsQuietEntries: past MaxLoaded the store evicts
// entries nothing holds (store/mailboxlocal tests which ones), and an
// evicted mailbox is read from the store again.
func TestCacheBoundEvictsQuietEntries(t *testing.T) {
	const maxLoaded = 64 * 2 // two entries in each of the store cache's shards
	s := newStateHandler(t, maxLoaded)
	for i := range 3 * maxLoaded {
		path := fmt.Sprintf("/v1/chat/mailbox/bound%016d", i)
		if got := s.do("PUT", path, stateToken, nil); got != 201 {
			t.Fatalf("claim %d: %d", i, got)
		}
		if got := s.do("PUT", path+"/p2c/1", stateToken, testEnvelope(1)); got != 201 {
			t.Fatalf("put %d: %d", i, got)
		}
		s.now += int64(time.Millisecond)
	}
	if n := s.loaded(); n > maxLoaded {
		t.Fatalf("%d mailboxes in memory, bound %d", n, maxLoaded)
	}
	// Every mailbox still answers from the store after its eviction.
	for i := range 3 * maxLoaded {
		path := fmt.Sprintf("/v1/chat/mailbox/bound%016d", i)
		if got := s.do("GET", path+"/p2c/1", stateToken, nil); got != 200 {
			t.Fatalf("GET %d after eviction: %d", i, got)
		}
	}

}

// TestAuthorizedReadsAllocNothing: the hold on a cached mailbox (lookup
// and release) keeps the authorized reads allocation-free.
func TestAuthorizedReadsAllocNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	s := newStateHandler(t, 0)
	base := "/v1/chat/mailbox/alloc00000000001"
	if got := s.do("PUT", base, stateToken, nil); got != 201 {
		t.Fatalf("claim: %d", got)
	}
	if got := s.do("PUT", base+"/p2c/1", stateToken, testEnvelope(1)); got != 201 {
		t.Fatalf("put: %d", got)
	}
	for _, r := range []struct{ method, path string }{
		{"HEAD", base + "/p2c"}, {"HEAD", base + "/p2c/1"}, {"GET", base + "/p2c/1"},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(r.method)
		ctx.Request.SetRequestURI(r.path)
		ctx.Request.Header.Set("Authorization", "Bearer "+stateToken)
		if allocs, status := s.allocsPerServe(&ctx); allocs != 0 || status != 200 {
			t.Errorf("%s %s: %v allocations, status %d; want 0 and 200", r.method, r.path, allocs, status)
		}
	}
}

// allocsPerServe serves ctx's request again and again, a fetch token's
// refill apart, and returns the allocations per request after a warm-up
// and the last answer's status.
func (s *stateHandler) allocsPerServe(ctx *fasthttp.RequestCtx) (allocs float64, status int) {
	call := func() {
		s.now += int64(time.Second / 4) // a fetch token a call
		ctx.Response.Reset()
		s.h.ServeHTTP(ctx)
		status = ctx.Response.StatusCode()
	}
	for range 100 {
		call()
	}
	return testing.AllocsPerRun(1000, call), status
}

// TestSignalSocketKeepsARoom: a signal socket has its mailbox's room from
// its upgrade until it ends, and the room goes with the last socket, so
// rooms follow the open sockets.
func TestSignalSocketKeepsARoom(t *testing.T) {
	s := newStateHandlerWith(t, 0, func(c *Config) { c.DetachSockets = true })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: s.h.ServeHTTP, KeepHijackedConns: true}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	const name = "chat/signal0000000001"
	path := "/v1/" + name[:4] + "/mailbox/" + name[5:]
	if got := s.do("PUT", path, stateToken, nil); got != 201 {
		t.Fatalf("claim: %d", got)
	}
	c, _, err := websocket.DefaultDialer.Dial("ws://"+ln.Addr().String()+path+"/signal/primary",
		http.Header{"Authorization": {"Bearer " + stateToken}})
	if err != nil {
		t.Fatal(err)
	}
	waitRooms := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		rooms := s.h.cfg.Signals.(*routes.LocalSignals)
		for rooms.Rooms() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d signal rooms, want %d", rooms.Rooms(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitRooms(1)
	c.Close()
	waitRooms(0)
}
