// Package channel is the benchmark baseline for the private channel relay: the
// protocol's forwarding path (spec/private-channel.md) written the plain, idiomatic
// way with net/http, gorilla/websocket and encoding/json, everything in memory.
//
// It exists so that `make bench` can put a ratio next to our hand-tuned relay, so it
// has to be a fair yardstick rather than a straw man: one reader and one writer
// goroutine per socket, frames handed over through buffered channels, JSON encoded
// and decoded with the standard library, no deliberate copies or locks beyond what
// such code usually has. It leaves out what the benchmarks never exercise: pings,
// DELETE /claim, GET /status, persistence and a few refusal corner cases.
package channel

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

const (
	maxFrame        = 70000             // largest phone frame, and largest data after unescaping
	maxControlFrame = 6*maxFrame + 1024 // a fully \u-escaped maxFrame plus the envelope
	maxPhones       = 32                // phone channels per computer
	maxQueued       = 2 << 20           // bytes waiting in one socket's send queue before it is dropped
	queueLen        = 1024              // frames in one send queue: 32 phones with 32 in flight each
	writeWait       = 10 * time.Second  // a peer that takes longer to accept one frame is gone
	maxClaimBody    = 1 << 10
)

// message is one control-socket message. Data is a pointer so that a data message
// without data (or with null) can be told apart from an empty frame and refused.
type message struct {
	Type string  `json:"type"`
	ID   string  `json:"id"`
	Data *string `json:"data,omitempty"`
}

type relay struct {
	upgrader websocket.Upgrader
	open     atomic.Int64 // sockets held: control sockets and phone channels

	mu     sync.Mutex
	claims map[[32]byte]*claim    // SHA-256 of claim key
	owners map[[32]byte]*computer // SHA-256 of owner token
	phones map[[32]byte]*computer // SHA-256 of phone token
}

type claim struct {
	host string
	used bool
}

// computer is one claimed host; mu guards the fields below it.
type computer struct {
	host string

	mu     sync.Mutex
	online bool  // a control socket is open or being opened
	ctrl   *conn // nil until the control socket's upgrade has finished
	phones map[string]*phone
	// ready is closed when the upgrade of the control socket being opened
	// has finished (or failed): the 101 reaches the computer before ctrl
	// is set, so a phone arriving in that instant waits for it.
	ready chan struct{}
}

type phone struct {
	id   string
	conn *conn
	gone atomic.Bool // removed from its computer: its frames are no longer forwarded
}

// Handler is the baseline relay.
type Handler struct {
	http.Handler
	r *relay
}

// Open is how many sockets the relay holds (control sockets and phone
// channels), for the benchmarks that wait for their sockets to arrive.
func (h *Handler) Open() int { return int(h.r.open.Load()) }

// AddClaimKey lets key claim host from now on, as an operator adds a
// computer to a running relay.
func (h *Handler) AddClaimKey(key, host string) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.r.claims[sha256.Sum256([]byte(key))] = &claim{host: host}
}

// New returns the baseline relay serving the given claim keys (key -> host name).
func New(claimKeys map[string]string) *Handler {
	r := &relay{
		claims: make(map[[32]byte]*claim),
		owners: make(map[[32]byte]*computer),
		phones: make(map[[32]byte]*computer),
	}
	for key, host := range claimKeys {
		r.claims[sha256.Sum256([]byte(key))] = &claim{host: host}
	}
	r.upgrader = websocket.Upgrader{
		// Sockets are authorised by bearer tokens, never by cookies, so a foreign
		// Origin cannot borrow anyone's credentials.
		CheckOrigin: func(*http.Request) bool { return true },
		Error: func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
			writeJSON(w, status, map[string]string{"error": reason.Error()})
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"protocol":  "botharness-private-v1",
			"protocols": []string{"botharness-private-v1", "botharness-private-v2"},
		})
	})
	mux.HandleFunc("POST /claim", r.claim)
	mux.HandleFunc("GET /host", r.host)
	mux.HandleFunc("GET /botharness-device/channel", r.channel)
	return &Handler{Handler: mux, r: r}
}

