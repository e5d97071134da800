package channel

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

const (
	keyA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	keyB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// token returns a distinct 64-hex token per (computer, role) letter pair.
func token(computer, role byte) string {
	return strings.Repeat(string(computer), 32) + strings.Repeat(string(role), 32)
}

func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(New(map[string]string{keyA: "host-a", keyB: "host-b"}))
	t.Cleanup(srv.Close)
	return srv
}

// postClaim returns the status and decoded JSON answer of POST /claim.
func postClaim(t *testing.T, srv *httptest.Server, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/claim", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("claim: Cache-Control %q", got)
	}
	var answer map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatalf("claim: answer is not JSON: %v", err)
	}
	return resp.StatusCode, answer
}

func claimBody(owner, phone string) string {
	return `{"ownerToken":"` + owner + `","phoneToken":"` + phone + `"}`
}

// mustClaim claims key for computer letter c and returns its owner and phone tokens.
func mustClaim(t *testing.T, srv *httptest.Server, key string, c byte) (owner, phone string) {
	t.Helper()
	owner, phone = token(c, '0'), token(c, '1')
	if status, answer := postClaim(t, srv, key, claimBody(owner, phone)); status != http.StatusOK {
		t.Fatalf("claim: %d %v", status, answer)
	}
	return owner, phone
}

func dial(t *testing.T, srv *httptest.Server, path string, header http.Header) *websocket.Conn {
	t.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+path, header)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP %d)", path, err, status)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func bearerHeader(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

func readControl(t *testing.T, ws *websocket.Conn) message {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	var m message
	if err := ws.ReadJSON(&m); err != nil {
		t.Fatalf("control socket: %v", err)
	}
	return m
}

func readFrame(t *testing.T, ws *websocket.Conn) string {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	kind, frame, err := ws.ReadMessage()
	if err != nil || kind != websocket.TextMessage {
		t.Fatalf("phone: kind %d, err %v", kind, err)
	}
	return string(frame)
}

// expectClosed reads until ws ends and checks the close code the relay sent.
func expectClosed(t *testing.T, ws *websocket.Conn, code int) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		_, _, err := ws.ReadMessage()
		if err == nil {
			continue
		}
		if ce := (*websocket.CloseError)(nil); !errors.As(err, &ce) || ce.Code != code {
			t.Fatalf("want close %d, got %v", code, err)
		}
		return
	}
}

func send(t *testing.T, ws *websocket.Conn, frame string) {
	t.Helper()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		t.Fatal(err)
	}
}

func TestClaimAnswers(t *testing.T) {
	srv := newServer(t)
	owner, phone := token('a', '0'), token('a', '1')
	for _, tc := range []struct {
		name, key, body string
		want            int
	}{
		{"no bearer", "", claimBody(owner, phone), http.StatusUnauthorized},
		{"unknown key", strings.Repeat("c", 64), claimBody(owner, phone), http.StatusForbidden},
		{"not JSON", keyA, `{"ownerToken":`, http.StatusBadRequest},
		{"short token", keyA, claimBody(owner[:63], phone), http.StatusBadRequest},
		{"upper-case token", keyA, claimBody(strings.ToUpper(owner), phone), http.StatusBadRequest},
		{"equal tokens", keyA, claimBody(owner, owner), http.StatusBadRequest},
		{"over 1 KiB", keyA, claimBody(owner, phone) + strings.Repeat(" ", 1024), http.StatusRequestEntityTooLarge},
		{"first use", keyA, claimBody(owner, phone), http.StatusOK},
		{"reuse", keyA, claimBody(token('z', '0'), token('z', '1')), http.StatusConflict},
		{"tokens taken", keyB, claimBody(owner, token('b', '1')), http.StatusBadRequest},
	} {
		status, answer := postClaim(t, srv, tc.key, tc.body)
		if status != tc.want {
			t.Errorf("%s: status %d, want %d (%v)", tc.name, status, tc.want, answer)
		}
		if status == http.StatusOK && (answer["claimed"] != true || answer["host"] != "host-a") {
			t.Errorf("%s: answer %v", tc.name, answer)
		}
		if status != http.StatusOK && answer["error"] == nil {
			t.Errorf("%s: answer %v has no error", tc.name, answer)
		}
	}
}

func TestRefusedSockets(t *testing.T) {
	srv := newServer(t)
	owner, phone := mustClaim(t, srv, keyA, 'a')
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http")
	refused := func(path string, header http.Header) {
		t.Helper()
		_, resp, err := websocket.DefaultDialer.Dial(wsURL+path, header)
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: want 403, got %v", path, err)
		}
	}
	refused("/host", bearerHeader(phone))
	refused("/botharness-device/channel", bearerHeader(phone)) // computer offline
	dial(t, srv, "/host", bearerHeader(owner))
	refused("/host", bearerHeader(owner)) // second control socket
	refused("/botharness-device/channel", bearerHeader(owner))
}

