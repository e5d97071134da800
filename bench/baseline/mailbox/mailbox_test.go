package mailbox

import (
	"crypto/sha256"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgerelay/store"
)

// The endpoints' answers are compared with our relay's in
// bench/mailboxbench (TestRelaysAnswerAlike); these tests cover the watch
// socket's limits, which that script does not reach.

const (
	id    = "AAECAwQFBgcICQoLDA0ODw"
	token = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
)

func start(t *testing.T) (*httptest.Server, *store.EnvelopeLog) {
	t.Helper()
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	log := store.NewEnvelopeLog(db)
	h := New(Config{Store: log, Apps: []string{"notes"}})
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		h.CloseSockets()
		srv.Close()
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	rec := store.MailboxRecord{Token: sha256.Sum256([]byte(token)), LastActive: time.Now().UnixNano()}
	if err := log.Claim("notes/"+id, rec, 0, true); err != nil {
		t.Fatal(err)
	}
	return srv, log
}

func dial(srv *httptest.Server) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, Subprotocols: []string{"zerobyte.v1"}}
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/notes/mailbox/" + id + "/c2p/watch"
	return d.Dial(url, http.Header{"Authorization": {"Bearer " + token}})
}

func TestNinthWatcherIsRefused(t *testing.T) {
	srv, _ := start(t)
	for i := range 8 {
		c, _, err := dial(srv)
		if err != nil {
			t.Fatalf("watcher %d: %v", i+1, err)
		}
		defer c.Close()
	}
	_, resp, err := dial(srv)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("ninth watcher: %v %v, want 429", err, resp)
	}
}

func TestWatchClosesOnAnythingButPing(t *testing.T) {
	srv, _ := start(t)
	c, _, err := dial(srv)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseUnsupportedData {
		t.Fatalf("read after a text other than ping: %v, want close 1003", err)
	}
}
