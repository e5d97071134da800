// Package signal is the benchmark baseline for the mailbox relay's signal
// rendezvous (spec/mailbox.md, "Signal"): the same path written the plain,
// idiomatic way on net/http and gorilla/websocket, so that `make bench`
// can put a ratio next to fastpath/mailbox's signal forwarding.
//
// It has to be a fair yardstick, not a straw man. What such code usually
// does, it does: it splits the path with strings.Split, checks the id and
// the bearer with regular expressions, keeps the mailboxes in a map behind
// one mutex, rate-limits with golang.org/x/time/rate (the spec's buckets:
// 20 sockets and 1 per 5 s per mailbox, 400 frames and 50/s per side),
// and gives each socket a reader goroutine and a writer goroutine joined
// by a buffered channel, so that a slow peer never stalls the side that
// forwards to it. Frames are handed over as gorilla's ReadMessage returns
// them (a fresh slice per message), never copied again.
//
// What it leaves out, the benchmarks never exercise: claims are kept in
// memory rather than in the store (the signal path reads nothing of the
// store once a socket is open), there is no erase or expiry, and a claim
// is never refused by a rate limit.
package signal

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"
)

// Config wires a Handler.
type Config struct {
	// Apps are the app names served under /v1/<app>/, each with the
	// signal extension on.
	Apps []string
	// Now is the clock the rate limiters read (time.Now by default), as
	// ours reads its Config.Now.
	Now func() time.Time
	// PingInterval of the sockets (30 s by default); a socket silent for
	// 2.5 intervals is closed, as the spec's 30 s and 75 s say.
	PingInterval time.Duration
}

// The spec's limits.
const (
	maxFrame  = 64 << 10
	sendQueue = 256              // messages waiting for one socket's writer
	writeWait = 10 * time.Second // a peer that takes longer to accept one message is gone
	protocol  = "zerobyte.v1"
)

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9_-]{16,64}$`)
	bearerPattern = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]{16,256}$`)
)

// Handler serves PUT /v1/<app>/mailbox/<id> (the claim) and
// GET /v1/<app>/mailbox/<id>/signal/<primary|companion>.
type Handler struct {
	apps     map[string]bool
	now      func() time.Time
	ping     time.Duration
	upgrader websocket.Upgrader

	mu        sync.Mutex
	mailboxes map[string]*mailbox // "<app>/<id>"
	open      map[*peer]bool      // every socket, for CloseSockets
	running   sync.WaitGroup      // the sockets' goroutines
}

// mailbox is one claimed mailbox; Handler.mu guards sides.
type mailbox struct {
	token   [32]byte // SHA-256 of the bearer
	sides   [2]*peer // primary, companion
	sockets *rate.Limiter
	frames  [2]*rate.Limiter
}

// peer is one signal socket: its writer goroutine drains send.
type peer struct {
	conn *websocket.Conn
	send chan outgoing
	once sync.Once
	done chan struct{}
}

type outgoing struct {
	op   int
	data []byte
}

// New returns a Handler.
func New(cfg Config) *Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 30 * time.Second
	}
	apps := make(map[string]bool)
	for _, a := range cfg.Apps {
		apps[a] = true
	}
	return &Handler{
		apps:      apps,
		now:       cfg.Now,
		ping:      cfg.PingInterval,
		upgrader:  websocket.Upgrader{Subprotocols: []string{protocol}},
		mailboxes: make(map[string]*mailbox),
		open:      make(map[*peer]bool),
	}
}

type apiError struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
}

func writeError(w http.ResponseWriter, status int, code string) {
	body, _ := json.Marshal(apiError{Error: code, Status: status})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ServeHTTP routes /v1/<app>/mailbox/<id>[/signal/<side>].
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(r.URL.Path, "/")
	if (len(parts) != 5 && len(parts) != 7) || parts[0] != "" || parts[1] != "v1" || parts[3] != "mailbox" || !h.apps[parts[2]] {
		writeError(w, http.StatusNotFound, "not_found")
		return
	}
	if !idPattern.MatchString(parts[4]) {
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	}
	name := parts[2] + "/" + parts[4]
	socket := len(parts) == 7
	token := bearer(r, socket)
	if !bearerPattern.MatchString(token) {
		writeError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	hash := sha256.Sum256([]byte(token))
	switch {
	case !socket && r.Method == http.MethodPut:
		h.claim(w, name, hash)
	case socket && r.Method == http.MethodGet && parts[5] == "signal" && (parts[6] == "primary" || parts[6] == "companion"):
		side := 0
		if parts[6] == "companion" {
			side = 1
		}
		h.signal(w, r, name, hash, side)
	default:
		writeError(w, http.StatusNotFound, "not_found")
	}
}

// bearer reads the token from Authorization, or for a socket from the
// zerobyte.bearer.<token> subprotocol that browsers must use.
func bearer(r *http.Request, socket bool) string {
	auth := r.Header.Get("Authorization")
	if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		return strings.TrimSpace(auth[7:])
	}
	if socket {
		for _, p := range websocket.Subprotocols(r) {
			if t, ok := strings.CutPrefix(p, "zerobyte.bearer."); ok {
				return t
			}
		}
	}
	return ""
}

