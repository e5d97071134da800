package mailbox_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
)

func TestParseApps(t *testing.T) {
	apps, err := mailbox.ParseApps("notes; chat:push=com.example.chat,signal,ice ;x-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(apps) != 3 || apps["chat"].PushTopic != "com.example.chat" || !apps["chat"].Signal || !apps["chat"].ICE || apps["notes"].Signal {
		t.Fatalf("%+v", apps)
	}
	for _, bad := range []string{"Notes", "a b", strings.Repeat("a", 33), "chat:bogus", "chat:signal,signal", "chat;chat", "chat:push=", "chat:push=a b"} {
		if _, err := mailbox.ParseApps(bad); err == nil || !strings.Contains(err.Error(), "RELAY_APPS entry") {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if apps, err := mailbox.ParseApps(""); err != nil || len(apps) != 0 {
		t.Fatalf("empty: %v %v", apps, err)
	}
}

func TestClaimAnswers(t *testing.T) {
	r := start(t, opts{})
	expect(t, r.do("PUT", mb("notes"), "", nil), 401, "unauthorized")
	expect(t, r.do("PUT", mb("notes"), "short", nil), 401, "unauthorized")
	expect(t, r.do("PUT", mb("notes"), strings.Repeat("a", 257), nil), 401, "unauthorized")
	expect(t, r.do("PUT", mb("notes"), "has space in it ok?", nil), 401, "unauthorized")
	expect(t, r.do("PUT", mb("notes"), strings.Repeat("a", 256), nil), 201, "")
	expect(t, r.do("PUT", mb("chat"), token, nil), 201, "")
	expect(t, r.do("PUT", mb("chat"), token, nil), 204, "")
	expect(t, r.do("PUT", mb("chat"), other, nil), 409, "taken")
	// The same id in another app is another mailbox.
	expect(t, r.do("HEAD", mb("notes")+"/p2c", token, nil), 403, "")
	expect(t, r.do("GET", mb("chat")+"/p2c", other, nil), 403, "forbidden")
	expect(t, r.do("GET", "/v1/chat/mailbox/BBECAwQFBgcICQoLDA0ODw/p2c", token, nil), 404, "not_found")
	expect(t, r.do("PUT", mb("chat"), token, []byte("x")), 400, "bad_request")
}

func TestPathAnswers(t *testing.T) {
	r := start(t, opts{apps: "notes"})
	r.claim("notes")
	for path, want := range map[string]int{
		"/v1/other/mailbox/" + id:                               404,
		"/v2/notes/mailbox/" + id:                               404,
		"/v1/notes/box/" + id:                                   404,
		"/v1/notes/mailbox/" + id + "/":                         404,
		"/v1/notes/mailbox/" + id + "/x2y":                      404,
		"/v1/notes/mailbox/" + id + "/p2c/1/more":               404,
		"/v1/notes/mailbox/" + id + "/signal/primary":           404, // not enabled
		"/v1/notes/mailbox/" + id + "/ice":                      404, // not enabled
		"/v1/notes/mailbox/" + id + "/p2c/push":                 404, // not enabled
		"/v1/notes/mailbox/" + strings.Repeat("a", 15):          400,
		"/v1/notes/mailbox/" + strings.Repeat("a", 65):          400,
		"/v1/notes/mailbox/" + strings.Repeat("a", 64):          404, // valid, absent
		"/v1/notes/mailbox/" + id[:20] + "+/":                   404,
		"/v1/notes/mailbox/" + id[:20] + "+=":                   400,
		"/v1/notes/mailbox/" + id + "/p2c/0":                    400,
		"/v1/notes/mailbox/" + id + "/p2c/-1":                   400,
		"/v1/notes/mailbox/" + id + "/p2c/01":                   400,
		"/v1/notes/mailbox/" + id + "/p2c/18446744073709551616": 400,
		"/v1/notes/mailbox/" + id + "/p2c/18446744073709551615": 404, // valid, not stored
	} {
		a := r.do("GET", path, token, nil)
		if a.status != want {
			t.Errorf("%s: %d, want %d", path, a.status, want)
		}
	}
}

func TestPutAnswers(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	e1 := envelope(1, 100, 'a')
	expect(t, r.put("notes", "p2c", 1, e1), 201, "")
	expect(t, r.put("notes", "p2c", 1, e1), 200, "")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 100, 'b')), 409, "conflict")
	// The other direction is separate.
	expect(t, r.put("notes", "c2p", 1, envelope(1, 100, 'b')), 201, "")

	// Outside checks: 400 or 413 and nothing stored.
	bad := map[string][]byte{
		"24 bytes":         envelope(2, 0, 0)[:24],
		"empty":            {},
		"version 2":        append([]byte{0x02}, envelope(2, 10, 'x')[1:]...),
		"seq mismatch":     envelope(3, 10, 'x'),
		"seq zero in body": envelope(0, 10, 'x'),
	}
	for name, env := range bad {
		t.Run(name, func(t *testing.T) { expect(t, r.put("notes", "p2c", 2, env), 400, "bad_request") })
	}
	expect(t, r.put("notes", "p2c", 2, envelope(2, 10, 'x'), "X-Relay-Notify", "loud"), 400, "bad_request")
	a := r.do("HEAD", mb("notes")+"/p2c", token, nil)
	if a.header.Get("X-Relay-Count") != "1" || a.header.Get("X-Relay-Last") != "1" {
		t.Fatalf("something was stored: %v", a.header)
	}
	// Exactly 25 bytes (an empty message) is fine; notify values are accepted.
	expect(t, r.put("notes", "p2c", 2, envelope(2, 0, 0), "X-Relay-Notify", "alert"), 201, "")
	expect(t, r.put("notes", "p2c", 3, envelope(3, 0, 0), "X-Relay-Notify", "silent"), 201, "")

	// 65,536 bytes pass, 65,537 are too large.
	expect(t, r.put("notes", "p2c", 4, envelope(4, 65536-25, 'm')), 201, "")
	expect(t, r.put("notes", "p2c", 5, envelope(5, 65537-25, 'm')), 413, "too_large")
	expect(t, r.do("HEAD", mb("notes")+"/p2c/5", token, nil), 404, "")

	// A pruned sequence is a conflict, also with the same bytes.
	expect(t, r.do("DELETE", mb("notes")+"/p2c?through=2", token, nil), 204, "")
	expect(t, r.put("notes", "p2c", 1, e1), 409, "conflict")
	expect(t, r.put("notes", "p2c", 2, envelope(2, 0, 0)), 409, "conflict")
	// The mailbox must exist; the token must match.
	expect(t, r.do("PUT", "/v1/chat/mailbox/"+id+"/p2c/1", token, e1), 404, "not_found")
	expect(t, r.do("PUT", mb("notes")+"/p2c/9", other, envelope(9, 1, 1)), 403, "forbidden")
}

