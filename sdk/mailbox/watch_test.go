package mailbox_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"edgerelay/sdk/link"
	"edgerelay/sdk/mailbox"
)

func next(t *testing.T, w *mailbox.Watch) []byte {
	t.Helper()
	e, err := w.Next(ctx(t))
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return e
}

func TestWatch(t *testing.T) {
	for _, inSubprotocol := range []bool{false, true} {
		name := "bearer in Authorization"
		if inSubprotocol {
			name = "bearer in subprotocol"
		}
		t.Run(name, func(t *testing.T) {
			f, _, m, s := setup(t)
			e1, e2, e3 := env(t, s, 1, "one"), env(t, s, 2, "two"), env(t, s, 3, "three")
			for i, e := range [][]byte{e1, e2} {
				if _, err := m.Put(ctx(t), link.P2C, uint64(i+1), e, ""); err != nil {
					t.Fatal(err)
				}
			}
			w, err := m.Watch(ctx(t), link.P2C, 1, inSubprotocol)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			f.mu.Lock()
			auth, offered := f.lastWatch.auth, f.lastWatch.subprotocols
			f.mu.Unlock()
			wantAuth, wantOffered := "Bearer "+m.Token, []string{"zerobyte.v1"}
			if inSubprotocol {
				wantAuth, wantOffered = "", []string{"zerobyte.v1", "zerobyte.bearer." + m.Token}
			}
			if auth != wantAuth || !slices.Equal(offered, wantOffered) {
				t.Fatalf("watch offered Authorization %q, subprotocols %q", auth, offered)
			}
			if got := next(t, w); !bytes.Equal(got, e2) {
				t.Fatalf("first envelope %x, want 2 (after=1)", got)
			}

			// Nothing pending: Next waits, and giving up leaves the
			// Watch usable.
			short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := w.Next(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Next with nothing stored: %v", err)
			}

			if err := w.Ping(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-w.Pongs():
			case <-time.After(5 * time.Second):
				t.Fatal("no pong")
			}

			if _, err := m.Put(ctx(t), link.P2C, 3, e3, ""); err != nil {
				t.Fatal(err)
			}
			if got := next(t, w); !bytes.Equal(got, e3) {
				t.Fatalf("live envelope %x, want 3", got)
			}

			if err := m.Erase(ctx(t)); err != nil {
				t.Fatal(err)
			}
			_, err = w.Next(ctx(t))
			if code, ok := mailbox.CloseCode(err); !ok || code != 1000 {
				t.Fatalf("Next after erase: %v (close code %d, %v), want close 1000", err, code, ok)
			}
			if _, again := w.Next(ctx(t)); !errors.Is(again, err) && again.Error() != err.Error() {
				t.Fatalf("Next after the end: %v, want %v again", again, err)
			}
		})
	}
}

func TestWatchClose(t *testing.T) {
	f, _, m, s := setup(t)
	w, err := m.Watch(ctx(t), link.P2C, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	// An envelope the reader never takes must not keep Close waiting.
	if _, err := m.Put(ctx(t), link.P2C, 1, env(t, s, 1, "x"), ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := w.Next(ctx(t)); !errors.Is(err, mailbox.ErrWatchClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	if err := w.Ping(); err == nil {
		t.Fatal("Ping after Close succeeded")
	}
	// The relay saw the socket go.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		n := f.watchers[m.ID+"/p2c"]
		f.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay still counts %d watchers", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWatchRefused(t *testing.T) {
	f, c, m, _ := setup(t)

	_, err := c.Mailbox(m.ID, "short").Watch(ctx(t), link.P2C, 0, true)
	wantError(t, "watch with a short bearer", err, http.StatusUnauthorized, "unauthorized")
	_, err = c.Mailbox(m.ID, strings.Repeat("z", 43)).Watch(ctx(t), link.P2C, 0, false)
	wantError(t, "watch with another token", err, http.StatusForbidden, "forbidden")

	f.maxWatchers = 1
	w, err := m.Watch(ctx(t), link.C2P, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = m.Watch(ctx(t), link.C2P, 0, false)
	wantError(t, "a second watcher over the limit", err, http.StatusTooManyRequests, "too_many_watchers")
	f.maxWatchers = 8

	// A relay that echoes the bearer in its answer is refused.
	f.echoBearer = true
	_, err = m.Watch(ctx(t), link.P2C, 0, true)
	if err == nil || !strings.Contains(err.Error(), "subprotocol") {
		t.Fatalf("watch answered with the bearer subprotocol: %v", err)
	}
	if strings.Contains(err.Error(), m.Token) {
		t.Errorf("error text shows the bearer: %v", err)
	}
}

func TestWatchURL(t *testing.T) {
	for _, base := range []string{"ftp://relay", "://bad"} {
		m := (&mailbox.Client{BaseURL: base, App: "notes"}).Mailbox("AAECAwQFBgcICQoLDA0ODw", strings.Repeat("t", 43))
		if _, err := m.Watch(ctx(t), link.P2C, 0, false); err == nil {
			t.Errorf("Watch with base %q succeeded", base)
		}
	}
}
