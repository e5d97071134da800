// Package mailbox is the benchmark baseline for the mailbox relay
// (spec/mailbox.md): the same endpoints written the plain, idiomatic way on
// net/http, gorilla/websocket and encoding/json, over the same
// store.EnvelopeLog as ours, so that `make bench` can put a ratio next to
// the hand-tuned handler in fastpath/mailbox.
//
// It has to be a fair yardstick, not a straw man. What such code usually
// does, it does: it splits the path with strings.Split, checks parameters
// with regular expressions, reads the mailbox record from the store on
// every request, keeps each direction's count in a map behind one mutex,
// rate-limits with golang.org/x/time/rate, and gives each watch socket a
// reader and a writer goroutine joined by a buffered channel. What it
// leaves out, the benchmarks never exercise: erase, prune, batch fetches,
// idle expiry, and the push, signal and ice extensions.
package mailbox

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"edgerelay/store"
)

// Config wires a Handler.
type Config struct {
	Store *store.EnvelopeLog
	// Apps are the app names served under /v1/<app>/.
	Apps []string
	// Now is the clock (time.Now by default): the rate limiters and the
	// mailboxes' last-active times read it, as ours does.
	Now func() time.Time
	// PingInterval of watch sockets (30 s by default); a socket silent
	// for 2.5 intervals is closed, as the spec's 30 s and 75 s say.
	PingInterval time.Duration
}

// The spec's limits.
const (
	maxEnvelope    = 65536
	maxStored      = 4096
	maxStoredBytes = 32 << 20
	maxWatchers    = 8
	sendQueue      = 16               // messages waiting for one watch socket's writer
	writeWait      = 10 * time.Second // a peer that takes longer to accept one message is gone
	watchProtocol  = "zerobyte.v1"
)

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9_-]{16,64}$`)
	bearerPattern = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]{16,256}$`)
	seqPattern    = regexp.MustCompile(`^(0|[1-9][0-9]{0,19})$`)
)

// Handler serves the mailbox endpoints the benchmarks use.
type Handler struct {
	log      *store.EnvelopeLog
	apps     map[string]bool
	now      func() time.Time
	ping     time.Duration
	upgrader websocket.Upgrader

	mu          sync.Mutex
	dirs        map[string]*direction // "<app>/<id>/<p|c>"
	fetches     map[string]*rate.Limiter
	envelopes   map[string]*rate.Limiter
	connections map[string]*rate.Limiter

	// running counts the watch sockets' goroutines, so that CloseSockets
	// can wait for them to stop using the store.
	running sync.WaitGroup
}

// direction is one direction's cached state; Handler.mu guards it, and
// writing serializes its writes.
type direction struct {
	loaded    bool
	state     store.DirectionState
	writing   sync.Mutex
	watchers  map[*watcher]bool
	upgrading int // watch sockets admitted and not yet upgraded
}

// watcher is one watch socket: its writer goroutine drains send.
type watcher struct {
	conn *websocket.Conn
	send chan outgoing
	once sync.Once
	done chan struct{}
}