func TestGetHeadBatchPrune(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	a := r.do("HEAD", mb("notes")+"/p2c", token, nil)
	if a.status != 200 || a.header.Get("X-Relay-First") != "0" || a.header.Get("X-Relay-Last") != "0" || a.header.Get("X-Relay-Count") != "0" {
		t.Fatalf("empty head %d %v", a.status, a.header)
	}
	var envs [][]byte
	for seq := uint64(1); seq <= 5; seq++ {
		e := envelope(seq, int(seq)*7, byte('a'+seq))
		envs = append(envs, e)
		expect(t, r.put("notes", "p2c", seq, e), 201, "")
	}
	a = r.do("GET", mb("notes")+"/p2c/3", token, nil)
	if a.status != 200 || !bytes.Equal(a.body, envs[2]) || a.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("get one: %d %v", a.status, a.header)
	}
	expect(t, r.do("GET", mb("notes")+"/p2c/6", token, nil), 404, "not_found")
	expect(t, r.do("HEAD", mb("notes")+"/p2c/3", token, nil), 200, "")
	if a := r.do("HEAD", mb("notes")+"/p2c/6", token, nil); a.status != 404 || len(a.body) != 0 {
		t.Fatalf("head missing: %d %q", a.status, a.body)
	}
	a = r.do("HEAD", mb("notes")+"/p2c", token, nil)
	if a.header.Get("X-Relay-First") != "1" || a.header.Get("X-Relay-Last") != "5" || a.header.Get("X-Relay-Count") != "5" {
		t.Fatalf("head %v", a.header)
	}

	batch := func(query string) ([][]byte, string) {
		t.Helper()
		a := r.do("GET", mb("notes")+"/p2c"+query, token, nil)
		if a.status != 200 || a.header.Get("Content-Type") != "application/vnd.zerobyte.batch" {
			t.Fatalf("batch %s: %d %v %s", query, a.status, a.header, a.body)
		}
		return decodeBatch(t, a.body), a.header.Get("X-Relay-More")
	}
	got, more := batch("")
	if len(got) != 5 || more != "0" || !bytes.Equal(got[4], envs[4]) {
		t.Fatalf("batch all: %d %s", len(got), more)
	}
	got, more = batch("?after=1&limit=2")
	if len(got) != 2 || seqOf(got[0]) != 2 || seqOf(got[1]) != 3 || more != "1" {
		t.Fatalf("after=1 limit=2: %d %s", len(got), more)
	}
	got, more = batch("?after=5")
	if len(got) != 0 || more != "0" {
		t.Fatalf("after=5: %d %s", len(got), more)
	}
	batch("?limit=1000")
	for _, q := range []string{"?limit=1001", "?limit=0", "?after=-1", "?after=x", "?limit=", "?after=01"} {
		expect(t, r.do("GET", mb("notes")+"/p2c"+q, token, nil), 400, "bad_request")
	}

	for _, q := range []string{"", "?through=", "?through=a"} {
		expect(t, r.do("DELETE", mb("notes")+"/p2c"+q, token, nil), 400, "bad_request")
	}
	expect(t, r.do("DELETE", mb("notes")+"/p2c?through=0", token, nil), 204, "")
	expect(t, r.do("DELETE", mb("notes")+"/p2c?through=3", token, nil), 204, "")
	a = r.do("HEAD", mb("notes")+"/p2c", token, nil)
	if a.header.Get("X-Relay-First") != "4" || a.header.Get("X-Relay-Count") != "2" {
		t.Fatalf("head after prune %v", a.header)
	}
	// A lower prune keeps the higher mark.
	expect(t, r.do("DELETE", mb("notes")+"/p2c?through=1", token, nil), 204, "")
	expect(t, r.put("notes", "p2c", 3, envs[2]), 409, "conflict")
	got, _ = batch("")
	if len(got) != 2 || seqOf(got[0]) != 4 {
		t.Fatalf("batch after prune: %d", len(got))
	}
}

