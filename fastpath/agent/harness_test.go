package agent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/agent/agenttest"
	"edgerelay/fastpath/tlsconf"
	"edgerelay/route"
	"edgerelay/store"
)

// relay is one agent relay on a loopback port, served over TLS 1.3 by
// fasthttp like the real binary, with its own Pebble store, signing key
// and development certificate in a temporary data dir.
type relay struct {
	t       testing.TB
	addr    string
	h       *agent.Handler
	keys    agent.Keys
	st      *store.AgentStore
	db      *store.DB
	srv     *fasthttp.Server
	roots   *x509.CertPool
	pub     string
	clock   *clock
	reg     *prometheus.Registry
	plain   bool
	stopped bool
}

type relayOpts struct {
	heartbeatEvery, heartbeatTimeout time.Duration
	helloTimeout                     time.Duration
	clientQueue                      int
	instanceQueue                    int
	maxAttachments                   int
	maxClientMessage                 int
	clientPing                       time.Duration
	// plain serves without TLS, for the allocation tests that count the
	// relay's own allocations (crypto/tls allocates per record read).
	plain bool
	// route replaces the single node's route.
	route route.Agent
}

// clock is a settable clock for pairing expiry.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func startRelay(t testing.TB, o relayOpts) *relay {
	t.Helper()
	dir := t.TempDir()
	paths, err := tlsconf.EnsureDevCert(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := tlsconf.NewReloader(paths.Cert, paths.Key)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(paths.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	block, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots.AddCert(ca)

	db, err := store.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := agent.LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewAgentStore(db)
	clk := &clock{now: time.Now()}
	reg := prometheus.NewRegistry()
	h, err := agent.New(agent.Config{
		Metrics:          agent.NewMetrics(reg),
		Store:            st,
		Key:              key,
		RelayName:        "test-relay",
		HeartbeatEvery:   o.heartbeatEvery,
		HeartbeatTimeout: o.heartbeatTimeout,
		HelloTimeout:     o.helloTimeout,
		ClientQueue:      o.clientQueue,
		InstanceQueue:    o.instanceQueue,
		MaxAttachments:   o.maxAttachments,
		MaxClientMessage: o.maxClientMessage,
		ClientPing:       o.clientPing,
		Now:              clk.Now,
		Route:            o.route,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{
		Handler:            h.ServeHTTP,
		MaxRequestBodySize: 64 << 10,
		ReadTimeout:        10 * time.Second,
		Logger:             quiet{},
	}
	served := tls.NewListener(ln, tlsconf.ServerConfig(rl, true))
	if o.plain {
		served = ln
	}
	go func() { _ = srv.Serve(served) }()
	r := &relay{t: t, addr: ln.Addr().String(), h: h, st: st, db: db, srv: srv, roots: roots, plain: o.plain,
		pub: h.PublicKey(), clock: clk, reg: reg, keys: agent.Keys{Store: st, Handler: h, Now: clk.Now}}
	t.Cleanup(r.stop)
	return r
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func (r *relay) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.h.Drain(ctx); err != nil {
		r.t.Errorf("drain: %v", err)
	}
	_ = r.srv.ShutdownWithContext(ctx)
	_ = r.db.Close()
}

// dial opens a connection to the relay: TLS 1.3, or plain TCP for a
// relay started with plain.
func (r *relay) dial(tb testing.TB) net.Conn {
	tb.Helper()
	var conn net.Conn
	var err error
	if r.plain {
		conn, err = net.Dial("tcp", r.addr)
	} else {
		conn, err = tls.Dial("tcp", r.addr, r.tlsConfig())
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

func (r *relay) tlsConfig() *tls.Config {
	return &tls.Config{RootCAs: r.roots, ServerName: "localhost", MinVersion: tls.VersionTLS13}
}

// counter is the value of the series name{label=value} (one label).
func (r *relay) counter(name, value string) float64 {
	r.t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if value == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == value) {
				if c := m.GetCounter(); c != nil {
					return c.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	r.t.Fatalf("no series %s{%s}", name, value)
	return 0
}

// account makes an account and returns its client token.
func (r *relay) account(name string) string {
	r.t.Helper()
	tok, err := r.keys.AddAccount(name)
	if err != nil {
		r.t.Fatal(err)
	}
	return tok
}

// paired is one paired instance.
type paired struct{ id, token, account string }

// pair mints a pairing key for account and redeems it as a runtime would.
func (r *relay) pair(account, name string) paired {
	r.t.Helper()
	key, err := r.keys.PairKey(account, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	a := r.post("/v1/pair/redeem", map[string]string{"key": key, "instance_name": name})
	if a.status != 200 {
		r.t.Fatalf("redeem: %d %s", a.status, a.raw)
	}
	var resp agent.RedeemResponse
	if err := json.Unmarshal(a.raw, &resp); err != nil {
		r.t.Fatal(err)
	}
	if resp.RelayPublicKey != r.pub {
		r.t.Fatalf("relay_public_key %q, want %q", resp.RelayPublicKey, r.pub)
	}
	return paired{id: resp.InstanceID, token: resp.InstanceToken, account: resp.AccountID}
}

type answer struct {
	status int
	header http.Header
	raw    []byte
}

func (r *relay) httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: r.tlsConfig()}, Timeout: 10 * time.Second}
}

func (r *relay) post(path string, body any) answer {
	r.t.Helper()
	var b []byte
	switch v := body.(type) {
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		b, _ = json.Marshal(v)
	}
	return r.do("POST", path, b, nil)
}

func (r *relay) do(method, path string, body []byte, hdr http.Header) answer {
	r.t.Helper()
	scheme := "https://"
	if r.plain {
		scheme = "http://"
	}
	req, err := http.NewRequest(method, scheme+r.addr+path, bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c := r.httpClient()
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, raw: raw}
}

// errorMessage is the message of an {"error":{"message":…}} answer.
func errorMessage(t *testing.T, a answer) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(a.raw, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("error body %q: %v", a.raw, err)
	}
	return e.Error.Message
}

// connOpts are the connector options for p against r, with test-speed
// heartbeats that stay out of the way (no heartbeat for a minute).
func (r *relay) connOpts(p paired) agenttest.Options {
	return agenttest.Options{
		Addr: r.addr, RootCAs: r.roots, Token: p.token, Instance: p.id, RelayKey: r.pub,
		HeartbeatEvery: time.Minute, HeartbeatTimeout: 10 * time.Second,
	}
}

func (r *relay) connect(p paired) *agenttest.Connector {
	r.t.Helper()
	return r.connectWith(r.connOpts(p))
}

func (r *relay) connectWith(o agenttest.Options) *agenttest.Connector {
	r.t.Helper()
	c, err := agenttest.Dial(context.Background(), o)
	if err != nil {
		r.t.Fatalf("connect: %v", err)
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

// client is one attached WebSocket client.
type client struct {
	t testing.TB
	c *websocket.Conn
}

// attachHeaders dials /v1/attach/<id> with the given headers and
// subprotocols.
func (r *relay) dialAttach(id string, hdr http.Header, protos []string) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{TLSClientConfig: r.tlsConfig(), HandshakeTimeout: 10 * time.Second, Subprotocols: protos}
	return d.Dial("wss://"+r.addr+"/v1/attach/"+id, hdr)
}

func (r *relay) attach(id, token string) *client {
	r.t.Helper()
	c, resp, err := r.dialAttach(id, bearer(token), []string{agent.Subprotocol})
	if err != nil {
		r.t.Fatalf("attach: %v (%v)", err, statusOf(resp))
	}
	if c.Subprotocol() != agent.Subprotocol {
		r.t.Fatalf("subprotocol %q", c.Subprotocol())
	}
	r.t.Cleanup(func() { c.Close() })
	return &client{t: r.t, c: c}
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

func statusOf(resp *http.Response) any {
	if resp == nil {
		return "no response"
	}
	return resp.StatusCode
}

func (c *client) send(s string) {
	c.t.Helper()
	if err := c.c.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next message, failing the test after 10 s.
func (c *client) read() []byte {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	op, msg, err := c.c.ReadMessage()
	if err != nil {
		c.t.Fatalf("client read: %v", err)
	}
	if op != websocket.TextMessage {
		c.t.Fatalf("op %d", op)
	}
	return msg
}

// readFrame decodes the next message.
func (c *client) readFrame() agenttest.Frame {
	c.t.Helper()
	msg := c.read()
	f, err := agenttest.DecodeFrame(msg)
	if err != nil {
		c.t.Fatalf("client got %q: %v", msg, err)
	}
	return f
}

// quiet reports that nothing arrives within d.
func (c *client) quiet(d time.Duration) {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(d))
	_, msg, err := c.c.ReadMessage()
	if err == nil {
		c.t.Fatalf("client got %q, want nothing", msg)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("client: %v, want a timeout", err)
	}
	// A timed-out gorilla-style connection is unusable afterwards; the
	// caller must not read from it again.
}

// closeCode reads until the socket ends and returns its close code (-1 for
// an end without a close frame).
func (c *client) closeCode() int {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		_, _, err := c.c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.t.Fatalf("socket still open: %v", err)
		}
		return -1
	}
}

// next reads the connector's next frame, failing the test after 10 s.
func next(t testing.TB, c *agenttest.Connector) agenttest.Frame {
	t.Helper()
	f, err := c.Next(10 * time.Second)
	if err != nil {
		t.Fatalf("connector: %v", err)
	}
	return f
}

// nothing reports that the connector gets no frame within d.
func nothing(t *testing.T, c *agenttest.Connector, d time.Duration) {
	t.Helper()
	if f, err := c.Next(d); err == nil {
		t.Fatalf("connector got %q, want nothing", f.Raw)
	}
}

// attachedSession attaches a client, has it send a frame, and returns the
// client and the session the instance saw.
func (r *relay) attachedSession(p paired, clientToken string, c *agenttest.Connector) (*client, string) {
	r.t.Helper()
	cl := r.attach(p.id, clientToken)
	cl.send(`{"type":"acp.message","id":"attach-probe","payload":{}}`)
	f := next(r.t, c)
	if f.Type != "acp.message" || f.ID != "attach-probe" || f.Instance != p.id || !strings.HasPrefix(f.Session, "att-") {
		r.t.Fatalf("instance got %q", f.Raw)
	}
	return cl, f.Session
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