type outgoing struct {
	op   int
	seq  uint64
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
		log:         cfg.Store,
		apps:        apps,
		now:         cfg.Now,
		ping:        cfg.PingInterval,
		upgrader:    websocket.Upgrader{Subprotocols: []string{watchProtocol}},
		dirs:        make(map[string]*direction),
		fetches:     make(map[string]*rate.Limiter),
		envelopes:   make(map[string]*rate.Limiter),
		connections: make(map[string]*rate.Limiter),
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

// ServeHTTP routes /v1/<app>/mailbox/<id>[/<dir>[/<seq>|/watch]].
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(r.URL.Path, "/")
	if len(parts) < 5 || len(parts) > 7 || parts[0] != "" || parts[1] != "v1" || parts[3] != "mailbox" || !h.apps[parts[2]] {
		writeError(w, http.StatusNotFound, "not_found")
		return
	}
	if !idPattern.MatchString(parts[4]) {
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	}
	name := parts[2] + "/" + parts[4]
	var dir byte
	if len(parts) > 5 {
		switch parts[5] {
		case "p2c":
			dir = store.DirP2C
		case "c2p":
			dir = store.DirC2P
		default:
			writeError(w, http.StatusNotFound, "not_found")
			return
		}
	}
	token := bearer(r, len(parts) == 7 && parts[6] == "watch")
	if !bearerPattern.MatchString(token) {
		writeError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	hash := sha256.Sum256([]byte(token))

	switch {
	case len(parts) == 5 && r.Method == http.MethodPut:
		h.claim(w, r, name, hash)
	case len(parts) == 6 && r.Method == http.MethodHead:
		if h.authorize(w, name, hash) && h.allow(w, h.fetches, name, 4, 240) {
			h.head(w, name, dir)
		}
	case len(parts) == 7 && parts[6] == "watch":
		if r.Method != http.MethodGet {
			writeError(w, http.StatusNotFound, "not_found")
		} else if h.authorize(w, name, hash) {
			h.watch(w, r, name, dir)
		}
	case len(parts) == 7:
		seq, ok := parseSeq(parts[6])
		if !ok || seq == 0 {
			writeError(w, http.StatusBadRequest, "bad_request")
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			if h.authorize(w, name, hash) && h.allow(w, h.fetches, name, 4, 240) {
				h.get(w, r, name, dir, seq)
			}
		case http.MethodPut:
			h.put(w, r, name, dir, seq, hash)
		default:
			writeError(w, http.StatusNotFound, "not_found")
		}
	default:
		writeError(w, http.StatusNotFound, "not_found")
	}
}

// bearer reads the token from Authorization, or for a watch socket from
// the zerobyte.bearer.<token> subprotocol that browsers must use.
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

func parseSeq(s string) (uint64, bool) {
	if !seqPattern.MatchString(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// allow takes one token from name's limiter in set, answering 429 when
// there is none.
func (h *Handler) allow(w http.ResponseWriter, set map[string]*rate.Limiter, name string, perSec float64, burst int) bool {
	now := h.now()
	h.mu.Lock()
	lim := set[name]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(perSec), burst)
		set[name] = lim
	}
	ok := lim.AllowN(now, 1)
	var tokens float64
	if !ok {
		tokens = lim.TokensAt(now)
	}
	h.mu.Unlock()
	if ok {
		return true
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Max(1, math.Ceil((1-tokens)/perSec)))))
	writeError(w, http.StatusTooManyRequests, "rate_limited")
	return false
}

// authorize reads the mailbox record and checks the token against it.
func (h *Handler) authorize(w http.ResponseWriter, name string, hash store.Hash) bool {
	rec, err := h.log.Mailbox(name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found")
		return false
	case err != nil:
		writeError(w, http.StatusInternalServerError, "internal")
		return false
	case subtle.ConstantTimeCompare(rec.Token[:], hash[:]) != 1:
		writeError(w, http.StatusForbidden, "forbidden")
		return false
	}
	return true
}