func decodeBatch(t *testing.T, b []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			t.Fatalf("truncated batch prefix")
		}
		n := binary.BigEndian.Uint32(b)
		if int(n) > len(b)-4 {
			t.Fatalf("truncated batch body")
		}
		out = append(out, b[4:4+n])
		b = b[4+n:]
	}
	return out
}

func TestBatchByteCap(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	// 70 envelopes of 65,536 bytes: 4 MiB holds 63 of them with prefixes.
	const size = 65536
	for seq := uint64(1); seq <= 70; seq++ {
		r.clock.advance(time.Second) // keep the write bucket full
		expect(t, r.put("notes", "p2c", seq, envelope(seq, size-25, byte(seq))), 201, "")
	}
	a := r.do("GET", mb("notes")+"/p2c?limit=1000", token, nil)
	got := decodeBatch(t, a.body)
	if len(a.body) > 4<<20 || len(got) != (4<<20)/(size+4) || a.header.Get("X-Relay-More") != "1" {
		t.Fatalf("batch of %d bytes, %d envelopes, more %q", len(a.body), len(got), a.header.Get("X-Relay-More"))
	}
	last := seqOf(got[len(got)-1])
	a = r.do("GET", mb("notes")+fmt.Sprintf("/p2c?after=%d&limit=1000", last), token, nil)
	if rest := decodeBatch(t, a.body); len(rest) != 70-len(got) || a.header.Get("X-Relay-More") != "0" {
		t.Fatalf("rest %d more %q", len(rest), a.header.Get("X-Relay-More"))
	}
}