// claim is PUT /v1/<app>/mailbox/<id>: 201 new, 204 again by the holder,
// 409 taken.
func (h *Handler) claim(w http.ResponseWriter, name string, hash [32]byte) {
	h.mu.Lock()
	m := h.mailboxes[name]
	switch {
	case m == nil:
		h.mailboxes[name] = &mailbox{
			token:   hash,
			sockets: rate.NewLimiter(rate.Every(5*time.Second), 20),
			frames:  [2]*rate.Limiter{rate.NewLimiter(50, 400), rate.NewLimiter(50, 400)},
		}
		h.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	case subtle.ConstantTimeCompare(m.token[:], hash[:]) != 1:
		h.mu.Unlock()
		writeError(w, http.StatusConflict, "taken")
	default:
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

// signal is GET …/signal/<primary|companion>.
func (h *Handler) signal(w http.ResponseWriter, r *http.Request, name string, hash [32]byte, side int) {
	if !websocket.IsWebSocketUpgrade(r) {
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	}
	h.mu.Lock()
	m := h.mailboxes[name]
	h.mu.Unlock()
	switch {
	case m == nil:
		writeError(w, http.StatusNotFound, "not_found")
		return
	case subtle.ConstantTimeCompare(m.token[:], hash[:]) != 1:
		writeError(w, http.StatusForbidden, "forbidden")
		return
	case !m.sockets.AllowN(h.now(), 1):
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "rate_limited")
		return
	}
	// Counted before the 101 goes out, so that a CloseSockets that starts
	// once a client holds its socket waits for it.
	h.running.Add(2)
	conn, err := h.upgrader.Upgrade(w, r, nil)
	if err != nil {
		h.running.Add(-2)
		return // the upgrader has answered
	}
	conn.SetReadLimit(maxFrame)
	p := &peer{conn: conn, send: make(chan outgoing, sendQueue), done: make(chan struct{})}
	go func() {
		defer h.running.Done()
		p.writeLoop(h.ping)
	}()
	defer h.running.Done()

	h.mu.Lock()
	h.open[p] = true
	old := m.sides[side]
	m.sides[side] = p
	other := m.sides[1-side]
	h.mu.Unlock()
	if old != nil {
		old.close(4000, "replaced")
	}
	if other != nil {
		other.queue(websocket.TextMessage, []byte("peer 1"))
		p.queue(websocket.TextMessage, []byte("peer 1"))
	}

	h.read(p, m, side)

	h.mu.Lock()
	delete(h.open, p)
	still := m.sides[side] == p
	if still {
		m.sides[side] = nil
	}
	other = m.sides[1-side]
	h.mu.Unlock()
	if still && other != nil {
		other.queue(websocket.TextMessage, []byte("peer 0"))
	}
	p.close(websocket.CloseNormalClosure, "")
}

// read forwards binary frames to the other side until the socket ends.
func (h *Handler) read(p *peer, m *mailbox, side int) {
	silence := h.ping * 5 / 2
	_ = p.conn.SetReadDeadline(time.Now().Add(silence))
	p.conn.SetPongHandler(func(string) error { return p.conn.SetReadDeadline(time.Now().Add(silence)) })
	for {
		op, msg, err := p.conn.ReadMessage()
		if err != nil {
			return // gorilla has answered a close or a too-large frame
		}
		_ = p.conn.SetReadDeadline(time.Now().Add(silence))
		switch {
		case op == websocket.BinaryMessage:
			if !m.frames[side].AllowN(h.now(), 1) {
				p.close(websocket.ClosePolicyViolation, "signal frames too fast")
				return
			}
			h.mu.Lock()
			other := m.sides[1-side]
			h.mu.Unlock()
			if other != nil {
				other.queue(websocket.BinaryMessage, msg)
			}
		case string(msg) == "ping":
			p.queue(websocket.TextMessage, []byte("pong"))
		default:
			p.close(websocket.CloseUnsupportedData, "only binary frames and text ping are accepted")
			return
		}
	}
}

// queue hands a message to the writer without blocking; a socket whose
// queue is full is too slow and is closed with 1013.
func (p *peer) queue(op int, data []byte) {
	select {
	case <-p.done:
	case p.send <- outgoing{op: op, data: data}:
	default:
		p.close(websocket.CloseTryAgainLater, "send queue full")
	}
}

// writeLoop writes queued messages and pings until the socket closes.
func (p *peer) writeLoop(ping time.Duration) {
	t := time.NewTicker(ping)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case m := <-p.send:
			_ = p.conn.SetWriteDeadline(time.Now().Add(writeWait))
			if err := p.conn.WriteMessage(m.op, m.data); err != nil {
				p.close(0, "")
				return
			}
		case <-t.C:
			if err := p.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
				p.close(0, "")
				return
			}
		}
	}
}

// close sends a close frame with code (none when 0) and drops the
// connection, once; the reader then fails and cleans up.
func (p *peer) close(code int, reason string) {
	p.once.Do(func() {
		if code != 0 {
			_ = p.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
		}
		close(p.done)
		_ = p.conn.Close()
	})
}

// CloseSockets closes every open socket with 1001 and waits for their
// goroutines, for a clean shutdown (http.Server.Shutdown does not track
// hijacked connections).
func (h *Handler) CloseSockets() {
	h.mu.Lock()
	peers := make([]*peer, 0, len(h.open))
	for p := range h.open {
		peers = append(peers, p)
	}
	h.mu.Unlock()
	for _, p := range peers {
		p.close(websocket.CloseGoingAway, "server shutting down")
	}
	h.running.Wait()
}