// claim is PUT /v1/<app>/mailbox/<id>: 201 new, 204 heartbeat, 409 taken.
func (h *Handler) claim(w http.ResponseWriter, r *http.Request, name string, hash store.Hash) {
	if !h.allow(w, h.fetches, name, 4, 240) {
		return
	}
	rec, err := h.log.Mailbox(name)
	now := h.now().UnixNano()
	switch {
	case errors.Is(err, store.ErrNotFound):
		if err := h.log.Claim(name, store.MailboxRecord{Token: hash, LastActive: now}, 0, true); err != nil {
			writeError(w, http.StatusInternalServerError, "internal")
			return
		}
		w.WriteHeader(http.StatusCreated)
	case err != nil:
		writeError(w, http.StatusInternalServerError, "internal")
	case subtle.ConstantTimeCompare(rec.Token[:], hash[:]) != 1:
		writeError(w, http.StatusConflict, "taken")
	default:
		if err := h.log.Claim(name, store.MailboxRecord{Token: hash, LastActive: now}, rec.LastActive, false); err != nil {
			writeError(w, http.StatusInternalServerError, "internal")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// direction returns the cached state of one direction, loading it once.
func (h *Handler) direction(name string, dir byte) (*direction, error) {
	key := name + "/" + string(dir)
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.dirs[key]
	if d == nil {
		d = &direction{watchers: make(map[*watcher]bool)}
		h.dirs[key] = d
	}
	if !d.loaded {
		st, err := h.log.State(name, dir)
		if err != nil {
			return nil, err
		}
		d.state, d.loaded = st, true
	}
	return d, nil
}

// head is HEAD …/<dir>: first, last and count from the cached state.
func (h *Handler) head(w http.ResponseWriter, name string, dir byte) {
	d, err := h.direction(name, dir)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	h.mu.Lock()
	st := d.state
	h.mu.Unlock()
	if st.Count == 0 {
		st.First, st.Last = 0, 0
	}
	w.Header().Set("X-Relay-First", strconv.FormatUint(st.First, 10))
	w.Header().Set("X-Relay-Last", strconv.FormatUint(st.Last, 10))
	w.Header().Set("X-Relay-Count", strconv.Itoa(st.Count))
	w.WriteHeader(http.StatusOK)
}

// get is GET and HEAD of …/<dir>/<seq>.
func (h *Handler) get(w http.ResponseWriter, r *http.Request, name string, dir byte, seq uint64) {
	var env []byte
	found, err := h.log.Envelope(name, dir, seq, func(v []byte) { env = bytes.Clone(v) })
	switch {
	case err != nil:
		writeError(w, http.StatusInternalServerError, "internal")
	case !found:
		writeError(w, http.StatusNotFound, "not_found")
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		if r.Method == http.MethodHead {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(env)))
		_, _ = w.Write(env)
	}
}

// put is PUT …/<dir>/<seq>: checks the outside, stores durably, wakes the
// watchers. Writes of one direction take turns, so the duplicate and
// capacity checks hold while a write syncs.
func (h *Handler) put(w http.ResponseWriter, r *http.Request, name string, dir byte, seq uint64, hash store.Hash) {
	env, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEnvelope))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "too_large")
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	case len(env) < 25 || env[0] != 0x01 || binary.BigEndian.Uint64(env[1:9]) != seq:
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	}
	if n := r.Header.Get("X-Relay-Notify"); n != "" && n != "alert" && n != "silent" {
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	}
	if !h.authorize(w, name, hash) || !h.allow(w, h.envelopes, name, 2, 120) {
		return
	}
	d, err := h.direction(name, dir)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	d.writing.Lock()
	defer d.writing.Unlock()
	var stored []byte
	exists, err := h.log.Envelope(name, dir, seq, func(v []byte) { stored = bytes.Clone(v) })
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	if exists {
		if !bytes.Equal(stored, env) {
			writeError(w, http.StatusConflict, "conflict")
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	h.mu.Lock()
	st := d.state
	h.mu.Unlock()
	if seq <= st.Pruned {
		writeError(w, http.StatusConflict, "conflict")
		return
	}
	if st.Count+1 > maxStored || st.Bytes+len(env) > maxStoredBytes {
		writeError(w, http.StatusInsufficientStorage, "mailbox_full")
		return
	}
	rec, err := h.log.Mailbox(name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	now := h.now().UnixNano()
	if err := h.log.Put(name, dir, seq, env, &store.MailboxRecord{Token: rec.Token, LastActive: now}, rec.LastActive); err != nil {
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	h.mu.Lock()
	if d.state.Count == 0 || seq < d.state.First {
		d.state.First = seq
	}
	d.state.Last = max(d.state.Last, seq)
	d.state.Count++
	d.state.Bytes += len(env)
	for wt := range d.watchers {
		wt.queue(outgoing{op: websocket.BinaryMessage, seq: seq, data: env})
	}
	h.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

// watch is GET …/<dir>/watch?after=<seq>.
func (h *Handler) watch(w http.ResponseWriter, r *http.Request, name string, dir byte) {
	after := uint64(0)
	if q := r.URL.Query(); q.Has("after") {
		var ok bool
		if after, ok = parseSeq(q.Get("after")); !ok {
			writeError(w, http.StatusBadRequest, "bad_request")
			return
		}
	}
	if !websocket.IsWebSocketUpgrade(r) {
		writeError(w, http.StatusBadRequest, "bad_request")
		return
	}
	d, err := h.direction(name, dir)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	// The slot is taken before the upgrade, so that a ninth socket is
	// refused even while the eighth is still being upgraded.
	h.mu.Lock()
	full := len(d.watchers)+d.upgrading >= maxWatchers
	if !full {
		d.upgrading++
	}
	h.mu.Unlock()
	if full {
		writeError(w, http.StatusTooManyRequests, "too_many_watchers")
		return
	}
	if !h.allow(w, h.connections, name, 0.2, 20) {
		h.mu.Lock()
		d.upgrading--
		h.mu.Unlock()
		return
	}
	// Counted before the 101 goes out, so that a CloseSockets that
	// starts once a client holds its socket waits for it.
	h.running.Add(2)
	conn, err := h.upgrader.Upgrade(w, r, nil)
	var wt *watcher
	h.mu.Lock()
	d.upgrading--
	if err == nil {
		wt = &watcher{conn: conn, send: make(chan outgoing, sendQueue), done: make(chan struct{})}
		d.watchers[wt] = true
	}
	h.mu.Unlock()
	if err != nil {
		h.running.Add(-2)
		return // the upgrader has answered
	}
	defer func() {
		h.mu.Lock()
		delete(d.watchers, wt)
		h.mu.Unlock()
		wt.stop()
		h.running.Done()
	}()
	go func() {
		defer h.running.Done()
		h.writeWatch(wt, name, dir, after)
	}()

	silence := h.ping * 5 / 2
	_ = conn.SetReadDeadline(time.Now().Add(silence))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(silence)) })
	for {
		op, msg, err := conn.ReadMessage()
		if err != nil {
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(silence))
		if op != websocket.TextMessage || string(msg) != "ping" {
			wt.closeWith(websocket.CloseUnsupportedData, "only text ping is accepted")
			return
		}
		wt.queue(outgoing{op: websocket.TextMessage, data: []byte("pong")})
	}
}

// writeWatch is a watch socket's only writer: it replays what is stored
// above after, then sends what is queued, and pings.
func (h *Handler) writeWatch(wt *watcher, name string, dir byte, after uint64) {
	defer wt.conn.Close()
	sent := make(map[uint64]bool)
	err := h.log.Scan(name, dir, after, func(seq uint64, env []byte) bool {
		sent[seq] = true
		_ = wt.conn.SetWriteDeadline(time.Now().Add(writeWait))
		return wt.conn.WriteMessage(websocket.BinaryMessage, env) == nil
	})
	if err != nil {
		return
	}
	ticker := time.NewTicker(h.ping)
	defer ticker.Stop()
	for {
		select {
		case m := <-wt.send:
			if m.op == websocket.BinaryMessage && (m.seq <= after || sent[m.seq]) {
				continue // the replay sent it already
			}
			_ = wt.conn.SetWriteDeadline(time.Now().Add(writeWait))
			if err := wt.conn.WriteMessage(m.op, m.data); err != nil {
				return
			}
		case <-ticker.C:
			if err := wt.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
				return
			}
		case <-wt.done:
			return
		}
	}
}

