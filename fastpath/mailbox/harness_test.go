package mailbox_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/cors"
	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

// clock is a test clock the relay reads; tests move it to refill buckets
// and expire mailboxes without sleeping.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

type relay struct {
	t     testing.TB
	base  string // http://host:port
	ws    string
	h     *mailbox.Handler
	db    *store.DB
	clock *clock
	srv   *fasthttp.Server
	// stop shuts the relay down and closes its store (once; the test's
	// cleanup calls it too), so that a test can start another on the
	// same data dir.
	stop func()
}

type opts struct {
	apps                             string
	idle, touchEvery                 time.Duration
	maxEnvelope, maxStored, maxBytes int
	maxBehind                        int
	dataDir                          string
	ping, silence                    time.Duration
	ice                              *mailbox.ICEConfig
	push                             mailbox.Pushers
	envelopeCache                    int // bytes; 0 the default, negative none
	metrics                          *mailbox.Metrics
	cors                             *cors.Policy
}

func start(t testing.TB, o opts) *relay {
	t.Helper()
	if o.apps == "" {
		o.apps = "notes;chat:signal,ice"
	}
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	db, err := store.Open(o.dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	apps, err := mailbox.ParseApps(o.apps)
	if err != nil {
		t.Fatal(err)
	}
	ice := mailbox.ICEConfig{Secret: testTURNSecret, URLs: []string{"stun:127.0.0.1:3478", "turn:127.0.0.1:3478?transport=udp"}}
	if o.ice != nil {
		ice = *o.ice
	}
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC).UnixNano())
	mailboxes, err := mailboxlocal.New(mailboxlocal.Config{
		Log:           store.NewEnvelopeLog(db),
		Limits:        store.MailboxLimits{Idle: o.idle, TouchEvery: o.touchEvery, MaxStored: o.maxStored, MaxStoredBytes: o.maxBytes},
		EnvelopeCache: o.envelopeCache,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := mailbox.New(mailbox.Config{
		Store: mailboxes, Apps: apps, MaxEnvelope: o.maxEnvelope,
		MaxBehind: o.maxBehind, PingInterval: o.ping, SilenceTimeout: o.silence, Now: c.now, ICE: ice, Push: o.push, DetachSockets: true,
		Metrics: o.metrics, CORS: o.cors,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h.ServeHTTP, MaxRequestBodySize: 1 << 20, KeepHijackedConns: true}
	go func() { _ = srv.Serve(ln) }()
	r := &relay{t: t, base: "http://" + ln.Addr().String(), ws: "ws://" + ln.Addr().String(), h: h, db: db, clock: c, srv: srv}
	pushCtx, stopPushes := context.WithCancel(context.Background())
	go h.SendPushes(pushCtx)
	r.stop = sync.OnceFunc(func() {
		stopPushes()
		_ = srv.Shutdown()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.Drain(ctx)
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(r.stop)
	return r
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) errCode() string {
	var e struct {
		Error  string `json:"error"`
		Status int    `json:"status"`
	}
	_ = json.Unmarshal(a.body, &e)
	return e.Error
}

func (r *relay) do(method, path, token string, body []byte, hdr ...string) answer {
	r.t.Helper()
	req, err := http.NewRequest(method, r.base+path, bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: raw}
}

// expect asserts a status and, for errors, the exact JSON body and headers.
func expect(t testing.TB, a answer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d (%s)", a.status, status, a.body)
	}
	if code == "" {
		return
	}
	want := `{"error":"` + code + `","status":` + strconv.Itoa(status) + `}`
	if string(a.body) != want {
		t.Fatalf("body %s, want %s", a.body, want)
	}
	if a.header.Get("Content-Type") != "application/json" || a.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("error headers %v", a.header)
	}
}

// envelope builds an envelope with the relay-visible outside right: the
// relay never opens one, so the ciphertext here is filler of n bytes.
func envelope(seq uint64, n int, fill byte) []byte {
	e := make([]byte, 9+n+16)
	e[0] = 0x01
	binary.BigEndian.PutUint64(e[1:9], seq)
	for i := 9; i < len(e); i++ {
		e[i] = fill
	}
	return e
}

const testTURNSecret = "turn-rest-secret"

const (
	id    = "AAECAwQFBgcICQoLDA0ODw"
	token = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
	other = "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
)

func mb(app string) string { return "/v1/" + app + "/mailbox/" + id }

func (r *relay) claim(app string) {
	r.t.Helper()
	expect(r.t, r.do("PUT", mb(app), token, nil), 201, "")
}

func (r *relay) put(app, dir string, seq uint64, env []byte, hdr ...string) answer {
	r.t.Helper()
	return r.do("PUT", mb(app)+"/"+dir+"/"+strconv.FormatUint(seq, 10), token, env, hdr...)
}

func (r *relay) dialWatch(app, dir, query string, hdr http.Header, protos ...string) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, Subprotocols: protos}
	return d.Dial(r.ws+mb(app)+"/"+dir+"/watch"+query, hdr)
}

func (r *relay) watch(app, dir, query string) *websocket.Conn {
	r.t.Helper()
	c, resp, err := r.dialWatch(app, dir, query, http.Header{"Authorization": {"Bearer " + token}}, "zerobyte.v1")
	if err != nil {
		r.t.Fatalf("watch: %v (%v)", err, resp)
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

func nextEnvelope(t *testing.T, c *websocket.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	op, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("watch read: %v", err)
	}
	if op != websocket.BinaryMessage {
		t.Fatalf("watch frame op %d %q", op, b)
	}
	return b
}

func seqOf(env []byte) uint64 { return binary.BigEndian.Uint64(env[1:9]) }
