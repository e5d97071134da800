package mailbox_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/mailbox"
)

func (r *relay) dialSignal(app, side string) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, Subprotocols: []string{"zerobyte.v1", "zerobyte.bearer." + token}}
	return d.Dial(r.ws+mb(app)+"/signal/"+side, nil)
}

func (r *relay) signal(app, side string) *websocket.Conn {
	r.t.Helper()
	c, resp, err := r.dialSignal(app, side)
	if err != nil {
		r.t.Fatalf("signal %s: %v %v", side, err, resp)
	}
	if c.Subprotocol() != "zerobyte.v1" {
		r.t.Fatalf("subprotocol %q", c.Subprotocol())
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

func readFrame(t *testing.T, c *websocket.Conn) (int, []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	op, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return op, b
}

func wantText(t *testing.T, c *websocket.Conn, want string) {
	t.Helper()
	if op, b := readFrame(t, c); op != websocket.TextMessage || string(b) != want {
		t.Fatalf("got %d %q, want text %q", op, b, want)
	}
}

func wantClose(t *testing.T, c *websocket.Conn, code int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		if !websocket.IsCloseError(err, code) {
			t.Fatalf("want close %d, got %v", code, err)
		}
		return
	}
}

func TestSignalRendezvous(t *testing.T) {
	r := start(t, opts{})
	r.claim("chat")
	p := r.signal("chat", "primary")
	// A frame with nobody on the other side is dropped.
	if err := p.WriteMessage(websocket.BinaryMessage, []byte("lost")); err != nil {
		t.Fatal(err)
	}
	// The relay reads a socket's frames in order: once ping is answered,
	// the lost frame has been handled.
	if err := p.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	wantText(t, p, "pong")
	c := r.signal("chat", "companion")
	wantText(t, p, "peer 1")
	wantText(t, c, "peer 1")
	frame := bytes.Repeat([]byte{0, 1, 2, 0xff}, 16<<10) // exactly 64 KiB
	if err := p.WriteMessage(websocket.BinaryMessage, frame); err != nil {
		t.Fatal(err)
	}
	if op, b := readFrame(t, c); op != websocket.BinaryMessage || !bytes.Equal(b, frame) {
		t.Fatalf("forwarded %d bytes op %d", len(b), op)
	}
	if err := c.WriteMessage(websocket.BinaryMessage, []byte("answer")); err != nil {
		t.Fatal(err)
	}
	if _, b := readFrame(t, p); string(b) != "answer" {
		t.Fatalf("got %q", b)
	}
	if err := c.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	wantText(t, c, "pong")

	// A second primary replaces the first (4000 replaced); both sides are
	// told peer 1 again.
	p2 := r.signal("chat", "primary")
	_ = p.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _, err := p.ReadMessage()
	var ce *websocket.CloseError
	if !asClose(err, &ce) || ce.Code != 4000 || ce.Text != "replaced" {
		t.Fatalf("replaced socket: %v", err)
	}
	wantText(t, p2, "peer 1")
	wantText(t, c, "peer 1")

	// The primary leaves: the companion gets peer 0.
	p2.Close()
	wantText(t, c, "peer 0")

	// Too large: 1009; other text: 1003.
	p3 := r.signal("chat", "primary")
	wantText(t, p3, "peer 1")
	wantText(t, c, "peer 1")
	if err := p3.WriteMessage(websocket.BinaryMessage, append(frame, 0)); err != nil {
		t.Fatal(err)
	}
	wantClose(t, p3, 1009)
	wantText(t, c, "peer 0")
	p4 := r.signal("chat", "primary")
	wantText(t, p4, "peer 1")
	wantText(t, c, "peer 1")
	if err := p4.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	wantClose(t, p4, 1003)
	wantText(t, c, "peer 0")

	// Erase closes what is left with 1000.
	p5 := r.signal("chat", "primary")
	wantText(t, p5, "peer 1")
	wantText(t, c, "peer 1")
	expect(t, r.do("DELETE", mb("chat"), token, nil), 204, "")
	wantClose(t, p5, 1000)
	wantClose(t, c, 1000)
}

func asClose(err error, ce **websocket.CloseError) bool {
	e, ok := err.(*websocket.CloseError)
	if ok {
		*ce = e
	}
	return ok
}

func TestSignalFrameBucket(t *testing.T) {
	r := start(t, opts{})
	r.claim("chat")
	p := r.signal("chat", "primary")
	c := r.signal("chat", "companion")
	wantText(t, p, "peer 1")
	wantText(t, c, "peer 1")
	for i := range 400 {
		if err := p.WriteMessage(websocket.BinaryMessage, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		if _, b := readFrame(t, c); string(b) != strconv.Itoa(i) {
			t.Fatalf("frame %d: %q", i, b)
		}
	}
	if err := p.WriteMessage(websocket.BinaryMessage, []byte("401st")); err != nil {
		t.Fatal(err)
	}
	wantClose(t, p, 1008)
	wantText(t, c, "peer 0")
	// The companion's side has its own bucket.
	p2 := r.signal("chat", "primary")
	wantText(t, p2, "peer 1")
	wantText(t, c, "peer 1")
	if err := c.WriteMessage(websocket.BinaryMessage, []byte("still")); err != nil {
		t.Fatal(err)
	}
	if _, b := readFrame(t, p2); string(b) != "still" {
		t.Fatalf("got %q", b)
	}
}

func TestSignalNeedsTheOptionAndTheToken(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	r.claim("chat")
	for _, tc := range []struct {
		app, side string
		hdr       http.Header
		want      int
	}{
		{"notes", "primary", http.Header{"Authorization": {"Bearer " + token}}, 404},
		{"chat", "middle", http.Header{"Authorization": {"Bearer " + token}}, 404},
		{"chat", "primary", http.Header{"Authorization": {"Bearer " + other}}, 403},
		{"chat", "primary", nil, 401},
	} {
		d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
		_, resp, err := d.Dial(r.ws+mb(tc.app)+"/signal/"+tc.side, tc.hdr)
		if err == nil || resp == nil || resp.StatusCode != tc.want {
			t.Fatalf("%+v: %v %v", tc, err, resp)
		}
	}
}

func TestICEFromTheRESTSecret(t *testing.T) {
	r := start(t, opts{})
	r.claim("chat")
	r.claim("notes")
	expect(t, r.do("GET", mb("notes")+"/ice", token, nil), 404, "not_found")
	a := r.do("GET", mb("chat")+"/ice", token, nil)
	if a.status != 200 || a.header.Get("Content-Type") != "application/json" || a.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("ice %d %v", a.status, a.header)
	}
	var got struct {
		ICEServers []struct {
			URLs       []string `json:"urls"`
			Username   string   `json:"username"`
			Credential string   `json:"credential"`
		} `json:"iceServers"`
		TTL int `json:"ttl"`
	}
	if err := json.Unmarshal(a.body, &got); err != nil {
		t.Fatal(err)
	}
	if got.TTL != 3600 || len(got.ICEServers) != 2 || got.ICEServers[0].URLs[0] != "stun:127.0.0.1:3478" || got.ICEServers[0].Username != "" {
		t.Fatalf("ice answer %s", a.body)
	}
	turn := got.ICEServers[1]
	expiry, label, ok := strings.Cut(turn.Username, ":")
	if !ok || label == "" || turn.URLs[0] != "turn:127.0.0.1:3478?transport=udp" {
		t.Fatalf("turn entry %+v", turn)
	}
	if exp, _ := strconv.ParseInt(expiry, 10, 64); exp != r.clock.now().Add(time.Hour).Unix() {
		t.Fatalf("expiry %s", expiry)
	}
	mac := hmac.New(sha1.New, []byte(testTURNSecret))
	mac.Write([]byte(turn.Username))
	if turn.Credential != base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
		t.Fatal("credential is not base64(HMAC-SHA1(secret, username))")
	}
	// The ICE bucket: 6, then 1 per 30 s.
	for range 5 {
		expect(t, r.do("GET", mb("chat")+"/ice", token, nil), 200, "")
	}
	a = r.do("GET", mb("chat")+"/ice", token, nil)
	expect(t, a, 429, "rate_limited")
	if a.header.Get("Retry-After") != "30" {
		t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
	}
	r.clock.advance(30 * time.Second)
	expect(t, r.do("GET", mb("chat")+"/ice", token, nil), 200, "")
}

