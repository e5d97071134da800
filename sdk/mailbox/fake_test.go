package mailbox_test

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fasthttp/websocket"
)

// fakeRelay implements just enough of spec/mailbox.md's core endpoints, in
// memory, to exercise the client: claim, erase, put, get, batch, head,
// prune and watch. It is not the relay: no durability, no limits beyond the
// watcher count, no push. The black-box tests against the real server live
// elsewhere.
type fakeRelay struct {
	app string

	// Misbehaviours, set before the test's requests.
	echoBearer  bool   // answer a watch with the bearer subprotocol too
	maxWatchers int    // watch sockets per direction (default 8)
	retryAfter  string // when set, every request answers 429 rate_limited with it

	mu       sync.Mutex
	boxes    map[string]*fakeBox
	watchers map[string]int // "id/dir" -> open watch sockets
	changed  chan struct{}  // closed and replaced on every change
	notify   []string       // X-Relay-Notify of each stored put
	// lastWatch is what the last watch request offered: its
	// Authorization header and subprotocols.
	lastWatch struct {
		auth         string
		subprotocols []string
	}
}

type fakeBox struct {
	token string
	dirs  map[string]*fakeDir
}

type fakeDir struct {
	envs   map[uint64][]byte
	pruned uint64
}

func newFake(t *testing.T) (*fakeRelay, *httptest.Server) {
	f := &fakeRelay{app: "notes", maxWatchers: 8, boxes: map[string]*fakeBox{},
		watchers: map[string]int{}, changed: make(chan struct{})}
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeRelay) handler() http.Handler {
	mux := http.NewServeMux()
	const box = "/v1/{app}/mailbox/{id}"
	mux.HandleFunc("PUT "+box, f.claim)
	mux.HandleFunc("DELETE "+box, f.erase)
	mux.HandleFunc("PUT "+box+"/{dir}/{seq}", f.put)
	// GET patterns match HEAD too: get serves both (net/http drops the
	// HEAD body), batch hands HEAD to head.
	mux.HandleFunc("GET "+box+"/{dir}/{seq}", f.get)
	mux.HandleFunc("GET "+box+"/{dir}", f.batch)
	mux.HandleFunc("DELETE "+box+"/{dir}", f.prune)
	mux.HandleFunc("GET "+box+"/{dir}/watch", f.watch)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.retryAfter != "" {
			w.Header().Set("Retry-After", f.retryAfter)
			fail(w, http.StatusTooManyRequests, "rate_limited")
			return
		}
		if r.PathValue("app") != "" && r.PathValue("app") != f.app {
			fail(w, http.StatusNotFound, "not_found")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func fail(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": code, "status": status})
}

// bearer is the token from Authorization, or for a watch from the offered
// subprotocol zerobyte.bearer.<token>.
func bearer(r *http.Request) string {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return tok
	}
	for _, p := range websocket.Subprotocols(r) {
		if tok, ok := strings.CutPrefix(p, "zerobyte.bearer."); ok {
			return tok
		}
	}
	return ""
}

// open checks the bearer and the mailbox, and returns the direction asked
// for (nil when the path has none), with f.mu held on success.
func (f *fakeRelay) open(w http.ResponseWriter, r *http.Request) (*fakeBox, *fakeDir, bool) {
	tok := bearer(r)
	if len(tok) < 16 {
		fail(w, http.StatusUnauthorized, "unauthorized")
		return nil, nil, false
	}
	dirName := r.PathValue("dir")
	if dirName != "" && dirName != "p2c" && dirName != "c2p" {
		fail(w, http.StatusBadRequest, "bad_request")
		return nil, nil, false
	}
	f.mu.Lock()
	b := f.boxes[r.PathValue("id")]
	switch {
	case b == nil:
		f.mu.Unlock()
		fail(w, http.StatusNotFound, "not_found")
		return nil, nil, false
	case b.token != tok:
		f.mu.Unlock()
		fail(w, http.StatusForbidden, "forbidden")
		return nil, nil, false
	}
	if dirName == "" {
		return b, nil, true
	}
	return b, b.dirs[dirName], true
}

// parseSeq reads a sequence from the path or the query: decimal, and at
// least min.
func parseSeq(s string, min uint64) (uint64, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil && n >= min
}

func (f *fakeRelay) broadcast() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeRelay) claim(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	if len(tok) < 16 {
		fail(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[r.PathValue("id")]
	switch {
	case b == nil:
		f.boxes[r.PathValue("id")] = &fakeBox{token: tok, dirs: map[string]*fakeDir{
			"p2c": {envs: map[uint64][]byte{}}, "c2p": {envs: map[uint64][]byte{}}}}
		w.WriteHeader(http.StatusCreated)
	case b.token == tok:
		w.WriteHeader(http.StatusNoContent)
	default:
		fail(w, http.StatusConflict, "taken")
	}
}

func (f *fakeRelay) erase(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := f.open(w, r); !ok {
		return
	}
	delete(f.boxes, r.PathValue("id"))
	f.broadcast()
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeRelay) put(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16+1))
	if err != nil {
		fail(w, http.StatusBadRequest, "bad_request")
		return
	}
	_, d, ok := f.open(w, r)
	if !ok {
		return
	}
	defer f.mu.Unlock()
	seq, ok := parseSeq(r.PathValue("seq"), 1)
	notify := r.Header.Get("X-Relay-Notify")
	switch {
	case !ok || len(body) < 25 || body[0] != 1 || binary.BigEndian.Uint64(body[1:9]) != seq ||
		(notify != "" && notify != "alert" && notify != "silent"):
		fail(w, http.StatusBadRequest, "bad_request")
	case len(body) > 1<<16:
		fail(w, http.StatusRequestEntityTooLarge, "too_large")
	case seq <= d.pruned:
		fail(w, http.StatusConflict, "conflict")
	case d.envs[seq] != nil && string(d.envs[seq]) == string(body):
		w.WriteHeader(http.StatusOK)
	case d.envs[seq] != nil:
		fail(w, http.StatusConflict, "conflict")
	default:
		d.envs[seq] = body
		f.notify = append(f.notify, notify)
		f.broadcast()
		w.WriteHeader(http.StatusCreated)
	}
}

