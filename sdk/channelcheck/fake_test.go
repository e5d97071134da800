package channelcheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

// fakeRelay is a small second implementation of the contract on net/http
// and the gorilla-compatible Upgrader, with switches that break one rule
// each, so the tests can show Run fails the check that rule belongs to.
type fakeRelay struct {
	opts fakeOpts

	mu        sync.Mutex
	computers map[string]*fakeComputer // by claim key
	upgrader  websocket.Upgrader
}

type fakeOpts struct {
	// fanout delivers every phone frame to every connected computer.
	fanout bool
	// phoneLimit is the largest phone frame accepted (70,000 if zero).
	phoneLimit int64
	// offlineCode closes a computer's phones when it goes away (1001 if
	// zero).
	offlineCode int
	// noStoreOff leaves Cache-Control out of claim answers.
	noStoreOff bool
}

type fakeComputer struct {
	host         string
	used         bool
	owner, phone string
	reserved     bool // a control socket is being opened or is open
	ctl          *fakeConn
	phones       map[string]*fakeConn
}

// fakeConn serialises writes, which gorilla's Conn requires.
type fakeConn struct {
	mu sync.Mutex
	c  *websocket.Conn
}

func (f *fakeConn) write(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_ = f.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = f.c.WriteMessage(websocket.TextMessage, b)
}

func (f *fakeConn) closeWith(code int) {
	msg := websocket.FormatCloseMessage(code, "")
	_ = f.c.WriteControl(websocket.CloseMessage, msg, time.Now().Add(5*time.Second))
	_ = f.c.Close()
}

func newFakeRelay(t *testing.T, opts fakeOpts, hosts map[string]string) *httptest.Server {
	t.Helper()
	if opts.phoneLimit == 0 {
		opts.phoneLimit = maxFrame
	}
	if opts.offlineCode == 0 {
		opts.offlineCode = websocket.CloseGoingAway
	}
	f := &fakeRelay{opts: opts, computers: make(map[string]*fakeComputer)}
	for key, host := range hosts {
		f.computers[key] = &fakeComputer{host: host, phones: make(map[string]*fakeConn)}
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

// forget wipes every claim, as a relay that kept claims only in memory
// would after a restart.
func (f *fakeRelay) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.computers {
		c.used, c.owner, c.phone = false, "", ""
	}
}

func (f *fakeRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/health":
		f.json(w, http.StatusOK, map[string]any{"protocol": protocolV1, "protocols": []string{protocolV1, protocolV2}})
	case r.URL.Path == "/claim" && r.Method == http.MethodPost:
		f.claim(w, r)
	case r.URL.Path == "/claim" && r.Method == http.MethodDelete:
		f.release(w, r)
	case r.URL.Path == "/status":
		f.mu.Lock()
		c := f.byToken(bearer(r), false)
		var body map[string]any
		if c != nil {
			body = map[string]any{"connected": c.ctl != nil, "host": c.host}
		}
		f.mu.Unlock()
		if c == nil {
			f.fail(w, http.StatusNotFound, "unknown token")
			return
		}
		f.json(w, http.StatusOK, body)
	case r.URL.Path == "/host":
		f.host(w, r)
	case r.URL.Path == "/botharness-device/channel":
		f.phone(w, r)
	default:
		f.fail(w, http.StatusNotFound, "not found")
	}
}

