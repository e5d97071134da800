package main

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

// A client pipelines an ordinary request before an upgrade and resets the
// connection (SO_LINGER 0) without reading: fasthttp's flush of the first
// answer fails just before the hijack and it closes the connection without
// calling the hijack handler. Whatever the handler reserved for the socket
// before the upgrade must come back all the same (DESIGN.md: every slot
// reserved before an upgrade is released on every path), or a few such
// clients leave a direction answering 429 too_many_watchers, a computer's
// control socket 403 already open, an instance 429 too many attachments,
// with no socket open, forever.

// wsUpgrade is a WebSocket upgrade request for path with extra header lines
// (each ending in CRLF).
func wsUpgrade(path string, extra ...string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" + strings.Join(extra, "") + "\r\n"
}

// pipelinedFirst is, per listener, a request answered without credentials
// that goes before the upgrade.
var pipelinedFirst = map[string]string{
	"mailbox": "GET /v1/no-such-app/mailbox/x/p2c HTTP/1.1\r\nHost: relay\r\n\r\n",
	"channel": "GET /health HTTP/1.1\r\nHost: relay\r\n\r\n",
	"agent":   "GET /v1/no-such-path HTTP/1.1\r\nHost: relay\r\n\r\n",
}

// pipelinedReset sends service's pipelined first request and upgrade in one
// write, n times, each on a new connection reset at once, then waits until
// the listener has no more connections open than before: every attempt has
// been dealt with by then.
func (r *hostileRelay) pipelinedReset(t *testing.T, service, upgrade string, n int) {
	t.Helper()
	series := `edgerelay_listener_open_connections{service="` + service + `"}`
	before := hostileMetric(t, r.relayProc, series)
	for range n {
		c, err := r.dial(service)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, pipelinedFirst[service]+upgrade); err != nil {
			t.Fatalf("%s: write: %v", service, err)
		}
		raw := c
		if tc, ok := c.(*tls.Conn); ok {
			raw = tc.NetConn() // no close_notify: the reset alone
		}
		if err := raw.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		_ = raw.Close()
	}
	waitUntil(t, func() bool { return hostileMetric(t, r.relayProc, series) <= before })
}

// refusedDial dials a WebSocket that must be refused with status and a body
// containing want.
func refusedDial(t *testing.T, d *websocket.Dialer, url string, h http.Header, status int, want string) {
	t.Helper()
	c, resp, err := d.Dial(url, h)
	if err == nil {
		c.Close()
		t.Fatalf("%s: upgraded, want %d %s", url, status, want)
	}
	if resp == nil {
		t.Fatalf("%s: %v, want %d %s", url, err, status, want)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status || !strings.Contains(string(body), want) {
		t.Fatalf("%s: %d %s, want %d %s", url, resp.StatusCode, body, status, want)
	}
}

func TestHostilePipelinedUpgradeThenResetReleasesEverySlot(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_APPS=chat:signal"}
	rounds := soakScale(t)
	mint := func(args ...string) string { return lastLine(cliOK(t, env, args...)) }
	var channelKeys, pairKeys []string
	for i := range 2 * rounds {
		channelKeys = append(channelKeys, mint("keys", "channel", "add", "--host", "pipelined-"+strconv.Itoa(i)))
	}
	clientToken := mint("keys", "agent", "account", "add", "acme")
	for range 2 * rounds {
		pairKeys = append(pairKeys, mint("keys", "agent", "pair-key", "acme"))
	}
	r := startHostileRelay(t, env...)

	for round := range rounds {
		n := "/" + strconv.Itoa(round)
		t.Run("mailbox watch"+n, func(t *testing.T) { pipelinedWatch(t, r) })
		t.Run("mailbox signal"+n, func(t *testing.T) { pipelinedSignal(t, r) })
		t.Run("channel control socket"+n, func(t *testing.T) { pipelinedControl(t, r, channelKeys[2*round]) })
		t.Run("channel phone"+n, func(t *testing.T) { pipelinedPhone(t, r, channelKeys[2*round+1]) })
		t.Run("agent attach"+n, func(t *testing.T) { pipelinedAttach(t, r, pairKeys[2*round], clientToken) })
		t.Run("agent link"+n, func(t *testing.T) { pipelinedLink(t, r, pairKeys[2*round+1], clientToken) })
	}
}

// pipelinedWatch: 10 such watch upgrades of one direction (8 is its limit),
// then 8 real watchers all get their socket and a 9th is refused with 429.
// That is 18 sockets out of the mailbox's burst of 20.
func pipelinedWatch(t *testing.T, r *hostileRelay) {
	const limit = 8
	id, token := hostileMailbox(t, r)
	path := "/v1/chat/mailbox/" + id + "/p2c/watch?after=0"
	r.pipelinedReset(t, "mailbox", wsUpgrade(path, "Authorization: Bearer "+token+"\r\n", "Sec-WebSocket-Protocol: zerobyte.v1\r\n"), limit+2)
	for range limit {
		mailboxSocket(t, r, nil, id, token, "/p2c/watch?after=0")
	}
	waitUntil(t, func() bool { return hostileMetric(t, r.relayProc, "edgerelay_mailbox_watch_sockets") == limit })
	refusedDial(t, websocket.DefaultDialer, "ws://"+r.addrs["mailbox"]+path, http.Header{"Authorization": {"Bearer " + token}},
		http.StatusTooManyRequests, `{"error":"too_many_watchers","status":429}`)
}

// pipelinedSignal: signal sides have no limit a client could see (a newer
// socket replaces the older), so this shows that after such upgrades of both
// sides a real pair still meets.
func pipelinedSignal(t *testing.T, r *hostileRelay) {
	id, token := hostileMailbox(t, r)
	for _, side := range []string{"primary", "companion"} {
		r.pipelinedReset(t, "mailbox", wsUpgrade("/v1/chat/mailbox/"+id+"/signal/"+side, "Authorization: Bearer "+token+"\r\n"), 3)
	}
	a := mailboxSocket(t, r, nil, id, token, "/signal/primary")
	b := mailboxSocket(t, r, nil, id, token, "/signal/companion")
	for _, c := range []*websocket.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "peer 1" {
			t.Fatalf("got %q %v, want peer 1", msg, err)
		}
	}
}