func TestStoredLimits(t *testing.T) {
	r := start(t, opts{maxStored: 4096})
	r.claim("notes")
	// 4,096 envelopes fill a direction; the 4,097th is 507.
	var wg sync.WaitGroup
	errs := make(chan string, 4096)
	seqs := make(chan uint64, 4096)
	for s := uint64(1); s <= 4096; s++ {
		seqs <- s
	}
	close(seqs)
	r.clock.advance(time.Hour) // the clock is still; refill before each burst
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range seqs {
				r.clock.advance(time.Second)
				if a := r.put("notes", "p2c", s, envelope(s, 0, 0)); a.status != 201 {
					errs <- fmt.Sprintf("seq %d: %d %s", s, a.status, a.body)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	r.clock.advance(time.Minute)
	expect(t, r.put("notes", "p2c", 4097, envelope(4097, 0, 0)), 507, "mailbox_full")
	// The other direction is not full; pruning makes room.
	expect(t, r.put("notes", "c2p", 1, envelope(1, 0, 0)), 201, "")
	expect(t, r.do("DELETE", mb("notes")+"/p2c?through=1", token, nil), 204, "")
	expect(t, r.put("notes", "p2c", 4097, envelope(4097, 0, 0)), 201, "")
}

func TestStoredBytesLimit(t *testing.T) {
	r := start(t, opts{maxBytes: 1000})
	r.claim("notes")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 500-25, 1)), 201, "")
	expect(t, r.put("notes", "p2c", 2, envelope(2, 500-25, 2)), 201, "") // exactly 1000
	expect(t, r.put("notes", "p2c", 3, envelope(3, 0, 3)), 507, "mailbox_full")
}

func TestWriteRateLimit(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	for seq := uint64(1); seq <= 120; seq++ {
		expect(t, r.put("notes", "p2c", seq, envelope(seq, 0, 0)), 201, "")
	}
	a := r.put("notes", "p2c", 121, envelope(121, 0, 0))
	expect(t, a, 429, "rate_limited")
	if a.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
	}
	expect(t, r.do("HEAD", mb("notes")+"/p2c/121", token, nil), 404, "")
	// Half a second later one token is back.
	r.clock.advance(500 * time.Millisecond)
	expect(t, r.put("notes", "p2c", 121, envelope(121, 0, 0)), 201, "")
	expect(t, r.put("notes", "p2c", 122, envelope(122, 0, 0)), 429, "rate_limited")
}

func TestFetchRateLimit(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes") // a claim counts as a fetch
	for i := 1; i < 240; i++ {
		expect(t, r.do("HEAD", mb("notes")+"/p2c", token, nil), 200, "")
	}
	a := r.do("GET", mb("notes")+"/p2c", token, nil)
	expect(t, a, 429, "rate_limited")
	if a.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
	}
	r.clock.advance(250 * time.Millisecond)
	expect(t, r.do("HEAD", mb("notes")+"/p2c", token, nil), 200, "")
}

func TestIdleExpiry(t *testing.T) {
	r := start(t, opts{idle: time.Hour})
	r.claim("notes")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 3, 1)), 201, "")
	w := r.watch("notes", "p2c", "")
	nextEnvelope(t, w)
	r.clock.advance(59 * time.Minute)
	expect(t, r.do("PUT", mb("notes"), token, nil), 204, "") // heartbeat restarts the timer
	r.clock.advance(59 * time.Minute)
	expect(t, r.do("HEAD", mb("notes")+"/p2c", token, nil), 200, "")
	r.clock.advance(2 * time.Minute)
	// Absent at once, before any sweep.
	expect(t, r.do("HEAD", mb("notes")+"/p2c", token, nil), 404, "")
	expect(t, r.do("GET", mb("notes")+"/p2c/1", token, nil), 404, "not_found")
	// The sweep erases it and closes its watchers with 1000.
	if n := r.h.ExpireIdle(r.clock.now().UnixNano()); n != 1 {
		t.Fatalf("expired %d", n)
	}
	_ = w.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := w.ReadMessage(); !websocket.IsCloseError(err, 1000) {
		t.Fatalf("watcher after expiry: %v", err)
	}
	// Anyone may claim it now, and it is empty.
	expect(t, r.do("PUT", mb("notes"), other, nil), 201, "")
	a := r.do("HEAD", mb("notes")+"/p2c", other, nil)
	if a.header.Get("X-Relay-Count") != "0" {
		t.Fatalf("expired mailbox kept envelopes: %v", a.header)
	}
}

