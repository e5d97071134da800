package agent_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/agent/agenttest"
)

func TestConnectAndWelcome(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	w := c.Welcome()
	if w.ProtocolVersion != 1 || w.Relay != "test-relay" || len(w.Sig) != 64 {
		t.Fatalf("welcome %q", w.Raw)
	}
	// The exact bytes: field order, re of the hello, sig last.
	var shape struct {
		Type     string          `json:"type"`
		Instance string          `json:"instance"`
		Re       string          `json:"re"`
		Payload  json.RawMessage `json:"payload"`
	}
	_ = json.Unmarshal(w.Raw, &shape)
	wantPrefix := `{"type":"relay.welcome","instance":"` + p.id + `","re":"hello","payload":{"protocol_version":1,"relay":"test-relay","sig":"`
	if !strings.HasPrefix(string(w.Raw), wantPrefix) || !strings.HasSuffix(string(w.Raw), `"}}`) {
		t.Fatalf("welcome %s", w.Raw)
	}
	waitFor(t, "connected", func() bool { return r.h.Connected(p.id) })
}

func TestConnectRefusals(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	p := r.pair("acme", "host-1")
	o := r.connOpts(p)

	// 401 and 403 only for a bad token: the connector gives up for good.
	for _, tc := range []struct {
		name  string
		token string
	}{{"no token", ""}, {"unknown token", strings.Repeat("0", 64)}} {
		o := o
		o.Token = tc.token
		if _, err := agenttest.Dial(context.Background(), o); !errors.Is(err, agenttest.ErrUnauthorized) {
			t.Errorf("%s: %v, want unauthorized", tc.name, err)
		}
	}
	a := r.do("GET", "/v1/connect", nil, bearer(p.token))
	if a.status != 400 {
		t.Errorf("GET without the upgrade: %d, want 400 (not 401/403)", a.status)
	}
	hdr := bearer(p.token)
	hdr.Set("Upgrade", "websocket")
	hdr.Set("Connection", "Upgrade")
	if a := r.do("GET", "/v1/connect", nil, hdr); a.status != 400 {
		t.Errorf("upgrade to websocket: %d, want 400", a.status)
	}
	errorMessage(t, a)

	// The listener is TLS 1.3 only, as the connector demands.
	o.TLSMaxVersion = tls.VersionTLS12
	if _, err := agenttest.Dial(context.Background(), o); err == nil {
		t.Error("TLS 1.2 link accepted")
	}

	// A revoked instance's token is refused with 403.
	if err := r.keys.RevokeInstance(p.id); err != nil {
		t.Fatal(err)
	}
	if _, err := agenttest.Dial(context.Background(), r.connOpts(p)); !errors.Is(err, agenttest.ErrUnauthorized) {
		t.Errorf("revoked: %v, want unauthorized", err)
	}
}