func (f *fakeRelay) json(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if !f.opts.noStoreOff || status != http.StatusOK {
		w.Header().Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeRelay) fail(w http.ResponseWriter, status int, msg string) {
	f.json(w, status, map[string]string{"error": msg})
}

func bearer(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// byToken finds the computer owning an owner (or phone) token. f.mu held.
func (f *fakeRelay) byToken(tok string, phone bool) *fakeComputer {
	for _, c := range f.computers {
		if tok != "" && c.used && (!phone && c.owner == tok || phone && c.phone == tok) {
			return c
		}
	}
	return nil
}

func (f *fakeRelay) claim(w http.ResponseWriter, r *http.Request) {
	var body struct{ OwnerToken, PhoneToken string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.OwnerToken) != 64 || len(body.PhoneToken) != 64 {
		f.fail(w, http.StatusBadRequest, "malformed body")
		return
	}
	f.mu.Lock()
	c := f.computers[bearer(r)]
	status := http.StatusOK
	switch {
	case c == nil:
		status = http.StatusForbidden
	case c.used:
		status = http.StatusConflict
	default:
		c.used, c.owner, c.phone = true, body.OwnerToken, body.PhoneToken
	}
	f.mu.Unlock()
	if status != http.StatusOK {
		f.fail(w, status, "no")
		return
	}
	f.json(w, http.StatusOK, map[string]any{"claimed": true, "host": c.host})
}

func (f *fakeRelay) release(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	c := f.byToken(bearer(r), false)
	var ctl *fakeConn
	if c != nil {
		c.owner, c.phone = "", "" // the key stays used
		ctl = c.ctl
	}
	f.mu.Unlock()
	if c == nil {
		f.fail(w, http.StatusNotFound, "unknown token")
		return
	}
	if ctl != nil {
		ctl.closeWith(websocket.CloseNormalClosure)
	}
	f.json(w, http.StatusOK, map[string]bool{"released": true})
}

func (f *fakeRelay) host(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	c := f.byToken(bearer(r), false)
	busy := c != nil && c.reserved
	if c != nil && !busy {
		c.reserved = true
	}
	f.mu.Unlock()
	if c == nil || busy {
		f.fail(w, http.StatusForbidden, "refused")
		return
	}
	conn, err := f.upgrader.Upgrade(w, r, nil)
	if err != nil {
		f.mu.Lock()
		c.reserved = false
		f.mu.Unlock()
		return
	}
	ctl := &fakeConn{c: conn}
	f.mu.Lock()
	c.ctl = ctl
	f.mu.Unlock()
	for {
		_, frame, err := conn.ReadMessage()
		if err != nil {
			break
		}
		var m struct{ Type, ID, Data string }
		if json.Unmarshal(frame, &m) != nil {
			break
		}
		f.mu.Lock()
		p := c.phones[m.ID]
		if m.Type == "close" {
			delete(c.phones, m.ID)
		}
		f.mu.Unlock()
		switch {
		case p == nil:
		case m.Type == "data":
			p.write([]byte(m.Data))
		case m.Type == "close":
			p.closeWith(websocket.CloseNormalClosure)
		}
	}
	f.mu.Lock()
	c.ctl, c.reserved = nil, false
	phones := c.phones
	c.phones = make(map[string]*fakeConn)
	f.mu.Unlock()
	for _, p := range phones {
		p.closeWith(f.opts.offlineCode)
	}
	ctl.closeWith(websocket.CloseNormalClosure)
}

func (f *fakeRelay) phone(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	if tok == "" {
		tok = r.Header.Get("X-BotHarness-Admission")
	}
	f.mu.Lock()
	c := f.byToken(tok, true)
	var ctl *fakeConn
	if c != nil {
		ctl = c.ctl
	}
	f.mu.Unlock()
	if ctl == nil {
		f.fail(w, http.StatusForbidden, "refused")
		return
	}
	conn, err := f.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	conn.SetReadLimit(f.opts.phoneLimit) // gorilla closes with 1009 past it
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	p := &fakeConn{c: conn}
	f.mu.Lock()
	c.phones[id] = p
	f.mu.Unlock()
	ctl.write(mustJSON(map[string]string{"type": "open", "id": id}))
	for {
		_, frame, err := conn.ReadMessage()
		if err != nil {
			break
		}
		msg := mustJSON(map[string]string{"type": "data", "id": id, "data": string(frame)})
		for _, to := range f.routes(c) {
			to.write(msg)
		}
	}
	f.mu.Lock()
	_, mine := c.phones[id]
	delete(c.phones, id)
	f.mu.Unlock()
	if mine {
		ctl.write(mustJSON(map[string]string{"type": "close", "id": id}))
	}
	_ = conn.Close()
}

// routes is where a phone frame of c goes: c's control socket, or with
// fanout every control socket.
func (f *fakeRelay) routes(c *fakeComputer) []*fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*fakeConn
	for _, o := range f.computers {
		if o.ctl != nil && (o == c || f.opts.fanout) {
			out = append(out, o.ctl)
		}
	}
	return out
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

const (
	fakeKeyA = "aaaa000000000000000000000000000000000000000000000000000000000000"
	fakeKeyB = "bbbb000000000000000000000000000000000000000000000000000000000000"
)

func runFake(t *testing.T, opts fakeOpts, o Options) (Report, *fakeRelay) {
	t.Helper()
	srv := newFakeRelay(t, opts, map[string]string{fakeKeyA: "fake-a", fakeKeyB: "fake-b"})
	f := srv.Config.Handler.(*fakeRelay)
	o.Origin = srv.URL
	if o.KeyA == "" {
		o.KeyA, o.KeyB = fakeKeyA, fakeKeyB
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Second
	}
	o.Log = t.Output()
	rep := Run(context.Background(), o)
	return rep, f
}

// checkErr returns the named check's error, failing the test if it did
// not run.
func checkErr(t *testing.T, rep Report, name string) error {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c.Err
		}
	}
	t.Fatalf("check %q not in report", name)
	return nil
}