func (r *relay) claim(w http.ResponseWriter, req *http.Request) {
	key := bearer(req)
	if key == "" {
		writeError(w, http.StatusUnauthorized, "missing bearer token")
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxClaimBody))
	if maxErr := (*http.MaxBytesError)(nil); errors.As(err, &maxErr) {
		writeError(w, http.StatusRequestEntityTooLarge, "body over 1 KiB")
		return
	}
	var body struct {
		OwnerToken string `json:"ownerToken"`
		PhoneToken string `json:"phoneToken"`
	}
	malformed := err != nil || json.Unmarshal(raw, &body) != nil

	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.claims[sha256.Sum256([]byte(key))]
	ownerHash, phoneHash := sha256.Sum256([]byte(body.OwnerToken)), sha256.Sum256([]byte(body.PhoneToken))
	switch {
	case c == nil:
		writeError(w, http.StatusForbidden, "unknown claim key")
	case c.used:
		writeError(w, http.StatusConflict, "claim key already used")
	case malformed || !isHex(body.OwnerToken, 64) || !isHex(body.PhoneToken, 64) ||
		ownerHash == phoneHash || r.inUse(ownerHash) || r.inUse(phoneHash):
		writeError(w, http.StatusBadRequest, "malformed or reused tokens")
	default:
		c.used = true
		comp := &computer{host: c.host, phones: make(map[string]*phone)}
		r.owners[ownerHash], r.phones[phoneHash] = comp, comp
		writeJSON(w, http.StatusOK, map[string]any{"claimed": true, "host": c.host})
	}
}

func (r *relay) inUse(h [32]byte) bool { return r.owners[h] != nil || r.phones[h] != nil }

// lookup finds the computer of a token. Looking up the token's SHA-256 keeps the
// secret itself out of memory and makes the comparison independent of its bytes.
func (r *relay) lookup(tokens map[[32]byte]*computer, token string) *computer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return tokens[sha256.Sum256([]byte(token))]
}

// host serves a computer's control socket for as long as it stays open.
func (r *relay) host(w http.ResponseWriter, req *http.Request) {
	comp := r.lookup(r.owners, bearer(req))
	if comp == nil {
		writeError(w, http.StatusForbidden, "unknown owner token")
		return
	}
	comp.mu.Lock()
	busy := comp.online
	comp.online = true // reserved before the upgrade so that two racing sockets cannot both win
	ready := make(chan struct{})
	if !busy {
		comp.ready = ready
	}
	comp.mu.Unlock()
	if busy {
		writeError(w, http.StatusForbidden, "control socket already open")
		return
	}
	ws, err := r.upgrader.Upgrade(w, req, nil)
	if err != nil {
		comp.mu.Lock()
		comp.online = false
		comp.mu.Unlock()
		close(ready)
		return
	}
	ws.SetReadLimit(maxControlFrame)
	ctrl := newConn(ws)
	r.open.Add(1)
	defer r.open.Add(-1)
	comp.mu.Lock()
	comp.ctrl = ctrl
	comp.mu.Unlock()
	close(ready)

	comp.readControl(ctrl)

	comp.mu.Lock()
	phones := comp.phones
	comp.phones, comp.ctrl, comp.online = make(map[string]*phone), nil, false
	comp.mu.Unlock()
	for _, p := range phones {
		p.gone.Store(true)
		p.conn.closeAfterQueue(websocket.CloseGoingAway)
	}
	ctrl.close(0)
}

// readControl forwards the computer's messages to its phones until the socket ends.
func (comp *computer) readControl(ctrl *conn) {
	for {
		kind, raw, err := ctrl.ws.ReadMessage()
		if err != nil {
			return
		}
		var m message
		if kind != websocket.TextMessage || json.Unmarshal(raw, &m) != nil || !isHex(m.ID, 32) {
			ctrl.close(websocket.ClosePolicyViolation)
			return
		}
		switch {
		case m.Type == "data" && m.Data != nil && len(*m.Data) <= maxFrame:
			comp.mu.Lock()
			p := comp.phones[m.ID]
			comp.mu.Unlock()
			if p != nil {
				p.conn.enqueue([]byte(*m.Data))
			}
		case m.Type == "close":
			if p := comp.remove(m.ID); p != nil {
				p.conn.closeAfterQueue(websocket.CloseNormalClosure)
			}
		default:
			ctrl.close(websocket.ClosePolicyViolation)
			return
		}
	}
}

func (comp *computer) remove(id string) *phone {
	comp.mu.Lock()
	defer comp.mu.Unlock()
	p := comp.phones[id]
	if p != nil {
		delete(comp.phones, id)
		p.gone.Store(true)
	}
	return p
}