// fakeCloudflare answers generate-ice-servers as Cloudflare does (201)
// after checking the key id, the bearer and the ttl body.
func fakeCloudflare(t *testing.T, down *atomic.Bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		switch {
		case down.Load():
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		case req.Method != "POST" || req.URL.Path != "/v1/turn/keys/key-id-1/credentials/generate-ice-servers":
			http.NotFound(w, req)
		case req.Header.Get("Authorization") != "Bearer cf-api-token":
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		case string(body) != `{"ttl":3600}`:
			http.Error(w, "bad ttl "+string(body), http.StatusBadRequest)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"iceServers":[{"urls":["stun:stun.cloudflare.com:3478"]},{"urls":["turn:turn.cloudflare.com:3478?transport=udp"],"username":"cfuser","credential":"cfcred"}]}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestICEFromCloudflare(t *testing.T) {
	var down atomic.Bool
	cf := fakeCloudflare(t, &down)
	only := &mailbox.ICEConfig{CloudflareKeyID: "key-id-1", CloudflareToken: "cf-api-token", CloudflareURL: cf.URL}
	r := start(t, opts{ice: only})
	r.claim("chat")
	a := r.do("GET", mb("chat")+"/ice", token, nil)
	if a.status != 200 || !bytes.Contains(a.body, []byte(`"username":"cfuser"`)) || !bytes.Contains(a.body, []byte(`"ttl":3600`)) {
		t.Fatalf("cloudflare ice: %d %s", a.status, a.body)
	}
	down.Store(true)
	expect(t, r.do("GET", mb("chat")+"/ice", token, nil), 502, "upstream_unavailable")

	// With the REST secret too, a Cloudflare outage still answers 200.
	both := *only
	both.Secret, both.URLs = testTURNSecret, []string{"turn:127.0.0.1:3478?transport=udp"}
	r2 := start(t, opts{ice: &both})
	r2.claim("chat")
	a = r2.do("GET", mb("chat")+"/ice", token, nil)
	if a.status != 200 || bytes.Contains(a.body, []byte("cfuser")) || !bytes.Contains(a.body, []byte("127.0.0.1:3478")) {
		t.Fatalf("REST while cloudflare is down: %d %s", a.status, a.body)
	}
	down.Store(false)
	a = r2.do("GET", mb("chat")+"/ice", token, nil)
	if !bytes.Contains(a.body, []byte("cfuser")) || !bytes.Contains(a.body, []byte("127.0.0.1:3478")) {
		t.Fatalf("merged: %s", a.body)
	}
}

func TestICEAppNeedsASource(t *testing.T) {
	apps, _ := mailbox.ParseApps("chat:ice")
	if _, err := mailbox.New(mailbox.Config{Apps: apps}); err == nil || !strings.Contains(err.Error(), "ice") {
		t.Fatalf("ice without a source: %v", err)
	}
}
