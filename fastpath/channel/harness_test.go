package channel_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// relay is one channel relay on a loopback port, served by fasthttp like
// the real binary, with its own Pebble store.
type relay struct {
	t       *testing.T
	origin  string
	wsBase  string
	h       *channel.Handler
	claims  *store.ChannelClaims
	db      *store.DB
	dataDir string
	srv     *fasthttp.Server
	// hostKeys remembers the claim key made for each host.
	hostKeys map[string]string
}

type relayOpts struct {
	dataDir  string
	ping     time.Duration
	maxQueue int
}

func startRelay(t *testing.T, o relayOpts) *relay {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	db, err := store.Open(o.dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	claims := store.NewChannelClaims(db)
	h := channel.New(channel.Config{Claims: claims, PingInterval: o.ping, MaxQueue: o.maxQueue, DetachSockets: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h.ServeHTTP, MaxRequestBodySize: 64 << 10, KeepHijackedConns: true}
	go func() { _ = srv.Serve(ln) }()
	r := &relay{t: t, origin: "http://" + ln.Addr().String(), wsBase: "ws://" + ln.Addr().String(),
		h: h, claims: claims, db: db, dataDir: o.dataDir, srv: srv, hostKeys: map[string]string{}}
	t.Cleanup(r.stop)
	return r
}

func (r *relay) stop() {
	if r.db == nil {
		return
	}
	_ = r.srv.Shutdown()
	ctx, cancel := contextWithTimeout(5 * time.Second)
	defer cancel()
	_ = r.h.Drain(ctx)
	_ = r.db.Close()
	r.db = nil
}

func (r *relay) addKey(host string) string {
	r.t.Helper()
	key, err := channel.Keys{Claims: r.claims}.Add(host)
	if err != nil {
		r.t.Fatal(err)
	}
	r.hostKeys[host] = key
	return key
}

func randHex(t *testing.T) string {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

func (r *relay) do(method, path, bearer string, body []byte) answer {
	r.t.Helper()
	req, err := http.NewRequest(method, r.origin+path, bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: raw}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

// computerTokens is one claimed computer's secrets.
type computerTokens struct{ owner, phone, host string }

func (r *relay) claim(key string) computerTokens {
	r.t.Helper()
	c := computerTokens{owner: randHex(r.t), phone: randHex(r.t)}
	a := r.do("POST", "/claim", key, claimBody(c.owner, c.phone))
	if a.status != 200 || a.body["claimed"] != true {
		r.t.Fatalf("claim: %d %s", a.status, a.raw)
	}
	c.host, _ = a.body["host"].(string)
	return c
}

func claimBody(owner, phone string) []byte {
	b, _ := json.Marshal(map[string]string{"ownerToken": owner, "phoneToken": phone})
	return b
}

func (r *relay) dial(path string, h http.Header) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	return d.Dial(r.wsBase+path, h)
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

func (r *relay) dialHost(owner string) *websocket.Conn {
	r.t.Helper()
	c, resp, err := r.dial("/host", bearer(owner))
	if err != nil {
		r.t.Fatalf("dial /host: %v (%v)", err, statusOf(resp))
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

// dialPhone opens a phone channel and returns it with the id the computer
// was told in its open message.
func (r *relay) dialPhone(phoneTok string, ctl *websocket.Conn) (*websocket.Conn, string) {
	r.t.Helper()
	c, resp, err := r.dial("/botharness-device/channel", bearer(phoneTok))
	if err != nil {
		r.t.Fatalf("dial phone: %v (%v)", err, statusOf(resp))
	}
	r.t.Cleanup(func() { c.Close() })
	m := readControl(r.t, ctl)
	if m.Type != "open" || len(m.ID) != 32 {
		r.t.Fatalf("want open, got %+v", m)
	}
	return c, m.ID
}

func statusOf(resp *http.Response) any {
	if resp == nil {
		return "no response"
	}
	return resp.StatusCode
}

type ctlMsg struct {
	Type string  `json:"type"`
	ID   string  `json:"id"`
	Data *string `json:"data"`
}

func readControl(t *testing.T, c *websocket.Conn) ctlMsg {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	op, raw, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read control: %v", err)
	}
	if op != websocket.TextMessage {
		t.Fatalf("control frame op %d", op)
	}
	var m ctlMsg
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("control frame %q: %v", raw, err)
	}
	return m
}

func readText(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	op, raw, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if op != websocket.TextMessage {
		t.Fatalf("op %d", op)
	}
	return string(raw)
}

func sendData(t *testing.T, ctl *websocket.Conn, id, data string) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"type": "data", "id": id, "data": data})
	if err := ctl.WriteMessage(websocket.TextMessage, b); err != nil {
		t.Fatal(err)
	}
}

func sendText(t *testing.T, c *websocket.Conn, s string) {
	t.Helper()
	if err := c.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

// closeCode reads until the socket ends and returns the close code it got
// (-1 for an end without a close frame).
func closeCode(t *testing.T, c *websocket.Conn) int {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("socket still open: %v", err)
		}
		return -1
	}
}

func mustStatus(t *testing.T, a answer, status int, errContains string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d: %s", a.status, status, a.raw)
	}
	if a.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("Cache-Control %q", a.header.Get("Cache-Control"))
	}
	if !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
		t.Fatalf("Content-Type %q", a.header.Get("Content-Type"))
	}
	if errContains != "" {
		msg, _ := a.body["error"].(string)
		if !strings.Contains(msg, errContains) {
			t.Fatalf("error %q, want it to contain %q", msg, errContains)
		}
	}
}

func hashOf(s string) store.Hash { return httpx.Hash([]byte(s)) }