func TestHelloRules(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	p := r.pair("acme", "host-1")
	other := r.pair("acme", "host-2")

	dial := func(mod func(*agenttest.Options)) (*agenttest.Link, error) {
		o := r.connOpts(p)
		mod(&o)
		l, err := agenttest.Handshake(context.Background(), o)
		if err == nil {
			t.Cleanup(func() { l.Conn.Close() })
		}
		return l, err
	}
	relayErr := func(err error, code string) {
		t.Helper()
		var re *agenttest.RelayError
		if !errors.As(err, &re) || re.Code != code {
			t.Fatalf("%v, want relay.error %s", err, code)
		}
		f, _ := agenttest.DecodeFrame(re.Raw)
		if f.Re != "hello" {
			t.Fatalf("error %s does not answer the hello", re.Raw)
		}
	}

	// protocol_version = min(hello's, 1).
	l, err := dial(func(o *agenttest.Options) { o.ProtocolVersion = 7 })
	if err != nil || l.Welcome.ProtocolVersion != 1 {
		t.Fatalf("offering 7: %v", err)
	}
	_, err = dial(func(o *agenttest.Options) { o.ProtocolVersion = -1 })
	relayErr(err, "unsupported_version")
	_, err = dial(func(o *agenttest.Options) { o.OmitVersion = true })
	relayErr(err, "unsupported_version")

	// The hello must name the token's instance.
	_, err = dial(func(o *agenttest.Options) { o.HelloInstance = other.id })
	relayErr(err, "unknown_instance")

	// Nonces: none means no sig; 64 bytes are signed; 65 are refused.
	l, err = dial(func(o *agenttest.Options) { o.NoNonce = true })
	if err != nil || l.Welcome.Sig != nil || strings.Contains(string(l.Welcome.Raw), "sig") {
		t.Fatalf("no nonce: %v %s", err, welcomeRaw(l))
	}
	nonce64 := make([]byte, 64)
	nonce64[5] = 9
	if _, err := dial(func(o *agenttest.Options) { o.Nonce = nonce64 }); err != nil {
		t.Fatalf("64-byte nonce: %v", err)
	}
	_, err = dial(func(o *agenttest.Options) { o.Nonce = make([]byte, 65) })
	relayErr(err, "malformed_frame")

	// A connector pinning another key refuses the relay for good.
	_, err = dial(func(o *agenttest.Options) { o.RelayKey = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=" })
	if !errors.Is(err, agenttest.ErrBadSignature) {
		t.Fatalf("wrong pinned key: %v", err)
	}
}

func welcomeRaw(l *agenttest.Link) string {
	if l == nil {
		return ""
	}
	return string(l.Welcome.Raw)
}

// rawLink upgrades a link by hand and returns it before any hello.
func (r *relay) rawLink(token string) (net.Conn, *bufio.Reader) {
	r.t.Helper()
	return rawUpgrade(r.t, r.dial(r.t), r.addr, token)
}

// rawUpgrade writes the link's upgrade request on conn and reads the 101,
// checking its exact headers.
func rawUpgrade(tb testing.TB, conn net.Conn, addr, token string) (net.Conn, *bufio.Reader) {
	tb.Helper()
	req := "GET /v1/connect HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: contenox-relay/1\r\nConnection: Upgrade\r\nAuthorization: Bearer " + token + "\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		tb.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	status, err := br.ReadString('\n')
	if err != nil || status != "HTTP/1.1 101 Switching Protocols\r\n" {
		tb.Fatalf("status %q %v", status, err)
	}
	var hdrs []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			tb.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
		hdrs = append(hdrs, line)
	}
	if strings.Join(hdrs, "") != "Upgrade: contenox-relay/1\r\nConnection: Upgrade\r\n" {
		tb.Fatalf("101 headers %q", hdrs)
	}
	return conn, br
}

// rawHello is a hello for instance id with the nonce 0x00..0x1f.
func rawHello(id string) string {
	return `{"type":"relay.hello","instance":"` + id + `","id":"hello","payload":{"protocol_version":1,"instance":"` + id + `","agent":"raw/1","nonce":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}}` + "\n"
}

// TestNoControlBeforeWelcome: nothing reaches a runtime before the
// welcome, not the relay's heartbeat probes, not the frames or departures
// of attached clients; and the welcome is the first line after the hello.
func TestNoControlBeforeWelcome(t *testing.T) {
	r := startRelay(t, relayOpts{heartbeatEvery: 50 * time.Millisecond, heartbeatTimeout: 2 * time.Second, helloTimeout: 2 * time.Second})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	cl := r.attach(p.id, ctok)
	conn, br := r.rawLink(p.token)
	cl.send(`{"type":"acp.message","id":"r1","payload":{}}`) // offline: answered by the relay
	if f := cl.readFrame(); f.Type != "relay.error" {
		t.Fatalf("client got %s", f.Raw)
	}
	cl.c.Close() // a detach, were the link welcomed

	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if b, err := br.ReadByte(); err == nil {
		t.Fatalf("relay sent %q before the welcome", b)
	}
	conn2, br2 := r.rawLink(p.token)
	conn.Close()
	if _, err := conn2.Write([]byte(rawHello(p.id))); err != nil {
		t.Fatal(err)
	}
	_ = conn2.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := br2.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, `{"type":"relay.welcome",`) {
		t.Fatalf("first line %q %v", line, err)
	}
	if err := agenttest.Verify(r.pub, seqBytes(32), 1, p.id, welcomeSig(t, line)); err != nil {
		t.Fatal(err)
	}
}

func seqBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func welcomeSig(t *testing.T, line string) []byte {
	t.Helper()
	var w struct {
		Payload struct {
			Sig []byte `json:"sig"`
		} `json:"payload"`
	}
	if err := json.Unmarshal([]byte(line), &w); err != nil {
		t.Fatal(err)
	}
	return w.Payload.Sig
}

