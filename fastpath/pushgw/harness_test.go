package pushgw_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/pushgw"
	"edgerelay/fastpath/server"
	"edgerelay/push/apns"
	"edgerelay/push/fcm"
	"edgerelay/push/pushtest"
	"edgerelay/store"
)

const (
	teamID = "TEAM123456"
	keyID  = "KEY1234567"
	topic  = "com.example.mail"
)

// clock is a settable clock for the 60 s rule, expiry, rate limits and
// the UTC day.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock {
	return &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// logBuffer collects the JSON log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// lines returns the decoded log lines.
func (l *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		out = append(out, m)
	}
	return out
}

// events returns the log lines with event ev.
func (l *logBuffer) events(t *testing.T, ev string) []map[string]any {
	var out []map[string]any
	for _, m := range l.lines(t) {
		if m["event"] == ev {
			out = append(out, m)
		}
	}
	return out
}

// apnsFake is a fake APNs and a client configured for it.
type apnsFake struct {
	*pushtest.FakeAPNs
	client *apns.Client
}

func newAPNsFake(t *testing.T) *apnsFake {
	t.Helper()
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, teamID, keyID, &priv.PublicKey)
	fake.RequireTopic(topic)
	c, err := apns.New(apns.Config{
		KeyFile: pushtest.WriteFile(t, "AuthKey.p8", p8), KeyID: keyID, TeamID: teamID,
		BaseURL: fake.URL(), RootCAs: fake.RootCAs(), Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &apnsFake{FakeAPNs: fake, client: c}
}

// fcmFake is a fake Google (token endpoint and FCM) and a client for it.
type fcmFake struct {
	*pushtest.FakeGoogle
	client *fcm.Client
}

func newFCMFake(t *testing.T) *fcmFake {
	t.Helper()
	g, creds, _ := pushtest.NewGoogleWithAccount(t)
	c, err := fcm.New(fcm.Config{
		CredentialsFile: pushtest.WriteFile(t, "service-account.json", creds),
		BaseURL:         g.URL(), RootCAs: g.RootCAs(), Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &fcmFake{FakeGoogle: g, client: c}
}

// gwOpts configure one gateway under test. The zero value is an APNs
// mount on a fresh store, 10 sends a minute, unmetered, registration off.
type gwOpts struct {
	provider     string
	apns         *apns.Client
	fcm          *fcm.Client
	apnsEnv      string
	registration bool
	rate         int
	budget       int
	metered      bool
	proxyHeader  string
	// db and store: reuse (a second mount on the same store).
	db      *store.DB
	store   *store.PushGateway
	dataDir string
	clock   *clock
	// noStream runs the listener without StreamRequestBody.
	noStream bool
}

// gateway is one mount served by fasthttp on a loopback port, configured
// the way the relay runs it.
type gateway struct {
	t       *testing.T
	url     string
	addr    string
	h       *pushgw.Handler
	db      *store.DB
	store   *store.PushGateway
	keys    *pushgw.Keys
	clock   *clock
	logs    *logBuffer
	srv     *fasthttp.Server
	dataDir string
	ownsDB  bool
}

func startGateway(t *testing.T, o gwOpts) *gateway {
	t.Helper()
	if o.provider == "" {
		o.provider = pushgw.ProviderAPNs
	}
	if o.rate == 0 {
		o.rate = 10
	}
	if o.clock == nil {
		o.clock = newClock()
	}
	g := &gateway{t: t, clock: o.clock, logs: &logBuffer{}, db: o.db, store: o.store, dataDir: o.dataDir}
	if g.db == nil {
		if g.dataDir == "" {
			g.dataDir = t.TempDir()
		}
		db, err := store.Open(g.dataDir, nil)
		if err != nil {
			t.Fatal(err)
		}
		g.db, g.ownsDB = db, true
	}
	if g.store == nil {
		s, err := store.NewPushGateway(g.db, store.PushScopeShared)
		if err != nil {
			t.Fatal(err)
		}
		g.store = s
	}
	log := slog.New(slog.NewJSONHandler(g.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := pushgw.New(pushgw.Config{
		Provider: o.provider, APNs: o.apns, APNsTopic: topic, APNsEnvironment: o.apnsEnv, FCM: o.fcm,
		Store: g.store, Registration: o.registration, RatePerMinute: o.rate,
		DailyBudget: o.budget, Metered: o.metered, TrustedProxyHeader: o.proxyHeader,
		Log: log, Now: g.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	g.h = h
	g.keys = &pushgw.Keys{Store: g.store, Now: g.clock.Now}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.srv = &fasthttp.Server{
		Handler:               h.ServeHTTP,
		ErrorHandler:          h.ServeError,
		MaxRequestBodySize:    pushgw.MaxBodyBytes,
		StreamRequestBody:     !o.noStream,
		NoDefaultServerHeader: true,
		ReadTimeout:           10 * time.Second,
		Logger:                quietLogger{},
	}
	if !o.noStream {
		server.AnswerBeforeBody(g.srv, h.AnswersFromHeaders)
	}
	srv := g.srv
	go func() { _ = srv.Serve(ln) }()
	g.addr = ln.Addr().String()
	g.url = "http://" + g.addr
	t.Cleanup(g.stop)
	return g
}

// stop shuts the listener down and, when the gateway opened it, drains
// the handler and closes the store.
func (g *gateway) stop() {
	if g.srv == nil {
		return
	}
	_ = g.srv.Shutdown()
	g.srv = nil
	if g.ownsDB {
		if err := g.h.Drain(context.Background()); err != nil {
			g.t.Error(err)
		}
		if err := g.db.Close(); err != nil {
			g.t.Error(err)
		}
	}
}

// newKey creates an operator key and returns the key.
func (g *gateway) newKey(label string) (id, key string) {
	g.t.Helper()
	nk, err := g.keys.Create(label, time.Time{})
	if err != nil {
		g.t.Fatal(err)
	}
	return nk.ID, nk.Key
}

// answer is one HTTP answer.
type answer struct {
	status int
	header http.Header
	body   string
}

// rid is the answer's request id.
func (a answer) rid() string { return a.header.Get("X-Request-Id") }

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// do sends one request. body nil sends none; a chunked body has no
// Content-Length.
func (g *gateway) do(method, path string, header map[string]string, body io.Reader) answer {
	g.t.Helper()
	req, err := http.NewRequest(method, g.url+path, body)
	if err != nil {
		g.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

// send posts body to /send with key.
func (g *gateway) send(key, body string) answer {
	g.t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	return g.do("POST", "/send", h, strings.NewReader(body))
}

// chunked hides a reader's length, so net/http sends it chunked.
type chunked struct{ r io.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// expect checks status and that the body is exactly want, where {rid}
// stands for the answer's X-Request-Id; also the headers every answer has.
func expect(t *testing.T, what string, a answer, status int, want string) {
	t.Helper()
	rid := a.rid()
	if !uuidV4.MatchString(rid) {
		t.Errorf("%s: X-Request-Id %q is not a UUID v4", what, rid)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", what, ct)
	}
	want = strings.ReplaceAll(want, "{rid}", rid)
	if a.status != status || a.body != want {
		t.Errorf("%s: %d %s\n want %d %s", what, a.status, a.body, status, want)
	}
}

// errBody is the body of an error answer.
func errBody(msg string) string {
	return fmt.Sprintf(`{"error":%q,"requestId":"{rid}"}`, msg)
}

// gatedAPNs is a minimal APNs endpoint (HTTP/2, TLS) whose answers a test
// releases one by one, to order concurrent deliveries. It checks nothing.
type gatedAPNs struct {
	srv   *httptest.Server
	mu    sync.Mutex
	gates map[string][]chan int // device token -> waiting requests
	hits  chan string
}

func newGatedAPNs(t *testing.T) *gatedAPNs {
	g := &gatedAPNs{gates: map[string][]chan int{}, hits: make(chan string, 64)}
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tok := strings.TrimPrefix(r.URL.Path, "/3/device/")
		ch := make(chan int, 1)
		g.mu.Lock()
		g.gates[tok] = append(g.gates[tok], ch)
		g.mu.Unlock()
		g.hits <- tok
		status := <-ch
		if status != 200 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"reason":"InternalServerError"}`))
			return
		}
		w.WriteHeader(200)
	}))
	g.srv.EnableHTTP2 = true
	g.srv.StartTLS()
	t.Cleanup(g.srv.Close)
	return g
}

// client returns an APNs client pointed at the gated endpoint.
func (g *gatedAPNs) client(t *testing.T) *apns.Client {
	p8, _ := pushtest.NewAPNsKey(t)
	pool := g.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c, err := apns.New(apns.Config{
		KeyFile: pushtest.WriteFile(t, "AuthKey.p8", p8), KeyID: keyID, TeamID: teamID,
		BaseURL: g.srv.URL, RootCAs: pool, Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// waitHit waits for a request to arrive.
func (g *gatedAPNs) waitHit(t *testing.T) string {
	t.Helper()
	select {
	case tok := <-g.hits:
		return tok
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached the gated APNs")
		return ""
	}
}

// release answers the oldest waiting request for tok with status.
func (g *gatedAPNs) release(tok string, status int) {
	g.mu.Lock()
	ch := g.gates[tok][0]
	g.gates[tok] = g.gates[tok][1:]
	g.mu.Unlock()
	ch <- status
}

// quietLogger keeps fasthttp's connection errors (the oversized bodies
// the tests send on purpose) out of the test output.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