func TestExpiredMailboxClaimedBeforeSweep(t *testing.T) {
	r := start(t, opts{idle: time.Hour})
	r.claim("notes")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 3, 1)), 201, "")
	r.clock.advance(2 * time.Hour)
	expect(t, r.do("PUT", mb("notes"), other, nil), 201, "")
	expect(t, r.do("GET", mb("notes")+"/p2c/1", other, nil), 404, "not_found")
	// The sweep finds nothing left to erase (only a stale index entry).
	if n := r.h.ExpireIdle(r.clock.now().UnixNano()); n != 0 {
		t.Fatalf("expired %d", n)
	}
	expect(t, r.do("HEAD", mb("notes")+"/p2c", other, nil), 200, "")
}

func TestErase(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 3, 1)), 201, "")
	expect(t, r.put("notes", "c2p", 1, envelope(1, 3, 1)), 201, "")
	w := r.watch("notes", "c2p", "?after=1")
	expect(t, r.do("DELETE", mb("notes"), other, nil), 403, "forbidden")
	expect(t, r.do("DELETE", mb("notes"), token, nil), 204, "")
	_ = w.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := w.ReadMessage(); !websocket.IsCloseError(err, 1000) {
		t.Fatalf("watcher after erase: %v", err)
	}
	expect(t, r.do("HEAD", mb("notes")+"/p2c", token, nil), 404, "")
	expect(t, r.do("DELETE", mb("notes"), token, nil), 404, "not_found")
	r.claim("notes")
	a := r.do("GET", mb("notes")+"/c2p", token, nil)
	if len(decodeBatch(t, a.body)) != 0 {
		t.Fatal("erase left envelopes")
	}
	expect(t, r.put("notes", "p2c", 1, envelope(1, 3, 9)), 201, "") // no pruned mark survives
}

func TestWatchReplayThenLive(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	for seq := uint64(1); seq <= 3; seq++ {
		expect(t, r.put("notes", "p2c", seq, envelope(seq, 10, byte(seq))), 201, "")
	}
	w := r.watch("notes", "p2c", "?after=1")
	for want := uint64(2); want <= 3; want++ {
		if got := seqOf(nextEnvelope(t, w)); got != want {
			t.Fatalf("replay got %d want %d", got, want)
		}
	}
	e4 := envelope(4, 10, 4)
	expect(t, r.put("notes", "p2c", 4, e4), 201, "")
	if got := nextEnvelope(t, w); !bytes.Equal(got, e4) {
		t.Fatal("live envelope differs")
	}
	// An identical retry is not delivered again: the next frame is 5.
	expect(t, r.put("notes", "p2c", 4, e4), 200, "")
	expect(t, r.put("notes", "p2c", 5, envelope(5, 1, 5)), 201, "")
	if got := seqOf(nextEnvelope(t, w)); got != 5 {
		t.Fatalf("after retry got %d", got)
	}
	// The other direction is not delivered here.
	expect(t, r.put("notes", "c2p", 1, envelope(1, 1, 1)), 201, "")
	expect(t, r.put("notes", "p2c", 6, envelope(6, 1, 6)), 201, "")
	if got := seqOf(nextEnvelope(t, w)); got != 6 {
		t.Fatalf("got %d", got)
	}
	// ping → pong.
	if err := w.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = w.SetReadDeadline(time.Now().Add(5 * time.Second))
	if op, b, err := w.ReadMessage(); err != nil || op != websocket.TextMessage || string(b) != "pong" {
		t.Fatalf("pong: %d %q %v", op, b, err)
	}
	// Anything else: 1003.
	if err := w.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.ReadMessage(); !websocket.IsCloseError(err, 1003) {
		t.Fatalf("other text: %v", err)
	}
	w2 := r.watch("notes", "p2c", "?after=6")
	if err := w2.WriteMessage(websocket.BinaryMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = w2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := w2.ReadMessage(); !websocket.IsCloseError(err, 1003) {
		t.Fatalf("binary: %v", err)
	}
}

func TestWatchReplayRacesWrites(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	const total = 300
	r.clock.advance(time.Hour)
	for seq := uint64(1); seq <= 100; seq++ {
		expect(t, r.put("notes", "p2c", seq, envelope(seq, 100, byte(seq))), 201, "")
	}
	done := make(chan struct{})
	go func() { // writes keep landing while the watcher replays
		defer close(done)
		for seq := uint64(101); seq <= total; seq++ {
			r.clock.advance(time.Second)
			if a := r.put("notes", "p2c", seq, envelope(seq, 100, byte(seq))); a.status != 201 {
				t.Errorf("put %d: %d", seq, a.status)
				return
			}
		}
	}()
	w := r.watch("notes", "p2c", "")
	seen := map[uint64]bool{}
	for len(seen) < total {
		s := seqOf(nextEnvelope(t, w))
		if seen[s] {
			t.Fatalf("seq %d delivered twice after %d frames", s, len(seen))
		}
		seen[s] = true
	}
	<-done
}

func TestWatchSubprotocolBearer(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 1, 1)), 201, "")
	c, resp, err := r.dialWatch("notes", "p2c", "", nil, "zerobyte.v1", "zerobyte.bearer."+token)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	if got := resp.Header.Values("Sec-Websocket-Protocol"); len(got) != 1 || got[0] != "zerobyte.v1" {
		t.Fatalf("subprotocol answer %q", got)
	}
	if c.Subprotocol() != "zerobyte.v1" {
		t.Fatalf("negotiated %q", c.Subprotocol())
	}
	nextEnvelope(t, c)
	// Refusals come before the upgrade, as JSON.
	for _, tc := range []struct {
		protos []string
		status int
	}{
		{[]string{"zerobyte.v1"}, 401},
		{[]string{"zerobyte.v1", "zerobyte.bearer." + other}, 403},
		{[]string{"zerobyte.v1", "zerobyte.bearer.x"}, 401},
	} {
		_, resp, err := r.dialWatch("notes", "p2c", "", nil, tc.protos...)
		if err == nil || resp == nil || resp.StatusCode != tc.status {
			t.Fatalf("%v: %v %v", tc.protos, err, resp)
		}
	}
	if _, resp, _ := r.dialWatch("notes", "p2c", "?after=x", http.Header{"Authorization": {"Bearer " + token}}); resp == nil || resp.StatusCode != 400 {
		t.Fatalf("bad after: %v", resp)
	}
}

