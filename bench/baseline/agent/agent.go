// Package agent is the benchmark baseline for the agent relay: the
// protocol's routing path (spec/agent-relay.md) written the plain, idiomatic
// way with net/http, gorilla/websocket and encoding/json, everything in
// memory. It is what the reference relay does: every line is decoded into
// the envelope struct and encoded again.
//
// It exists so that `make bench` can put a ratio next to our relay, so it
// has to be a fair yardstick rather than a straw man: one reader and one
// writer goroutine per connection, frames handed over through buffered
// channels, the link's writes buffered and flushed when its queue runs dry,
// the standard library's JSON. It leaves out what the benchmarks never
// exercise: pairing, revocation, the relay's own heartbeat probes, and
// several refusal corner cases. Serve it over TLS 1.3 like ours.
package agent

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

const (
	maxLine        = 16 << 20         // the spec's line limit
	maxAttachments = 64               // per instance
	maxClientQueue = 4 << 20          // bytes queued for one client before it is dropped
	clientQueueLen = 4096             // frames queued for one client
	linkQueueLen   = 4096             // frames queued for one link
	writeWait      = 20 * time.Second // a peer that takes longer to accept one write is gone
	signingDomain  = "contenox-relay/welcome/v1"
)

// Frame is the envelope, as librelay declares it.
type Frame struct {
	Type     string          `json:"type"`
	Instance string          `json:"instance,omitempty"`
	Session  string          `json:"session,omitempty"`
	ID       string          `json:"id,omitempty"`
	Re       string          `json:"re,omitempty"`
	Seq      uint64          `json:"seq,omitempty"`
	Trace    string          `json:"trace,omitempty"`
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// Credentials are the baseline's tokens, fixed at start.
type Credentials struct {
	// Instances maps instance token -> instance id.
	Instances map[string]string
	// Clients maps client token -> the instance ids it may attach to.
	Clients map[string][]string
}

type relay struct {
	key      ed25519.PrivateKey
	upgrader websocket.Upgrader

	mu        sync.Mutex
	instTok   map[[32]byte]string
	clientTok map[[32]byte]map[string]bool
	instances map[string]*instance
}

type instance struct {
	mu      sync.RWMutex
	link    *link
	clients map[string]*client
}

type link struct {
	conn net.Conn
	send chan []byte
	done chan struct{}
	once sync.Once
}

type client struct {
	ws     *websocket.Conn
	send   chan []byte
	queued atomic.Int64
	done   chan struct{}
	once   sync.Once
}

// New returns the baseline relay with the given credentials, signing
// welcomes with key.
func New(key ed25519.PrivateKey, creds Credentials) http.Handler {
	r := &relay{
		key:       key,
		instTok:   make(map[[32]byte]string),
		clientTok: make(map[[32]byte]map[string]bool),
		instances: make(map[string]*instance),
	}
	for tok, id := range creds.Instances {
		r.instTok[sha256.Sum256([]byte(tok))] = id
	}
	for tok, ids := range creds.Clients {
		m := make(map[string]bool)
		for _, id := range ids {
			m[id] = true
		}
		r.clientTok[sha256.Sum256([]byte(tok))] = m
	}
	r.upgrader = websocket.Upgrader{
		Subprotocols: []string{"contenox-relay.v1"},
		// Bearer tokens authorise, never cookies.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/connect", r.connect)
	mux.HandleFunc("GET /v1/attach/{id}", r.attach)
	return mux
}

func (r *relay) instance(id string) *instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.instances[id]
	if in == nil {
		in = &instance{clients: make(map[string]*client)}
		r.instances[id] = in
	}
	return in
}

func bearer(req *http.Request) string {
	h := req.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func (r *relay) connect(w http.ResponseWriter, req *http.Request) {
	if !strings.EqualFold(req.Header.Get("Upgrade"), "contenox-relay/1") {
		http.Error(w, `{"error":{"message":"upgrade required"}}`, http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	id, ok := r.instTok[sha256.Sum256([]byte(bearer(req)))]
	r.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":{"message":"unknown token"}}`, http.StatusForbidden)
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})
	if _, err := conn.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: contenox-relay/1\r\nConnection: Upgrade\r\n\r\n")); err != nil {
		return
	}
	sc := bufio.NewScanner(rw.Reader)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	if !sc.Scan() {
		return
	}
	welcome, ok := r.welcome(id, sc.Bytes())
	if !ok {
		return
	}
	// The welcome is queued first and the link published before its
	// writer starts, so that it goes out first and nothing a client sends
	// after seeing the instance online finds it offline.
	l := &link{conn: conn, send: make(chan []byte, linkQueueLen), done: make(chan struct{})}
	l.send <- welcome
	in := r.instance(id)
	in.mu.Lock()
	old := in.link
	in.link = l
	in.mu.Unlock()
	go l.writeLoop()
	if old != nil {
		old.close()
	}

	for sc.Scan() {
		var f Frame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil || f.Type == "" {
			continue
		}
		if strings.HasPrefix(f.Type, "relay.") {
			if f.Type == "relay.heartbeat" && f.ID != "" {
				l.enqueue(encode(Frame{Type: "relay.ack", Instance: f.Instance, Re: f.ID}))
			}
			continue
		}
		if f.Session == "" || f.Instance != id {
			continue
		}
		in.mu.RLock()
		c := in.clients[f.Session]
		in.mu.RUnlock()
		if c != nil {
			// The reference relay forwards what it decoded, encoded again.
			c.enqueue(encode(f))
		}
	}
	in.mu.Lock()
	if in.link == l {
		in.link = nil
	}
	in.mu.Unlock()
	l.close()
}

// welcome checks the hello and returns the signed welcome.
func (r *relay) welcome(id string, line []byte) ([]byte, bool) {
	var hello Frame
	if json.Unmarshal(line, &hello) != nil || hello.Type != "relay.hello" {
		return nil, false
	}
	var p struct {
		ProtocolVersion int    `json:"protocol_version"`
		Instance        string `json:"instance"`
		Nonce           []byte `json:"nonce"`
	}
	if json.Unmarshal(hello.Payload, &p) != nil || p.Instance != id || p.ProtocolVersion < 1 || len(p.Nonce) > 64 {
		return nil, false
	}
	out := struct {
		ProtocolVersion int    `json:"protocol_version"`
		Relay           string `json:"relay"`
		Sig             []byte `json:"sig,omitempty"`
	}{ProtocolVersion: 1, Relay: "baseline"}
	if len(p.Nonce) > 0 {
		input := signingDomain + "\x00" + base64.RawURLEncoding.EncodeToString(p.Nonce) + "\x00" +
			strconv.Itoa(out.ProtocolVersion) + "\x00" + id
		out.Sig = ed25519.Sign(r.key, []byte(input))
	}
	payload, _ := json.Marshal(out)
	return encode(Frame{Type: "relay.welcome", Instance: id, Re: hello.ID, Payload: payload}), true
}

func (l *link) enqueue(line []byte) {
	select {
	case l.send <- line:
	case <-l.done:
	}
}

func (l *link) writeLoop() {
	w := bufio.NewWriterSize(l.conn, 64<<10)
	for {
		select {
		case line := <-l.send:
			_ = l.conn.SetWriteDeadline(time.Now().Add(writeWait))
			_, _ = w.Write(line)
			if err := w.WriteByte('\n'); err != nil {
				l.close()
				return
			}
			if len(l.send) == 0 {
				if err := w.Flush(); err != nil {
					l.close()
					return
				}
			}
		case <-l.done:
			return
		}
	}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.conn.Close()
	})
}