// pipelinedControl: after such control-socket upgrades, /status says the
// computer is not connected, and its real control socket opens.
func pipelinedControl(t *testing.T, r *hostileRelay, claimKey string) {
	st, owner, _ := claim(t, r.origin("channel"), claimKey)
	if st != 200 {
		t.Fatalf("claim: %d", st)
	}
	r.pipelinedReset(t, "channel", wsUpgrade("/host", "Authorization: Bearer "+owner+"\r\n"), 3)
	connected := func() bool {
		t.Helper()
		code, body := statusOf(t, r.origin("channel"), owner)
		var s struct {
			Connected *bool `json:"connected"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &s) != nil || s.Connected == nil {
			t.Fatalf("/status: %d %s", code, body)
		}
		return *s.Connected
	}
	if connected() {
		t.Fatal("/status says connected with no control socket open")
	}
	ctl, resp, err := websocket.DefaultDialer.Dial("ws://"+r.addrs["channel"]+"/host", http.Header{"Authorization": {"Bearer " + owner}})
	if err != nil {
		body := ""
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
		}
		t.Fatalf("control socket: %v %s", err, body)
	}
	defer ctl.Close()
	waitUntil(t, connected)
}

// pipelinedPhone: 34 such phone upgrades (32 is the limit), then 32 real
// phones all get their channel and a 33rd is refused with 403.
func pipelinedPhone(t *testing.T, r *hostileRelay, claimKey string) {
	const limit = 32
	pair := newHostileChannel(t, r.relayProc, claimKey)
	r.pipelinedReset(t, "channel", wsUpgrade("/botharness-device/channel", "Authorization: Bearer "+pair.tok+"\r\n"), limit+2)
	url := "ws://" + r.addrs["channel"] + "/botharness-device/channel"
	bearer := http.Header{"Authorization": {"Bearer " + pair.tok}}
	for i := range limit {
		ph, resp, err := websocket.DefaultDialer.Dial(url, bearer)
		if err != nil {
			t.Fatalf("phone %d: %v %v", i+1, err, resp)
		}
		t.Cleanup(func() { ph.Close() })
	}
	refusedDial(t, websocket.DefaultDialer, url, bearer, http.StatusForbidden, `{"error":"too many phone channels"}`)
}

// pipelinedAttach: 66 such attach upgrades (64 is the limit), then 64 real
// clients all attach and a 65th is refused with 429.
func pipelinedAttach(t *testing.T, r *hostileRelay, pairKey, clientToken string) {
	const limit = 64
	redeemed := redeemPairKey(t, r.httpClient(), r.url("agent", ""), pairKey, "pipelined-attach")
	path := "/v1/attach/" + redeemed.InstanceID
	r.pipelinedReset(t, "agent", wsUpgrade(path, "Authorization: Bearer "+clientToken+"\r\n"), limit+2)
	d := &websocket.Dialer{TLSClientConfig: r.tls, HandshakeTimeout: 10 * time.Second}
	bearer := http.Header{"Authorization": {"Bearer " + clientToken}}
	for i := range limit {
		c, resp, err := d.Dial("wss://"+r.addrs["agent"]+path, bearer)
		if err != nil {
			t.Fatalf("attach %d: %v %v", i+1, err, resp)
		}
		t.Cleanup(func() { c.Close() })
	}
	refusedDial(t, d, "wss://"+r.addrs["agent"]+path, bearer, http.StatusTooManyRequests, "too many attachments")
}

// pipelinedLink: after such link upgrades, the instance's connector links
// and a client's frame reaches it. The link reserves only a reference to its
// instance's entry (memory, no limit a client could see), so this shows the
// path still works rather than a slot coming back.
func pipelinedLink(t *testing.T, r *hostileRelay, pairKey, clientToken string) {
	redeemed := redeemPairKey(t, r.httpClient(), r.url("agent", ""), pairKey, "pipelined-link")
	connect := "GET /v1/connect HTTP/1.1\r\nHost: relay\r\nUpgrade: contenox-relay/1\r\nConnection: Upgrade\r\n" +
		"Authorization: Bearer " + redeemed.InstanceToken + "\r\n\r\n"
	r.pipelinedReset(t, "agent", connect, 3)
	connectInstance(t, r, redeemed).attach(t, r, websocket.DefaultDialer, clientToken)
}

// TestHostileUpgradeRefusesOtherVersionsAndHTTP10: every WebSocket upgrade
// answers a Sec-WebSocket-Version other than 13 with 426 and
// Sec-WebSocket-Version: 13 (RFC 6455 4.2.2), and an HTTP/1.0 upgrade with
// 400 (4.2.1), each in its protocol's error shape; the agent link refuses
// an HTTP/1.0 upgrade too (RFC 9110 7.8). Nothing is upgraded.
func TestHostileUpgradeRefusesOtherVersionsAndHTTP10(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_APPS=chat:signal"}
	claimKey := lastLine(cliOK(t, env, "keys", "channel", "add", "--host", "versions"))
	claimKey2 := lastLine(cliOK(t, env, "keys", "channel", "add", "--host", "versions-2"))
	clientToken := lastLine(cliOK(t, env, "keys", "agent", "account", "add", "acme"))
	pairKey := lastLine(cliOK(t, env, "keys", "agent", "pair-key", "acme"))
	r := startHostileRelay(t, env...)

	id, token := hostileMailbox(t, r)
	pair := newHostileChannel(t, r.relayProc, claimKey) // the phone path needs its computer online
	redeemed := redeemPairKey(t, r.httpClient(), r.url("agent", ""), pairKey, "versions")
	type path struct {
		name, service, path, auth string
		// the bodies of a 426 and of a 400
		upgradeRequired, badRequest string
	}
	mailbox426, mailbox400 := `{"error":"upgrade_required","status":426}`, `{"error":"bad_request","status":400}`
	paths := []path{
		{"watch", "mailbox", "/v1/chat/mailbox/" + id + "/p2c/watch?after=0", token, mailbox426, mailbox400},
		{"signal", "mailbox", "/v1/chat/mailbox/" + id + "/signal/primary", token, mailbox426, mailbox400},
		{"control socket", "channel", "/host", "", `{"error":"unsupported websocket version"}`, `{"error":"not a websocket handshake"}`},
		{"phone", "channel", "/botharness-device/channel", pair.tok, `{"error":"unsupported websocket version"}`, `{"error":"not a websocket handshake"}`},
		{"attach", "agent", "/v1/attach/" + redeemed.InstanceID, clientToken,
			`{"error":{"message":"unsupported websocket version"}}`, `{"error":{"message":"not a websocket handshake"}}`},
	}
	// The control socket of a second computer, whose socket is not open,
	// so that the good handshake at the end upgrades.
	if st, owner, _ := claim(t, r.origin("channel"), claimKey2); st != 200 {
		t.Fatalf("claim: %d", st)
	} else {
		paths[2].auth = owner
	}

	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			for _, v := range []string{"8", "14"} {
				req := strings.Replace(wsUpgrade(p.path, "Authorization: Bearer "+p.auth+"\r\n"), "Version: 13", "Version: "+v, 1)
				resp, body := r.rawRequest(t, p.service, req)
				if resp.StatusCode != http.StatusUpgradeRequired || string(body) != p.upgradeRequired {
					t.Errorf("version %s: %d %s, want 426 %s", v, resp.StatusCode, body, p.upgradeRequired)
				}
				if got := resp.Header.Get("Sec-WebSocket-Version"); got != "13" {
					t.Errorf("version %s: Sec-WebSocket-Version %q, want 13", v, got)
				}
			}
			req := strings.Replace(wsUpgrade(p.path, "Authorization: Bearer "+p.auth+"\r\n"), "HTTP/1.1", "HTTP/1.0", 1)
			resp, body := r.rawRequest(t, p.service, req)
			if resp.StatusCode != http.StatusBadRequest || string(body) != p.badRequest {
				t.Errorf("HTTP/1.0: %d %s, want 400 %s", resp.StatusCode, body, p.badRequest)
			}
			// The edge: the same request as HTTP/1.1 with version 13 upgrades.
			resp, _ = r.rawRequest(t, p.service, wsUpgrade(p.path, "Authorization: Bearer "+p.auth+"\r\n"))
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Errorf("version 13 over HTTP/1.1: %d, want 101", resp.StatusCode)
			}
		})
	}
	t.Run("agent link", func(t *testing.T) {
		req := "GET /v1/connect HTTP/1.0\r\nHost: relay\r\nUpgrade: contenox-relay/1\r\nConnection: Upgrade\r\n" +
			"Authorization: Bearer " + redeemed.InstanceToken + "\r\n\r\n"
		resp, body := r.rawRequest(t, "agent", req)
		if want := `{"error":{"message":"GET with Upgrade: contenox-relay/1 required"}}`; resp.StatusCode != http.StatusBadRequest || string(body) != want {
			t.Errorf("HTTP/1.0: %d %s, want 400 %s", resp.StatusCode, body, want)
		}
	})
}