func TestHelloTimeoutAndGarbage(t *testing.T) {
	r := startRelay(t, relayOpts{helloTimeout: 200 * time.Millisecond})
	r.account("acme")
	p := r.pair("acme", "host-1")

	// No hello: the link is closed once HelloTimeout passes.
	conn, br := r.rawLink(p.token)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("silent link: %v, want EOF", err)
	}

	// A first frame that is not a hello is answered with malformed_frame
	// (echoing its id) and the link closed.
	conn, br = r.rawLink(p.token)
	_, _ = conn.Write([]byte(`{"type":"acp.message","instance":"` + p.id + `","id":"x1"}` + "\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := br.ReadString('\n')
	f, err := agenttest.DecodeFrame([]byte(strings.TrimSuffix(line, "\n")))
	if err != nil || f.Type != "relay.error" || f.Re != "x1" || !strings.Contains(string(f.Payload), "malformed_frame") {
		t.Fatalf("answer %q", line)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the refusal: %v, want EOF", err)
	}
}

// TestNewestLinkWins: a second link with the same token replaces the
// first, which is closed; routing follows the new one.
func TestNewestLinkWins(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	first := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, first)
	second := r.connect(p)
	select {
	case <-first.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the older link is still open")
	}
	waitFor(t, "new link installed", func() bool { return r.h.Connected(p.id) })
	cl.send(`{"type":"acp.message","id":"m2"}`)
	if f := next(t, second); f.ID != "m2" || f.Session != sess {
		t.Fatalf("new link got %s", f.Raw)
	}
	if err := second.Send([]byte(`{"type":"acp.message","instance":"` + p.id + `","session":"` + sess + `","re":"m2"}`)); err != nil {
		t.Fatal(err)
	}
	if f := cl.readFrame(); f.Re != "m2" {
		t.Fatalf("client got %s", f.Raw)
	}
}

func TestHeartbeats(t *testing.T) {
	r := startRelay(t, relayOpts{heartbeatEvery: 100 * time.Millisecond, heartbeatTimeout: 150 * time.Millisecond})
	r.account("acme")
	p := r.pair("acme", "host-1")

	// A connector heartbeating every 50 ms with a 100 ms timeout and
	// acking the relay's probes stays up.
	o := r.connOpts(p)
	o.HeartbeatEvery, o.HeartbeatTimeout = 50*time.Millisecond, 100*time.Millisecond
	c := r.connectWith(o)
	time.Sleep(time.Second)
	select {
	case <-c.Done():
		t.Fatalf("heartbeating link ended: %v", c.Err())
	default:
	}

	// A quiet connector is probed by the relay; acking keeps it up.
	o.HeartbeatEvery = -1
	quietC := r.connectWith(o)
	time.Sleep(time.Second)
	if quietC.Probes() < 3 {
		t.Fatalf("%d probes of a quiet link in 1 s", quietC.Probes())
	}
	select {
	case <-quietC.Done():
		t.Fatalf("acking link ended: %v", quietC.Err())
	default:
	}

	// One that does not ack is closed after the timeout.
	o.IgnoreProbes = true
	deaf := r.connectWith(o)
	select {
	case <-deaf.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a link that never acks is still open")
	}
	if deaf.Probes() == 0 {
		t.Fatal("closed without a probe")
	}
}

// TestControlFromInstance: heartbeats with an id are acked, unknown
// control requests answered unsupported_type, and responses and
// notifications never answered.
func TestControlFromInstance(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	send := func(s string) {
		t.Helper()
		if err := c.Send([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Not answered: a heartbeat without id, a response, notifications of
	// unknown types, an ack. The heartbeat after them is the first answer.
	send(`{"type":"relay.heartbeat","instance":"` + p.id + `"}`)
	send(`{"type":"relay.error","instance":"` + p.id + `","re":"zz","payload":{"code":"x"}}`)
	send(`{"type":"relay.whatever","instance":"` + p.id + `"}`)
	send(`{"type":"relay.ack","instance":"` + p.id + `","re":"nobody"}`)
	send(`{"type":"relay.heartbeat","instance":"` + p.id + `","id":"h\u00e9"}`)
	f := next(t, c)
	if string(f.Raw) != `{"type":"relay.ack","instance":"`+p.id+`","re":"h\u00e9"}` {
		t.Fatalf("ack %s", f.Raw)
	}
	typ := "relay." + strings.Repeat("x", 122) // 128 bytes, the longest type
	send(`{"type":"` + typ + `","instance":"` + p.id + `","session":"s1","id":"q1"}`)
	f = next(t, c)
	want := `{"type":"relay.error","instance":"` + p.id + `","session":"s1","re":"q1","payload":{"code":"unsupported_type","message":"unsupported message type ` + typ + `"}}`
	if string(f.Raw) != want {
		t.Fatalf("unsupported answer\n got %s\nwant %s", f.Raw, want)
	}
	// A second hello gets no second welcome.
	send(`{"type":"relay.hello","instance":"` + p.id + `","id":"hello","payload":{"protocol_version":1}}`)
	f = next(t, c)
	if f.Type != "relay.error" || f.Re != "hello" || !strings.Contains(string(f.Payload), "malformed_frame") {
		t.Fatalf("second hello answered %s", f.Raw)
	}
}