// TestComputersAreIsolated checks that frames cross only between a computer and its
// own phones, and that one computer going offline leaves the other working.
func TestComputersAreIsolated(t *testing.T) {
	srv := newServer(t)
	ownerA, phoneA := mustClaim(t, srv, keyA, 'a')
	ownerB, phoneB := mustClaim(t, srv, keyB, 'b')
	hostA := dial(t, srv, "/host", bearerHeader(ownerA))
	hostB := dial(t, srv, "/host", bearerHeader(ownerB))
	devA := dial(t, srv, "/botharness-device/channel", bearerHeader(phoneA))
	devB := dial(t, srv, "/botharness-device/channel", http.Header{"X-Botharness-Admission": {phoneB}})
	idA, idB := readControl(t, hostA), readControl(t, hostB)
	if idA.Type != "open" || idB.Type != "open" || idA.ID == idB.ID {
		t.Fatalf("opens: %+v %+v", idA, idB)
	}

	send(t, devA, "from phone a")
	send(t, devB, "from phone b")
	if m := readControl(t, hostA); m.Type != "data" || m.ID != idA.ID || *m.Data != "from phone a" {
		t.Errorf("computer a got %+v", m)
	}
	if m := readControl(t, hostB); m.Type != "data" || m.ID != idB.ID || *m.Data != "from phone b" {
		t.Errorf("computer b got %+v", m)
	}

	// B names A's phone: it must reach nobody. Its own frame then arrives first.
	if err := hostB.WriteJSON(map[string]string{"type": "data", "id": idA.ID, "data": "stray"}); err != nil {
		t.Fatal(err)
	}
	if err := hostB.WriteJSON(map[string]string{"type": "data", "id": idB.ID, "data": "to phone b"}); err != nil {
		t.Fatal(err)
	}
	if err := hostA.WriteJSON(map[string]string{"type": "data", "id": idA.ID, "data": "to phone a"}); err != nil {
		t.Fatal(err)
	}
	if got := readFrame(t, devB); got != "to phone b" {
		t.Errorf("phone b got %q", got)
	}
	if got := readFrame(t, devA); got != "to phone a" {
		t.Errorf("phone a got %q", got)
	}

	hostA.Close()
	expectClosed(t, devA, websocket.CloseGoingAway)
	send(t, devB, "still here")
	if m := readControl(t, hostB); m.Type != "data" || *m.Data != "still here" {
		t.Errorf("computer b after a left: %+v", m)
	}
}

// TestFrameRoundTripsIntact sends a frame that needs escaping both ways, and has the
// computer answer with escapes, reordered keys and whitespace the relay must accept.
func TestFrameRoundTripsIntact(t *testing.T) {
	srv := newServer(t)
	owner, phone := mustClaim(t, srv, keyA, 'a')
	host := dial(t, srv, "/host", bearerHeader(owner))
	dev := dial(t, srv, "/botharness-device/channel", bearerHeader(phone))
	id := readControl(t, host).ID

	const frame = "quote \" backslash \\ slash / ctrl \x01\n\t html <&> unicode é 😀 \u2028"
	send(t, dev, frame)
	_ = host.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, raw, err := host.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	var m message
	if err := json.Unmarshal(raw, &m); err != nil || m.Data == nil || *m.Data != frame {
		t.Fatalf("computer got %s (%v)", raw, err)
	}
	if strings.Contains(string(raw), `\u003c`) {
		t.Errorf("relay escaped more than JSON requires: %s", raw)
	}

	reply := ` { "data" : "\"q\" \\ \/ \u00e9 \ud83d\ude00 \u0001" , "id":"` + id + `", "type":"data" } `
	if err := host.WriteMessage(websocket.TextMessage, []byte(reply)); err != nil {
		t.Fatal(err)
	}
	if got, want := readFrame(t, dev), "\"q\" \\ / é 😀 \x01"; got != want {
		t.Errorf("phone got %q, want %q", got, want)
	}
}

func TestFrameLimitsAndCloses(t *testing.T) {
	srv := newServer(t)
	owner, phone := mustClaim(t, srv, keyA, 'a')
	host := dial(t, srv, "/host", bearerHeader(owner))
	host.SetReadLimit(-1)

	// 70,000 bytes pass; one more closes the phone with 1009 and tells the computer.
	dev := dial(t, srv, "/botharness-device/channel", bearerHeader(phone))
	id := readControl(t, host).ID
	send(t, dev, strings.Repeat("x", maxFrame))
	if m := readControl(t, host); m.Type != "data" || len(*m.Data) != maxFrame {
		t.Fatalf("computer got %s with %d bytes", m.Type, len(*m.Data))
	}
	send(t, dev, strings.Repeat("x", maxFrame+1))
	expectClosed(t, dev, websocket.CloseMessageTooBig)
	if m := readControl(t, host); m.Type != "close" || m.ID != id {
		t.Errorf("after 1009 computer got %+v", m)
	}

	// A binary frame closes the phone with 1003.
	dev = dial(t, srv, "/botharness-device/channel", bearerHeader(phone))
	id = readControl(t, host).ID
	if err := dev.WriteMessage(websocket.BinaryMessage, []byte{1}); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, dev, websocket.CloseUnsupportedData)
	if m := readControl(t, host); m.Type != "close" || m.ID != id {
		t.Errorf("after 1003 computer got %+v", m)
	}

	// The computer's close delivers what it sent before, then closes with 1000.
	dev = dial(t, srv, "/botharness-device/channel", bearerHeader(phone))
	id = readControl(t, host).ID
	_ = host.WriteJSON(map[string]string{"type": "data", "id": id, "data": "last words"})
	_ = host.WriteJSON(map[string]string{"type": "close", "id": id})
	if got := readFrame(t, dev); got != "last words" {
		t.Errorf("phone got %q", got)
	}
	expectClosed(t, dev, websocket.CloseNormalClosure)

	// A malformed control frame closes the control socket with 1008.
	_ = host.WriteMessage(websocket.TextMessage, []byte(`{"type":"data","id":"nothex","data":""}`))
	expectClosed(t, host, websocket.ClosePolicyViolation)
}