func wantPassed(t *testing.T, rep Report, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := checkErr(t, rep, n); err != nil {
			t.Errorf("%s failed: %v", n, err)
		}
	}
}

func wantFailed(t *testing.T, rep Report, name, substr string) {
	t.Helper()
	err := checkErr(t, rep, name)
	if err == nil {
		t.Errorf("%s passed, want it to fail", name)
		return
	}
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("%s failed with %q, want it to mention %q", name, err, substr)
	}
	if rep.Passed() {
		t.Error("report passed with a failed check")
	}
}

// TestRunPassesAgainstFake shows the checker accepts a second, independent
// implementation of the contract, restart included.
func TestRunPassesAgainstFake(t *testing.T) {
	restarted := false
	rep, _ := runFake(t, fakeOpts{}, Options{Restart: func(context.Context) error {
		restarted = true
		return nil
	}})
	for _, c := range rep.Checks {
		if c.Err != nil {
			t.Errorf("FAIL %s: %v", c.Name, c.Err)
		}
	}
	if !rep.Passed() || !restarted {
		t.Fatalf("passed %t, restarted %t", rep.Passed(), restarted)
	}
	want := []string{checkHealth, checkClaimA, checkClaimB, checkStatusIdle, checkComputerA, checkComputerB,
		checkStatusConnected, checkPhoneA, checkPhoneB, checkOpenA, checkOpenB, checkUpA, checkUpB, checkDownA,
		checkDownB, checkForeignID, checkSpecialUp, checkSpecialDown, checkMaxFrame, checkOversize,
		checkReconnectPhoneA, checkOfflineA, checkBAfterOffline, checkReconnectComputerA, checkReleaseA,
		checkReleaseClosesA, checkBAfterRelease, checkReclaimA, checkRestart, checkHealthAfterRestart,
		checkReclaimAAfterRestart, checkReclaimBAfterRestart, checkNoStore}
	if len(rep.Checks) != len(want) {
		t.Fatalf("%d checks, want %d", len(rep.Checks), len(want))
	}
	for i, c := range rep.Checks {
		if c.Name != want[i] {
			t.Errorf("check %d is %q, want %q", i, c.Name, want[i])
		}
	}
}

func TestRunCatchesMisrouting(t *testing.T) {
	rep, _ := runFake(t, fakeOpts{fanout: true}, Options{})
	wantPassed(t, rep, checkHealth, checkClaimA, checkClaimB, checkOpenA, checkOpenB)
	wantFailed(t, rep, checkUpA, "computer B also received phone A's frame")
}

func TestRunCatchesWrongOfflineCode(t *testing.T) {
	rep, _ := runFake(t, fakeOpts{offlineCode: websocket.CloseNormalClosure}, Options{})
	wantFailed(t, rep, checkOfflineA, "close code 1000")
	wantPassed(t, rep, checkBAfterOffline, checkReconnectComputerA, checkReleaseA, checkBAfterRelease, checkReclaimA)
}

// TestRunCatchesOversizeAccepted also shows that a phone left open by a
// failed check is replaced cleanly: its late close does not upset the
// checks after it.
func TestRunCatchesOversizeAccepted(t *testing.T) {
	rep, _ := runFake(t, fakeOpts{phoneLimit: 1 << 20}, Options{Timeout: time.Second})
	wantFailed(t, rep, checkOversize, "phone A not closed after a 70001-byte frame")
	wantPassed(t, rep, checkReconnectPhoneA, checkOfflineA, checkBAfterOffline)
}