func (r *relay) attach(w http.ResponseWriter, req *http.Request) {
	tok := bearer(req)
	if tok == "" {
		for _, p := range websocket.Subprotocols(req) {
			if strings.HasPrefix(p, "bearer.") {
				tok = strings.TrimPrefix(p, "bearer.")
			}
		}
	}
	id := req.PathValue("id")
	r.mu.Lock()
	allowed, known := r.clientTok[sha256.Sum256([]byte(tok))]
	r.mu.Unlock()
	if !known {
		http.Error(w, `{"error":{"message":"unknown token"}}`, http.StatusUnauthorized)
		return
	}
	if !allowed[id] {
		http.Error(w, `{"error":{"message":"not your instance"}}`, http.StatusForbidden)
		return
	}
	in := r.instance(id)
	in.mu.RLock()
	full := len(in.clients) >= maxAttachments
	in.mu.RUnlock()
	if full {
		http.Error(w, `{"error":{"message":"too many attachments"}}`, http.StatusTooManyRequests)
		return
	}
	ws, err := r.upgrader.Upgrade(w, req, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(maxLine)
	c := &client{ws: ws, send: make(chan []byte, clientQueueLen), done: make(chan struct{})}
	session := newID()
	in.mu.Lock()
	in.clients[session] = c
	in.mu.Unlock()
	go c.writeLoop()

	for {
		kind, msg, err := ws.ReadMessage()
		if err != nil {
			break
		}
		var f Frame
		if kind != websocket.TextMessage || bytes.ContainsAny(msg, "\r\n") || json.Unmarshal(msg, &f) != nil || f.Type == "" {
			continue
		}
		if strings.HasPrefix(f.Type, "relay.") {
			if f.Type == "relay.heartbeat" && f.ID != "" {
				c.enqueue(encode(Frame{Type: "relay.ack", Instance: id, Session: session, Re: f.ID}))
			}
			continue
		}
		f.Instance, f.Session = id, session
		in.mu.RLock()
		l := in.link
		in.mu.RUnlock()
		if l == nil {
			if f.ID != "" {
				payload, _ := json.Marshal(map[string]string{"code": "unknown_instance", "message": "the instance is offline"})
				c.enqueue(encode(Frame{Type: "relay.error", Instance: id, Session: session, Re: f.ID, Payload: payload}))
			}
			continue
		}
		l.enqueue(encode(f))
	}
	in.mu.Lock()
	delete(in.clients, session)
	l := in.link
	in.mu.Unlock()
	if l != nil {
		l.enqueue(encode(Frame{Type: "acp.detach", Instance: id, Session: session}))
	}
	c.close(0)
}

// enqueue queues a frame without blocking; a client whose queue overflows is
// dropped with 1013.
func (c *client) enqueue(frame []byte) {
	if c.queued.Add(int64(len(frame))) > maxClientQueue {
		c.close(websocket.CloseTryAgainLater)
		return
	}
	select {
	case c.send <- frame:
	case <-c.done:
	default:
		c.close(websocket.CloseTryAgainLater)
	}
}

func (c *client) writeLoop() {
	for {
		select {
		case frame := <-c.send:
			c.queued.Add(-int64(len(frame)))
			_ = c.ws.SetWriteDeadline(time.Now().Add(writeWait))
			if err := c.ws.WriteMessage(websocket.TextMessage, frame); err != nil {
				c.close(0)
				return
			}
		case <-c.done:
			return
		}
	}
}

func (c *client) close(code int) {
	c.once.Do(func() {
		close(c.done)
		if code != 0 {
			_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(time.Second))
		}
		_ = c.ws.Close()
	})
}

// encode marshals a frame. HTML escaping is off, as a relay has no reason
// to escape <, > and &.
func encode(f Frame) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(f)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "att-" + hex.EncodeToString(b[:])
}