func (f *fakeRelay) get(w http.ResponseWriter, r *http.Request) {
	_, d, ok := f.open(w, r)
	if !ok {
		return
	}
	seq, ok := parseSeq(r.PathValue("seq"), 1)
	env := d.envs[seq]
	f.mu.Unlock()
	switch {
	case !ok:
		fail(w, http.StatusBadRequest, "bad_request")
	case env == nil:
		fail(w, http.StatusNotFound, "not_found")
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(env)
	}
}

// above lists the sequences of d above after, ascending; f.mu is held.
func (d *fakeDir) above(after uint64) []uint64 {
	var seqs []uint64
	for s := range d.envs {
		if s > after {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	return seqs
}

func (f *fakeRelay) batch(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		f.head(w, r)
		return
	}
	q := r.URL.Query()
	after, okAfter := uint64(0), true
	if q.Has("after") {
		after, okAfter = parseSeq(q.Get("after"), 0)
	}
	limit, okLimit := uint64(100), true
	if q.Has("limit") {
		limit, okLimit = parseSeq(q.Get("limit"), 1)
	}
	if !okAfter || !okLimit || limit > 1000 {
		fail(w, http.StatusBadRequest, "bad_request")
		return
	}
	_, d, ok := f.open(w, r)
	if !ok {
		return
	}
	seqs := d.above(after)
	more := uint64(len(seqs)) > limit
	if more {
		seqs = seqs[:limit]
	}
	var body []byte
	for _, s := range seqs {
		body = binary.BigEndian.AppendUint32(body, uint32(len(d.envs[s])))
		body = append(body, d.envs[s]...)
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/vnd.zerobyte.batch")
	w.Header().Set("X-Relay-More", map[bool]string{true: "1", false: "0"}[more])
	_, _ = w.Write(body)
}

func (f *fakeRelay) head(w http.ResponseWriter, r *http.Request) {
	_, d, ok := f.open(w, r)
	if !ok {
		return
	}
	seqs := d.above(0)
	f.mu.Unlock()
	first, last := uint64(0), uint64(0)
	if len(seqs) > 0 {
		first, last = seqs[0], seqs[len(seqs)-1]
	}
	w.Header().Set("X-Relay-First", strconv.FormatUint(first, 10))
	w.Header().Set("X-Relay-Last", strconv.FormatUint(last, 10))
	w.Header().Set("X-Relay-Count", strconv.Itoa(len(seqs)))
}

func (f *fakeRelay) prune(w http.ResponseWriter, r *http.Request) {
	through, ok := parseSeq(r.URL.Query().Get("through"), 0)
	if !ok {
		fail(w, http.StatusBadRequest, "bad_request")
		return
	}
	_, d, ok := f.open(w, r)
	if !ok {
		return
	}
	for s := range d.envs {
		if s <= through {
			delete(d.envs, s)
		}
	}
	d.pruned = max(d.pruned, through)
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// watch serves a watch socket: the stored envelopes above after, then each
// new one; "pong" for "ping"; 1003 for anything else; 1000 on erase.
func (f *fakeRelay) watch(w http.ResponseWriter, r *http.Request) {
	after, okAfter := parseSeq(r.URL.Query().Get("after"), 0)
	if !okAfter {
		fail(w, http.StatusBadRequest, "bad_request")
		return
	}
	f.mu.Lock()
	f.lastWatch.auth = r.Header.Get("Authorization")
	f.lastWatch.subprotocols = websocket.Subprotocols(r)
	f.mu.Unlock()
	_, _, ok := f.open(w, r)
	if !ok {
		return
	}
	id, dirName := r.PathValue("id"), r.PathValue("dir")
	key := id + "/" + dirName
	if f.watchers[key] >= f.maxWatchers {
		f.mu.Unlock()
		fail(w, http.StatusTooManyRequests, "too_many_watchers")
		return
	}
	f.watchers[key]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.watchers[key]--
		f.mu.Unlock()
	}()

	up := websocket.Upgrader{Subprotocols: []string{"zerobyte.v1"}}
	var respHeader http.Header
	if f.echoBearer {
		up.Subprotocols = nil
		respHeader = http.Header{"Sec-Websocket-Protocol": {"zerobyte.bearer." + bearer(r)}}
	}
	conn, err := up.Upgrade(w, r, respHeader)
	if err != nil {
		return
	}
	defer conn.Close()

	var writeMu sync.Mutex
	write := func(typ int, data []byte) error {
		writeMu.Lock()
		defer writeMu.Unlock()
		return conn.WriteMessage(typ, data)
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			typ, data, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if typ != websocket.TextMessage || string(data) != "ping" {
				_ = write(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseUnsupportedData, ""))
				return
			}
			if write(websocket.TextMessage, []byte("pong")) != nil {
				return
			}
		}
	}()

	last := after
	for {
		f.mu.Lock()
		b := f.boxes[id]
		var envs [][]byte
		if b != nil {
			for _, s := range b.dirs[dirName].above(last) {
				envs = append(envs, b.dirs[dirName].envs[s])
				last = s
			}
		}
		changed := f.changed
		f.mu.Unlock()
		if b == nil {
			_ = write(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "erased"))
			return
		}
		for _, env := range envs {
			if write(websocket.BinaryMessage, env) != nil {
				return
			}
		}
		select {
		case <-changed:
		case <-readerDone:
			return
		}
	}
}
