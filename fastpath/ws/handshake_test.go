package ws_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"edgerelay/fastpath/ws"
)

func TestHandshakeAccept(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	resp, _, _ := roundTrip(t, ts.addr, upgradeRequest(ts.addr))
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %s, expected 101", resp.Status)
	}
	// The example of RFC 6455 section 1.3.
	if got := resp.Header.Get("Sec-WebSocket-Accept"); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Errorf("Sec-WebSocket-Accept %q, expected s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", got)
	}
	if got := resp.Header.Get("Upgrade"); !strings.EqualFold(got, "websocket") {
		t.Errorf("Upgrade %q, expected websocket", got)
	}
	if got := resp.Header.Get("Connection"); !strings.EqualFold(got, "upgrade") {
		t.Errorf("Connection %q, expected Upgrade", got)
	}
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != "" {
		t.Errorf("Sec-WebSocket-Protocol %q, expected none: the client offered none", got)
	}
	ts.accept(t)
}

// Browsers word the handshake differently; all of these are valid.
func TestHandshakeVariants(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	for _, hdr := range []string{
		"Upgrade: WebSocket\r\nConnection: keep-alive, Upgrade\r\n", // Firefox
		"Upgrade: websocket\r\nConnection: upgrade\r\n",
		"Upgrade: websocket\r\nConnection: Upgrade, HTTP2-Settings\r\n",
	} {
		req := "GET / HTTP/1.1\r\nHost: x\r\n" + hdr +
			"Sec-WebSocket-Key: " + handshakeKey + "\r\nSec-WebSocket-Version: 13\r\n\r\n"
		resp, _, _ := roundTrip(t, ts.addr, req)
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Errorf("%q: status %s, expected 101", hdr, resp.Status)
			continue
		}
		ts.accept(t)
	}
}

func TestHandshakeSubprotocol(t *testing.T) {
	ts := startServer(t, ws.Options{}, echo)

	// The server picks "chat" from the client's list and echoes it.
	c := dialGorilla(t, ts.addr, 0, "superchat", "chat")
	if got := c.Subprotocol(); got != "chat" {
		t.Errorf("subprotocol %q, expected chat", got)
	}

	// The same over a raw connection, with the list split over two headers.
	req := strings.Replace(upgradeRequest(ts.addr), "\r\n\r\n",
		"\r\nSec-WebSocket-Protocol: v1, v2\r\nSec-WebSocket-Protocol: chat\r\n\r\n", 1)
	resp, _, _ := roundTrip(t, ts.addr, req)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %s, expected 101", resp.Status)
	}
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != "chat" {
		t.Errorf("Sec-WebSocket-Protocol %q, expected chat", got)
	}

	// A client that offers nothing the server speaks gets no subprotocol.
	c = dialGorilla(t, ts.addr, 0, "v1")
	if got := c.Subprotocol(); got != "" {
		t.Errorf("subprotocol %q, expected none", got)
	}
}

func TestCheckHandshakeRefusals(t *testing.T) {
	ts := startServer(t, ws.Options{}, nil)
	const (
		key     = "Sec-WebSocket-Key: " + handshakeKey + "\r\n"
		version = "Sec-WebSocket-Version: 13\r\n"
		upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\n"
	)
	cases := []struct {
		name, request string
		isUpgrade     bool
		reason        string
		status        int    // 400 unless set
		version       string // the Sec-WebSocket-Version the answer must carry
	}{
		{"not GET", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n" + upgrade + key + version,
			false, "method is not GET", 0, ""},
		{"no Upgrade header", "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n" + key + version,
			false, "Upgrade header lacks websocket", 0, ""},
		{"Upgrade to something else", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n" + key + version,
			false, "Upgrade header lacks websocket", 0, ""},
		{"no Connection upgrade", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive\r\n" + key + version,
			false, "Connection header lacks upgrade", 0, ""},
		// RFC 6455 4.2.2: 426 and the version the server speaks.
		{"version 8", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + key + "Sec-WebSocket-Version: 8\r\n",
			true, "Sec-WebSocket-Version is not 13", http.StatusUpgradeRequired, "13"},
		{"version 14", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + key + "Sec-WebSocket-Version: 14\r\n",
			true, "Sec-WebSocket-Version is not 13", http.StatusUpgradeRequired, "13"},
		{"no version", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + key,
			true, "Sec-WebSocket-Version is missing", 0, ""},
		// RFC 6455 4.2.1: HTTP/1.1 or higher.
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: x\r\n" + upgrade + key + version,
			true, "HTTP/1.0 cannot upgrade", 0, ""},
		{"no key", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + version,
			true, "Sec-WebSocket-Key is missing", 0, ""},
		{"key of 5 bytes", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + version + "Sec-WebSocket-Key: c2hvcnQ=\r\n",
			true, "Sec-WebSocket-Key is not 16 bytes in base64", 0, ""},
		{"key not base64", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + version + "Sec-WebSocket-Key: !!!!!!!!!!!!!!!!!!!!!!==\r\n",
			true, "Sec-WebSocket-Key is not 16 bytes in base64", 0, ""},
		{"key too long", "GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + version + "Sec-WebSocket-Key: " + strings.Repeat("QUFB", 12) + "\r\n",
			true, "Sec-WebSocket-Key is not 16 bytes in base64", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, _ := roundTrip(t, ts.addr, tc.request+"\r\n")
			body, _ := io.ReadAll(resp.Body)
			want := tc.status
			if want == 0 {
				want = http.StatusBadRequest
			}
			if resp.StatusCode != want {
				t.Fatalf("status %s, expected %d", resp.Status, want)
			}
			if got := resp.Header.Get("Sec-WebSocket-Version"); got != tc.version {
				t.Errorf("Sec-WebSocket-Version %q, expected %q", got, tc.version)
			}
			if want := "ws: bad handshake: " + tc.reason; string(body) != want {
				t.Errorf("body %q, expected %q", body, want)
			}
			if got := resp.Header.Get("X-Is-Upgrade"); got != strconv.FormatBool(tc.isUpgrade) {
				t.Errorf("IsUpgrade said %s, expected %v", got, tc.isUpgrade)
			}
			if got := resp.Header.Get("Sec-WebSocket-Accept"); got != "" {
				t.Errorf("refusal carries Sec-WebSocket-Accept %q", got)
			}
		})
	}
	select {
	case <-ts.conns:
		t.Error("a refused handshake was upgraded")
	default:
	}
}