// queue hands a message to the writer; a reader too far behind to take it
// is closed with 1013 and resumes from the last sequence it holds.
func (wt *watcher) queue(m outgoing) {
	select {
	case wt.send <- m:
	default:
		wt.closeWith(websocket.CloseTryAgainLater, "too far behind")
	}
}

// closeWith sends a close frame (gorilla lets WriteControl run beside the
// writer), stops the writer and closes the connection, which also frees a
// writer stuck on a peer that does not read.
func (wt *watcher) closeWith(code int, reason string) {
	_ = wt.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	wt.stop()
	_ = wt.conn.Close()
}

func (wt *watcher) stop() { wt.once.Do(func() { close(wt.done) }) }

// Open is the number of open watch sockets.
func (h *Handler) Open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, d := range h.dirs {
		n += len(d.watchers)
	}
	return n
}

// CloseSockets ends every watch socket with 1001 and waits for their
// goroutines (net/http's Shutdown does not track hijacked connections), so
// that the store can be closed after it.
func (h *Handler) CloseSockets() {
	defer h.running.Wait()
	var all []*watcher
	h.mu.Lock()
	for _, d := range h.dirs {
		for wt := range d.watchers {
			all = append(all, wt)
		}
	}
	h.mu.Unlock()
	for _, wt := range all {
		wt.closeWith(websocket.CloseGoingAway, "server shutting down")
	}
}
