package signal

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// bench/signalbench checks that this baseline and our relay answer the
// load's own exchange alike; these tests cover the rest of the spec's
// signal table that the baseline implements.

const (
	id    = "AAECAwQFBgcICQoLDA0ODw"
	token = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
)

// start serves the baseline on a clock that stands still, so that the
// buckets refill only when a test says so.
func start(t *testing.T) (*httptest.Server, *Handler) {
	t.Helper()
	now := time.Unix(1_800_000_000, 0)
	h := New(Config{Apps: []string{"chat"}, Now: func() time.Time { return now }})
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		h.CloseSockets()
		srv.Close()
	})
	return srv, h
}

func claim(t *testing.T, srv *httptest.Server, tok string, want int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/chat/mailbox/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("claim: %s, want %d", resp.Status, want)
	}
}

func dial(t *testing.T, srv *httptest.Server, side, tok string) (*websocket.Conn, int) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, Subprotocols: []string{"zerobyte.v1"}}
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/chat/mailbox/" + id + "/signal/" + side
	c, resp, err := d.Dial(url, http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		if resp == nil {
			t.Fatal(err)
		}
		return nil, resp.StatusCode
	}
	t.Cleanup(func() { c.Close() })
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != "zerobyte.v1" {
		t.Fatalf("subprotocol %q", got)
	}
	return c, resp.StatusCode
}

func read(t *testing.T, c *websocket.Conn) (int, []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	op, b, err := c.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	return op, b
}

func wantText(t *testing.T, c *websocket.Conn, want string) {
	t.Helper()
	if op, b := read(t, c); op != websocket.TextMessage || string(b) != want {
		t.Fatalf("got %d %q, want text %q", op, b, want)
	}
}

func wantClose(t *testing.T, c *websocket.Conn, code int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
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

func TestRendezvous(t *testing.T) {
	srv, _ := start(t)
	claim(t, srv, token, http.StatusCreated)
	claim(t, srv, token, http.StatusNoContent)
	claim(t, srv, strings.Repeat("x", 43), http.StatusConflict)
	if _, status := dial(t, srv, "primary", strings.Repeat("x", 43)); status != http.StatusForbidden {
		t.Fatalf("wrong bearer: %d", status)
	}
	if _, status := dial(t, srv, "neither", token); status != http.StatusNotFound {
		t.Fatalf("bad side: %d", status)
	}

	p, _ := dial(t, srv, "primary", token)
	if err := p.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	wantText(t, p, "pong")
	c, _ := dial(t, srv, "companion", token)
	wantText(t, p, "peer 1")
	wantText(t, c, "peer 1")

	frame := bytes.Repeat([]byte{0, 1, 2, 0xff}, 16<<10) // exactly 64 KiB
	if err := p.WriteMessage(websocket.BinaryMessage, frame); err != nil {
		t.Fatal(err)
	}
	if op, b := read(t, c); op != websocket.BinaryMessage || !bytes.Equal(b, frame) {
		t.Fatalf("forwarded %d bytes, op %d", len(b), op)
	}
	if err := c.WriteMessage(websocket.BinaryMessage, []byte("answer")); err != nil {
		t.Fatal(err)
	}
	if _, b := read(t, p); string(b) != "answer" {
		t.Fatalf("got %q", b)
	}

	// A second primary replaces the first with 4000; both sides hear peer 1.
	p2, _ := dial(t, srv, "primary", token)
	wantClose(t, p, 4000)
	wantText(t, p2, "peer 1")
	wantText(t, c, "peer 1")

	// Too large: 1009, and the companion hears peer 0; other text: 1003.
	if err := p2.WriteMessage(websocket.BinaryMessage, append(frame, 0)); err != nil {
		t.Fatal(err)
	}
	wantClose(t, p2, websocket.CloseMessageTooBig)
	wantText(t, c, "peer 0")
	p3, _ := dial(t, srv, "primary", token)
	wantText(t, p3, "peer 1")
	wantText(t, c, "peer 1")
	if err := p3.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	wantClose(t, p3, websocket.CloseUnsupportedData)
	wantText(t, c, "peer 0")
}

// The frame bucket refuses the 401st frame in a burst with 1008, like ours.
func TestFrameBucket(t *testing.T) {
	srv, _ := start(t)
	claim(t, srv, token, http.StatusCreated)
	p, _ := dial(t, srv, "primary", token)
	c, _ := dial(t, srv, "companion", token)
	wantText(t, p, "peer 1")
	wantText(t, c, "peer 1")
	for range 400 {
		if err := p.WriteMessage(websocket.BinaryMessage, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, b := read(t, c); string(b) != "x" {
			t.Fatalf("got %q", b)
		}
	}
	if err := p.WriteMessage(websocket.BinaryMessage, []byte("one too many")); err != nil {
		t.Fatal(err)
	}
	wantClose(t, p, websocket.ClosePolicyViolation)
	wantText(t, c, "peer 0")
}