// channel serves one phone channel, multiplexed onto its computer's control socket.
func (r *relay) channel(w http.ResponseWriter, req *http.Request) {
	token := req.Header.Get("X-BotHarness-Admission")
	if token == "" {
		token = bearer(req)
	}
	comp := r.lookup(r.phones, token)
	if comp == nil {
		writeError(w, http.StatusForbidden, "unknown phone token")
		return
	}
	comp.mu.Lock()
	ready, online := comp.ready, comp.online
	comp.mu.Unlock()
	if online && ready != nil {
		<-ready
	}
	comp.mu.Lock()
	ctrl, full := comp.ctrl, len(comp.phones) >= maxPhones
	comp.mu.Unlock()
	if ctrl == nil || full {
		writeError(w, http.StatusForbidden, "computer offline or at its phone limit")
		return
	}
	ws, err := r.upgrader.Upgrade(w, req, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(maxFrame) // gorilla answers a larger frame with 1009 by itself
	p := &phone{id: newID(), conn: newConn(ws)}

	// The checks above ran before the upgrade; repeat them now that it is done.
	comp.mu.Lock()
	if comp.ctrl != ctrl || len(comp.phones) >= maxPhones {
		comp.mu.Unlock()
		p.conn.close(websocket.CloseTryAgainLater)
		return
	}
	comp.phones[p.id] = p
	ctrl.enqueue(encode(message{Type: "open", ID: p.id})) // under the lock: open precedes any close
	comp.mu.Unlock()
	r.open.Add(1)
	defer r.open.Add(-1)

	code := 0
	for {
		kind, frame, err := ws.ReadMessage()
		if err != nil {
			break
		}
		if kind != websocket.TextMessage {
			code = websocket.CloseUnsupportedData
			break
		}
		if !p.gone.Load() {
			data := string(frame)
			ctrl.enqueue(encode(message{Type: "data", ID: p.id, Data: &data}))
		}
	}
	if comp.remove(p.id) != nil {
		ctrl.enqueue(encode(message{Type: "close", ID: p.id}))
	}
	p.conn.close(code)
}

// conn is a WebSocket with its own writer goroutine. Gorilla allows one writer at a
// time, and a slow peer must not stall whoever forwards to it, so frames are queued.
type conn struct {
	ws     *websocket.Conn
	send   chan outgoing
	queued atomic.Int64 // bytes in send
	done   chan struct{}
	once   sync.Once
}

// outgoing is a text frame, or, when closeCode is set, a close frame that goes out
// after everything queued before it.
type outgoing struct {
	frame     []byte
	closeCode int
}

func newConn(ws *websocket.Conn) *conn {
	c := &conn{ws: ws, send: make(chan outgoing, queueLen), done: make(chan struct{})}
	go c.writeLoop()
	return c
}

// enqueue queues a frame without blocking; a socket whose queue overflows is dropped.
func (c *conn) enqueue(frame []byte) { c.push(outgoing{frame: frame}) }

func (c *conn) closeAfterQueue(code int) { c.push(outgoing{closeCode: code}) }

func (c *conn) push(o outgoing) {
	if c.queued.Add(int64(len(o.frame))) > maxQueued {
		c.close(websocket.ClosePolicyViolation)
		return
	}
	select {
	case c.send <- o:
	case <-c.done:
	default:
		c.close(websocket.ClosePolicyViolation)
	}
}

func (c *conn) writeLoop() {
	for {
		select {
		case o := <-c.send:
			if o.closeCode != 0 {
				c.close(o.closeCode)
				return
			}
			c.queued.Add(-int64(len(o.frame)))
			_ = c.ws.SetWriteDeadline(time.Now().Add(writeWait))
			if err := c.ws.WriteMessage(websocket.TextMessage, o.frame); err != nil {
				c.close(0)
				return
			}
		case <-c.done:
			return
		}
	}
}

// close sends a close frame with code (none when 0) and drops the connection; only
// the first call counts. Closing the network connection also ends the reader.
func (c *conn) close(code int) {
	c.once.Do(func() {
		close(c.done)
		if code != 0 {
			_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""),
				time.Now().Add(time.Second))
		}
		_ = c.ws.Close()
	})
}

// encode marshals a control message. HTML escaping is off because the spec asks for
// exactly the escaping JSON requires; the encoder's trailing newline is dropped.
func encode(m message) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m) // cannot fail: the message holds only strings
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails since Go 1.24
	return hex.EncodeToString(b[:])
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func bearer(req *http.Request) string {
	token, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(token)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