func TestWatcherLimit(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	for range 8 {
		r.watch("notes", "p2c", "")
	}
	_, resp, err := r.dialWatch("notes", "p2c", "", http.Header{"Authorization": {"Bearer " + token}})
	if err == nil || resp.StatusCode != 429 {
		t.Fatalf("9th watcher: %v %v", err, resp)
	}
	buf := new(bytes.Buffer)
	_, _ = buf.ReadFrom(resp.Body)
	if buf.String() != `{"error":"too_many_watchers","status":429}` {
		t.Fatalf("body %s", buf)
	}
	// The other direction has its own eight.
	r.watch("notes", "c2p", "")
}

func TestConnectionRateLimit(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	for i := range 20 {
		c := r.watch("notes", []string{"p2c", "c2p"}[i%2], "")
		c.Close()
		// Wait until the relay has let go of it, so the watcher cap is not what refuses.
		waitWatchers(t, r, 0)
	}
	_, resp, err := r.dialWatch("notes", "p2c", "", http.Header{"Authorization": {"Bearer " + token}})
	if err == nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "5" {
		t.Fatalf("21st socket: %v %v", err, resp)
	}
	r.clock.advance(5 * time.Second)
	r.watch("notes", "p2c", "")
}

func waitWatchers(t *testing.T, r *relay, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.h.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("open sockets %d, want %d", r.h.Open(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestSlowWatcherClosedWith1013(t *testing.T) {
	r := start(t, opts{maxBehind: 64 << 10, maxBytes: 1 << 30})
	r.claim("notes")
	w := r.watch("notes", "p2c", "")
	// The watcher reads nothing while 24 MB are written: more than the
	// kernel's loopback buffers hold, so its queue passes 64 KiB.
	for seq := uint64(1); seq <= 400; seq++ {
		r.clock.advance(time.Second)
		expect(t, r.put("notes", "p2c", seq, envelope(seq, 60000, 1)), 201, "")
	}
	// Reading now: what the kernel held, then 1013.
	_ = w.SetReadDeadline(time.Now().Add(10 * time.Second))
	n := 0
	for {
		_, _, err := w.ReadMessage()
		if err == nil {
			n++
			continue
		}
		if !websocket.IsCloseError(err, 1013) {
			t.Fatalf("want 1013 after %d envelopes, got %v", n, err)
		}
		break
	}
	if n >= 400 {
		t.Fatal("every envelope arrived: the watcher was never behind")
	}
	// Nothing is lost: it resumes with after = the last it holds.
	w2 := r.watch("notes", "p2c", fmt.Sprintf("?after=%d", n))
	if got := seqOf(nextEnvelope(t, w2)); got != uint64(n+1) {
		t.Fatalf("resumed at %d, want %d", got, n+1)
	}
}

func TestSilentWatcherClosed(t *testing.T) {
	r := start(t, opts{ping: time.Hour, silence: 200 * time.Millisecond})
	r.claim("notes")
	w := r.watch("notes", "p2c", "")
	_ = w.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _, err := w.ReadMessage()
	if !websocket.IsCloseError(err, 1001) {
		t.Fatalf("silent watcher: %v", err)
	}
}

// TestWriteKeepsMailboxBetweenPersistedTouches: a write moves the idle
// timer at once even when it is not yet persisted (most writes store one
// key); the sweep persists it instead of erasing the mailbox.
func TestWriteKeepsMailboxBetweenPersistedTouches(t *testing.T) {
	r := start(t, opts{idle: time.Hour})
	r.claim("notes")
	r.clock.advance(10 * time.Second) // under a hundredth of the idle time
	expect(t, r.put("notes", "p2c", 1, envelope(1, 3, 1)), 201, "")
	r.clock.advance(time.Hour - 5*time.Second) // 1h+5s after the claim, 1h-5s after the write
	if n := r.h.ExpireIdle(r.clock.now().UnixNano()); n != 0 {
		t.Fatalf("erased %d mailboxes written within the idle time", n)
	}
	expect(t, r.do("HEAD", mb("notes")+"/p2c/1", token, nil), 200, "")
	r.clock.advance(10 * time.Second)
	expect(t, r.do("HEAD", mb("notes")+"/p2c/1", token, nil), 404, "")
	if n := r.h.ExpireIdle(r.clock.now().UnixNano()); n != 1 {
		t.Fatalf("erased %d, want 1", n)
	}
}

// TestWritesStoreTheRecordEveryTouchInterval: a write stores the
// mailbox's last-active time beside the envelope only once it has moved
// by the touch interval since the stored one: a hundredth of RELAY_IDLE
// (at most a minute) by default, Config.TouchEvery when set.
func TestWritesStoreTheRecordEveryTouchInterval(t *testing.T) {
	for _, tc := range []struct {
		name  string
		touch time.Duration // Config.TouchEvery
		every time.Duration // the interval in force
	}{
		{name: "default", every: time.Minute},
		{name: "TouchEvery", touch: 10 * time.Minute, every: 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := start(t, opts{idle: 720 * time.Hour, touchEvery: tc.touch})
			r.claim("notes")
			claimed := r.clock.now().UnixNano()
			stored := func() int64 {
				t.Helper()
				rec, err := store.NewEnvelopeLog(r.db).Mailbox("notes/" + id)
				if err != nil {
					t.Fatal(err)
				}
				return rec.LastActive
			}
			r.clock.advance(tc.every - time.Second)
			expect(t, r.put("notes", "p2c", 1, envelope(1, 3, 1)), 201, "")
			if got := stored(); got > claimed+int64(time.Second) {
				t.Errorf("a write %v after the claim stored the record (last active %v after the claim); want it left for later",
					tc.every-time.Second, time.Duration(got-claimed))
			}
			r.clock.advance(2 * time.Second)
			expect(t, r.put("notes", "p2c", 2, envelope(2, 3, 1)), 201, "")
			if got := stored(); got < claimed+int64(tc.every) {
				t.Errorf("a write %v after the claim did not store the record (last active %v after the claim)",
					tc.every+time.Second, time.Duration(got-claimed))
			}
		})
	}
}