func TestRunCatchesClaimsLostOnRestart(t *testing.T) {
	var f *fakeRelay
	restart := func(context.Context) error { f.forget(); return nil }
	srv := newFakeRelay(t, fakeOpts{}, map[string]string{fakeKeyA: "fake-a", fakeKeyB: "fake-b"})
	f = srv.Config.Handler.(*fakeRelay)
	rep := Run(context.Background(), Options{Origin: srv.URL, KeyA: fakeKeyA, KeyB: fakeKeyB,
		Restart: restart, Timeout: 3 * time.Second, Log: t.Output()})
	wantPassed(t, rep, checkReclaimA, checkRestart, checkHealthAfterRestart)
	wantFailed(t, rep, checkReclaimAAfterRestart, "HTTP 200")
	wantFailed(t, rep, checkReclaimBAfterRestart, "HTTP 200")
}

func TestRunReportsFailedRestart(t *testing.T) {
	rep, _ := runFake(t, fakeOpts{}, Options{Restart: func(context.Context) error { return errors.New("boom") }})
	wantFailed(t, rep, checkRestart, "boom")
	wantFailed(t, rep, checkHealthAfterRestart, "skipped: "+checkRestart+" failed")
	wantFailed(t, rep, checkReclaimBAfterRestart, "skipped: "+checkHealthAfterRestart+" failed")
}

func TestRunCatchesMissingNoStore(t *testing.T) {
	rep, _ := runFake(t, fakeOpts{noStoreOff: true}, Options{})
	wantFailed(t, rep, checkHealth, "Cache-Control")
	wantFailed(t, rep, checkNoStore, "POST /claim (HTTP 200)")
	wantPassed(t, rep, checkClaimA, checkUpA, checkReclaimA)
}

// TestRunSkipsDependents: an unknown key A fails its claim, everything
// that needs A is skipped (and failed), and B's own checks still run.
func TestRunSkipsDependents(t *testing.T) {
	rep, _ := runFake(t, fakeOpts{}, Options{
		KeyA: "cccc000000000000000000000000000000000000000000000000000000000000", KeyB: fakeKeyB})
	wantFailed(t, rep, checkClaimA, "HTTP 403")
	wantFailed(t, rep, checkComputerA, "skipped: claim A failed")
	wantFailed(t, rep, checkOpenA, "skipped: "+checkPhoneA+" failed")
	wantFailed(t, rep, checkUpB, "skipped: "+checkOpenA+" failed")
	wantFailed(t, rep, checkReclaimA, "skipped: claim A failed")
	wantPassed(t, rep, checkHealth, checkClaimB, checkComputerB, checkPhoneB, checkOpenB, checkBAfterOffline, checkNoStore)
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Origin: "ftp://x", KeyA: "a", KeyB: "b"},
		{Origin: "http://", KeyA: "a", KeyB: "b"},
		{Origin: "http://x", KeyA: "a", KeyB: "a"},
		{Origin: "http://x", KeyA: "a"},
	} {
		rep := Run(context.Background(), o)
		if rep.Passed() || len(rep.Checks) != 1 || rep.Checks[0].Name != checkOptions {
			t.Errorf("%+v: report %+v, want one failed options check", o, rep)
		}
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep := Run(ctx, Options{Origin: "http://127.0.0.1:1", KeyA: fakeKeyA, KeyB: fakeKeyB})
	if rep.Passed() || len(rep.Checks) == 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, c := range rep.Checks {
		if c.Err == nil || !strings.Contains(c.Err.Error(), "run cancelled") {
			t.Errorf("%s: %v, want skipped for cancellation", c.Name, c.Err)
		}
	}
}

func TestEscapeAllRoundTrips(t *testing.T) {
	var got string
	if err := json.Unmarshal([]byte(escapeAll(specialText)), &got); err != nil {
		t.Fatal(err)
	}
	if got != specialText {
		t.Fatalf("got %q", got)
	}
	esc := escapeAll(specialText)
	for _, r := range esc {
		if r >= 0x7f {
			t.Fatalf("%q left unescaped", r)
		}
	}
	if strings.Contains(strings.ReplaceAll(esc, `\/`, ""), "/") {
		t.Fatal("slash left unescaped")
	}
}

func TestFrameOfSize(t *testing.T) {
	f := frameOfSize(maxFrame, "x")
	if len(f) != maxFrame || !strings.Contains(f, "😀") {
		t.Fatalf("len %d", len(f))
	}
	if n := len([]rune(f)); n >= maxFrame {
		t.Fatalf("%d characters: the oversize frame would not catch character counting", n)
	}
}
