package mailbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/sdk/link"
)

// Subprotocol is the WebSocket subprotocol of watch sockets; BearerSubprotocol
// prefixes the bearer when it travels as a second offered subprotocol, which
// is how browsers (which cannot set Authorization on a WebSocket) send it.
const (
	Subprotocol       = "zerobyte.v1"
	BearerSubprotocol = "zerobyte.bearer."
)

// writeTimeout bounds a ping or close frame on a watch socket, so that a
// stalled connection cannot block Ping or Close for ever.
const writeTimeout = 10 * time.Second

// closeWait is how long Close waits for the relay to answer its close frame
// before it drops the connection.
const closeWait = time.Second

// ErrWatchClosed is returned by Next after Close.
var ErrWatchClosed = errors.New("mailbox: watch closed")

// Watch opens a watch socket on direction dir: the relay sends every envelope
// stored above sequence after, in ascending order, then each new one as it is
// stored. With bearerInSubprotocol the bearer is offered as the subprotocol
// zerobyte.bearer.<token> (as a browser must), else it goes in Authorization.
//
// ctx bounds the opening only. An answer other than 101 (401, 404, 429
// too_many_watchers, ...) is an *Error. The relay must answer with the
// subprotocol zerobyte.v1 and nothing else; in particular it must never echo
// the bearer, and a relay that does is refused.
func (m *Mailbox) Watch(ctx context.Context, dir link.Direction, after uint64, bearerInSubprotocol bool) (*Watch, error) {
	if err := checkDir(dir); err != nil {
		return nil, fmt.Errorf("mailbox: watch: %w", err)
	}
	op := fmt.Sprintf("watch %s after %d", dir, after)
	u, err := m.watchURL(dir, after)
	if err != nil {
		return nil, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	// A copy, so that the caller's Dialer (maybe shared) is not changed.
	d := *websocket.DefaultDialer
	if m.c.Dialer != nil {
		d = *m.c.Dialer
	}
	d.Subprotocols = []string{Subprotocol}
	header := http.Header{}
	if bearerInSubprotocol {
		d.Subprotocols = append(d.Subprotocols, BearerSubprotocol+m.Token)
	} else {
		header.Set("Authorization", "Bearer "+m.Token)
	}

	conn, resp, err := d.DialContext(ctx, u, header)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer drain(resp)
			return nil, fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
		}
		return nil, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	if got := resp.Header.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != Subprotocol {
		_ = conn.Close()
		// The answer is not quoted: it may hold the bearer.
		return nil, fmt.Errorf("mailbox: %s: relay answered a subprotocol other than exactly %s", op, Subprotocol)
	}

	w := &Watch{
		conn:   conn,
		frames: make(chan []byte),
		pongs:  make(chan struct{}, 1),
		done:   make(chan struct{}),
		ended:  make(chan struct{}),
	}
	go w.readLoop()
	return w, nil
}

// watchURL is the ws(s) URL of dir's watch endpoint.
func (m *Mailbox) watchURL(dir link.Direction, after uint64) (string, error) {
	base, err := url.Parse(strings.TrimSuffix(m.c.BaseURL, "/"))
	if err != nil {
		return "", fmt.Errorf("base URL: %w", err)
	}
	switch base.Scheme {
	case "http", "ws":
		base.Scheme = "ws"
	case "https", "wss":
		base.Scheme = "wss"
	default:
		return "", fmt.Errorf("base URL scheme %q is not http(s) or ws(s)", base.Scheme)
	}
	return base.String() + m.path(string(dir)+"/watch") + "?after=" + strconv.FormatUint(after, 10), nil
}

// Watch is an open watch socket. Next returns its envelopes; Ping and Pongs
// keep the reader in the foreground (the relay sends no push for 45 s after a
// ping). Next is meant for one goroutine; Ping, Pongs and Close may be called
// from any.
//
// A goroutine reads the socket and hands each envelope to Next, one at a
// time: it reads nothing more until Next takes it, so a Watch buffers one
// envelope at most and a slow reader leaves the rest with the relay (which
// closes a socket that falls more than 1 MiB behind with 1013: watch again
// with after = the last sequence accepted). The relay's WebSocket-level pings
// are answered only while that goroutine reads, so call Next promptly.
type Watch struct {
	conn   *websocket.Conn
	frames chan []byte   // envelopes, from readLoop to Next
	pongs  chan struct{} // one pending pong notice at most
	done   chan struct{} // closed by Close
	ended  chan struct{} // closed when readLoop returns, after err is set
	err    error         // why readLoop returned

	writeMu   sync.Mutex // one writer at a time, as the websocket package requires
	closeOnce sync.Once
}

func (w *Watch) readLoop() {
	defer close(w.ended)
	for {
		typ, data, err := w.conn.ReadMessage()
		if err != nil {
			select {
			case <-w.done:
				w.err = ErrWatchClosed
			default:
				w.err = err
			}
			return
		}
		switch {
		case typ == websocket.BinaryMessage:
			select {
			case w.frames <- data:
			case <-w.done:
				w.err = ErrWatchClosed
				return
			}
		case typ == websocket.TextMessage && string(data) == "pong":
			select {
			case w.pongs <- struct{}{}:
			default: // one unread notice says as much as two
			}
		default:
			w.err = fmt.Errorf("unexpected text frame %.32q from the relay", data)
			_ = w.conn.Close()
			return
		}
	}
}

// Next returns the next envelope. It fails with ctx's error when ctx ends
// first (the Watch stays usable), with ErrWatchClosed after Close, and with
// the socket's error when the relay closed it (see CloseCode: 1000 when the
// mailbox was erased, 1013 when this reader fell too far behind); after a
// socket error every call returns the same.
func (w *Watch) Next(ctx context.Context) ([]byte, error) {
	select {
	case env := <-w.frames:
		return env, nil
	case <-w.ended:
		if errors.Is(w.err, ErrWatchClosed) {
			return nil, ErrWatchClosed
		}
		return nil, fmt.Errorf("mailbox: watch: %w", w.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Ping sends the text frame "ping" and returns once it is sent. The relay
// answers "pong" and treats the reader as in the foreground for 45 s; the
// pong is not an envelope, so Next skips it and Pongs reports it.
func (w *Watch) Ping() error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	_ = w.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := w.conn.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		return fmt.Errorf("mailbox: watch: ping: %w", err)
	}
	return nil
}

// Pongs receives a value when a "pong" arrived since the last receive
// (several pongs in between make one value).
func (w *Watch) Pongs() <-chan struct{} { return w.pongs }

// Close ends the watch with close code 1000: it sends the close frame, waits
// a moment for the relay's answer, then drops the connection. It returns once
// the reading goroutine has ended. Calling it again does nothing. The close
// is best effort (the relay may be gone already), so it returns nil; the
// error result is there to satisfy io.Closer.
func (w *Watch) Close() error {
	w.closeOnce.Do(func() {
		close(w.done)
		w.writeMu.Lock()
		err := w.conn.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(writeTimeout))
		w.writeMu.Unlock()
		if err == nil {
			select {
			case <-w.ended: // the relay answered, which ended the read
			case <-time.After(closeWait):
			}
		}
		_ = w.conn.Close()
		<-w.ended
	})
	return nil
}
