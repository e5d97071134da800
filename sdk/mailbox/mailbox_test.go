package mailbox_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"edgerelay/sdk/link"
	"edgerelay/sdk/mailbox"
)

// setup returns a fake relay, a client of it, a claimed mailbox and the
// sealer of its p2c envelopes.
func setup(t *testing.T) (*fakeRelay, *mailbox.Client, *mailbox.Mailbox, *link.Sealer) {
	t.Helper()
	f, srv := newFake(t)
	c := &mailbox.Client{BaseURL: srv.URL + "/", App: f.app, HTTP: srv.Client()}
	l, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	m := c.Mailbox(l.ID, l.AccessToken())
	created, err := m.Claim(ctx(t))
	if err != nil || !created {
		t.Fatalf("Claim = %v, %v; want created", created, err)
	}
	s, err := link.NewSealer(l.EnvelopeKey(link.P2C))
	if err != nil {
		t.Fatal(err)
	}
	return f, c, m, s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func env(t *testing.T, s *link.Sealer, seq uint64, msg string) []byte {
	t.Helper()
	e, err := s.Seal(nil, seq, []byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// wantError checks that err carries an *Error with status and code.
func wantError(t *testing.T, what string, err error, status int, code string) *mailbox.Error {
	t.Helper()
	var e *mailbox.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v is no *mailbox.Error", what, err)
	}
	if e.Status != status || e.Code != code {
		t.Fatalf("%s: %d %q, want %d %q (%v)", what, e.Status, e.Code, status, code, err)
	}
	return e
}

func TestClaim(t *testing.T) {
	_, c, m, _ := setup(t)
	created, err := m.Claim(ctx(t))
	if err != nil || created {
		t.Fatalf("second Claim = %v, %v; want 204 (false)", created, err)
	}
	other := c.Mailbox(m.ID, strings.Repeat("x", 43))
	_, err = other.Claim(ctx(t))
	wantError(t, "claim with another token", err, http.StatusConflict, "taken")
	if !strings.Contains(err.Error(), "claim") || !strings.Contains(err.Error(), "409 taken") {
		t.Errorf("error text %q lacks the operation or the answer", err)
	}
	if strings.Contains(err.Error(), other.Token) {
		t.Errorf("error text %q shows the bearer", err)
	}
	_, err = c.Mailbox(m.ID, "short").Claim(ctx(t))
	wantError(t, "claim with a short bearer", err, http.StatusUnauthorized, "unauthorized")
}

func TestPutGet(t *testing.T) {
	f, c, m, s := setup(t)
	e1 := env(t, s, 1, "one")
	stored, err := m.Put(ctx(t), link.P2C, 1, e1, mailbox.NotifyAlert)
	if err != nil || !stored {
		t.Fatalf("Put = %v, %v; want 201 (true)", stored, err)
	}
	stored, err = m.Put(ctx(t), link.P2C, 1, e1, mailbox.NotifyAlert)
	if err != nil || stored {
		t.Fatalf("Put again = %v, %v; want 200 (false)", stored, err)
	}
	_, err = m.Put(ctx(t), link.P2C, 1, env(t, s, 1, "other"), mailbox.NotifyNone)
	wantError(t, "put other bytes", err, http.StatusConflict, "conflict")
	_, err = m.Put(ctx(t), link.P2C, 2, env(t, s, 2, "two"), "loud")
	wantError(t, "put with X-Relay-Notify loud", err, http.StatusBadRequest, "bad_request")
	_, err = m.Put(ctx(t), link.P2C, 3, e1, mailbox.NotifyNone) // seq 1 inside, 3 in the URL
	wantError(t, "put under another seq", err, http.StatusBadRequest, "bad_request")
	if _, err := m.Put(ctx(t), link.P2C, 2, env(t, s, 2, "two"), mailbox.NotifySilent); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	notify := slices.Clone(f.notify)
	f.mu.Unlock()
	if !slices.Equal(notify, []string{"alert", "silent"}) {
		t.Errorf("relay saw X-Relay-Notify %q", notify)
	}

	got, err := m.Get(ctx(t), link.P2C, 1)
	if err != nil || !bytes.Equal(got, e1) {
		t.Fatalf("Get = %x, %v", got, err)
	}
	_, err = m.Get(ctx(t), link.C2P, 1)
	wantError(t, "get of the empty direction", err, http.StatusNotFound, "not_found")

	_, err = c.Mailbox(m.ID, strings.Repeat("y", 43)).Get(ctx(t), link.P2C, 1)
	wantError(t, "get with another token", err, http.StatusForbidden, "forbidden")
	l, _ := link.New()
	_, err = c.Mailbox(l.ID, l.AccessToken()).Put(ctx(t), link.P2C, 1, e1, "")
	wantError(t, "put to an unclaimed mailbox", err, http.StatusNotFound, "not_found")
}

func TestInvalidDirection(t *testing.T) {
	_, _, m, _ := setup(t)
	for name, f := range map[string]func() error{
		"put":     func() error { _, err := m.Put(ctx(t), "x2y", 1, nil, ""); return err },
		"get":     func() error { _, err := m.Get(ctx(t), "", 1); return err },
		"batch":   func() error { _, _, err := m.Batch(ctx(t), "P2C", 0, 0); return err },
		"head":    func() error { _, _, _, err := m.Head(ctx(t), "../x"); return err },
		"prune":   func() error { return m.Prune(ctx(t), "p2c/1", 0) },
		"headseq": func() error { _, err := m.HeadSeq(ctx(t), "c", 1); return err },
		"watch":   func() error { _, err := m.Watch(ctx(t), "watch", 0, false); return err },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "invalid direction") {
			t.Errorf("%s: %v, want an invalid direction error", name, err)
		}
	}
}

func TestBatchHeadPrune(t *testing.T) {
	_, _, m, s := setup(t)
	var all [][]byte
	for seq := uint64(1); seq <= 5; seq++ {
		e := env(t, s, seq, strings.Repeat("m", int(seq)))
		all = append(all, e)
		if _, err := m.Put(ctx(t), link.P2C, seq, e, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		after uint64
		limit int
		want  [][]byte
		more  bool
	}{
		{0, 0, all, false},
		{0, 2, all[:2], true},
		{2, 2, all[2:4], true},
		{3, 2, all[3:], false},
		{5, 10, nil, false},
		{99, 0, nil, false},
	} {
		envs, more, err := m.Batch(ctx(t), link.P2C, c.after, c.limit)
		if err != nil || more != c.more || !slices.EqualFunc(envs, c.want, bytes.Equal) {
			t.Fatalf("Batch(after %d, limit %d) = %d envelopes, more %v, %v; want %d, %v",
				c.after, c.limit, len(envs), more, err, len(c.want), c.more)
		}
	}
	_, _, err := m.Batch(ctx(t), link.P2C, 0, 1001)
	wantError(t, "batch limit 1001", err, http.StatusBadRequest, "bad_request")

	first, last, count, err := m.Head(ctx(t), link.P2C)
	if err != nil || first != 1 || last != 5 || count != 5 {
		t.Fatalf("Head = %d, %d, %d, %v", first, last, count, err)
	}
	first, last, count, err = m.Head(ctx(t), link.C2P)
	if err != nil || first != 0 || last != 0 || count != 0 {
		t.Fatalf("Head of the empty direction = %d, %d, %d, %v", first, last, count, err)
	}

	if err := m.Prune(ctx(t), link.P2C, 3); err != nil {
		t.Fatal(err)
	}
	first, last, count, err = m.Head(ctx(t), link.P2C)
	if err != nil || first != 4 || last != 5 || count != 2 {
		t.Fatalf("Head after pruning through 3 = %d, %d, %d, %v", first, last, count, err)
	}
	for seq, want := range map[uint64]bool{3: false, 4: true, 6: false} {
		if got, err := m.HeadSeq(ctx(t), link.P2C, seq); err != nil || got != want {
			t.Errorf("HeadSeq(%d) = %v, %v; want %v", seq, got, err, want)
		}
	}
	_, err = m.Put(ctx(t), link.P2C, 2, env(t, s, 2, "late"), "")
	wantError(t, "put at or below the pruned mark", err, http.StatusConflict, "conflict")

	if err := m.Erase(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// HEAD answers have no body: the status alone makes the *Error.
	_, _, _, err = m.Head(ctx(t), link.P2C)
	wantError(t, "head of an erased mailbox", err, http.StatusNotFound, "")
	if ok, err := m.HeadSeq(ctx(t), link.P2C, 4); ok || err != nil {
		t.Fatalf("HeadSeq after erase = %v, %v", ok, err)
	}
	_, err = m.Get(ctx(t), link.P2C, 4)
	wantError(t, "get after erase", err, http.StatusNotFound, "not_found")
	err = m.Erase(ctx(t))
	wantError(t, "erase again", err, http.StatusNotFound, "not_found")
	if created, err := m.Claim(ctx(t)); err != nil || !created {
		t.Fatalf("Claim after erase = %v, %v; want created", created, err)
	}
}

func TestRetryAfter(t *testing.T) {
	f, _, m, _ := setup(t)
	f.retryAfter = "3"
	_, err := m.Claim(ctx(t))
	e := wantError(t, "rate limited claim", err, http.StatusTooManyRequests, "rate_limited")
	if e.RetryAfter != 3*time.Second {
		t.Fatalf("RetryAfter = %v, want 3s", e.RetryAfter)
	}
	if !strings.Contains(err.Error(), "retry after 3s") {
		t.Errorf("error text %q", err)
	}
}

func TestContextCanceled(t *testing.T) {
	_, _, m, _ := setup(t)
	c, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Claim(c); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a canceled context: %v", err)
	}
}

// TestOddAnswers: answers a relay should not give (or a proxy gives instead)
// become clear errors, never a silent misreading.
func TestOddAnswers(t *testing.T) {
	var handler http.HandlerFunc
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler(w, r) }))
	t.Cleanup(srv.Close)
	m := (&mailbox.Client{BaseURL: srv.URL, App: "notes"}).Mailbox("AAECAwQFBgcICQoLDA0ODw", strings.Repeat("t", 43))

	handler = func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/notes/mailbox/AAECAwQFBgcICQoLDA0ODw/p2c" || r.URL.RawQuery != "after=7&limit=3" ||
			r.Header.Get("Authorization") != "Bearer "+strings.Repeat("t", 43) {
			t.Errorf("request %s %s, Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Relay-More", "0")
	}
	if _, _, err := m.Batch(ctx(t), link.P2C, 7, 3); err == nil || !strings.Contains(err.Error(), "Content-Type") {
		t.Errorf("batch with the wrong Content-Type: %v", err)
	}
	handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", mailbox.BatchContentType)
		w.Header().Set("X-Relay-More", "yes")
	}
	if _, _, err := m.Batch(ctx(t), link.P2C, 0, 0); err == nil || !strings.Contains(err.Error(), "X-Relay-More") {
		t.Errorf("batch with X-Relay-More yes: %v", err)
	}
	handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", mailbox.BatchContentType)
		w.Header().Set("X-Relay-More", "0")
		_, _ = w.Write([]byte{0, 0, 0, 30, 1, 2})
	}
	if _, _, err := m.Batch(ctx(t), link.P2C, 0, 0); !errors.Is(err, mailbox.ErrBatch) {
		t.Errorf("truncated batch: %v", err)
	}
	handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Relay-First", "1")
		w.Header().Set("X-Relay-Last", "-2")
		w.Header().Set("X-Relay-Count", "2")
	}
	if _, _, _, err := m.Head(ctx(t), link.P2C); err == nil || !strings.Contains(err.Error(), "X-Relay-Last") {
		t.Errorf("head with a negative last: %v", err)
	}
	handler = func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte("<html>bad gateway</html>"))
	}
	_, err := m.Claim(ctx(t))
	wantError(t, "a proxy's 502", err, http.StatusBadGateway, "")
	handler = func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}
	_, err = m.Put(ctx(t), link.P2C, 1, make([]byte, 25), "")
	wantError(t, "put answered 202", err, http.StatusAccepted, "")
}
