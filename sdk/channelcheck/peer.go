package channelcheck

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/fasthttp/websocket"
)

// peer is one WebSocket the checker holds: a computer's control socket or a
// phone channel. A goroutine reads it continuously, so that every wait is a
// select on a channel bounded by the step's context, the relay's pings are
// answered at any time, and the moment the relay closes the socket is seen
// even when no check is reading.
type peer struct {
	name string
	conn *websocket.Conn
	// closeWait bounds writing our own close frame.
	closeWait time.Duration

	// msgs carries the messages read, in order, and is closed when the
	// socket ends; err then holds why.
	msgs chan wsMessage
	err  error
	// stop is closed by close, so a reader blocked on a full msgs returns.
	stop      chan struct{}
	done      chan struct{} // closed when the reader has returned
	closeOnce sync.Once
}

type wsMessage struct {
	kind int // websocket.TextMessage or websocket.BinaryMessage
	data []byte
}

// errStopped ends a reader that we closed ourselves.
var errStopped = errors.New("closed by the checker")

// dial opens a WebSocket to path with the given headers and starts reading
// it. A refused upgrade is reported with the relay's status and body, which
// carry the relay's reason.
func (c *checker) dial(ctx context.Context, name, path string, header http.Header) (*peer, error) {
	u := *c.wsURL
	u.Path += path
	conn, resp, err := c.dialer.DialContext(ctx, u.String(), header)
	if err != nil {
		if resp != nil && errors.Is(err, websocket.ErrBadHandshake) {
			c.noteNoStore("GET "+path, resp)
			return nil, fmt.Errorf("%s: upgrade refused: HTTP %d %s", name, resp.StatusCode, readBody(resp))
		}
		return nil, fmt.Errorf("%s: dial %s: %w", name, path, err)
	}
	p := &peer{
		name:      name,
		conn:      conn,
		closeWait: c.o.Timeout,
		msgs:      make(chan wsMessage, 64),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	c.peers = append(c.peers, p)
	go p.read()
	return p, nil
}

func (p *peer) read() {
	defer close(p.done)
	defer close(p.msgs)
	for {
		kind, data, err := p.conn.ReadMessage()
		if err != nil {
			p.err = err
			return
		}
		select {
		case p.msgs <- wsMessage{kind: kind, data: data}:
		case <-p.stop:
			p.err = errStopped
			return
		}
	}
}

// next returns the socket's next message, or an error when the socket
// ended first (a *closedError) or ctx ended.
func (p *peer) next(ctx context.Context) (wsMessage, error) {
	select {
	case m, ok := <-p.msgs:
		if !ok {
			return wsMessage{}, &closedError{peer: p.name, err: p.err}
		}
		return m, nil
	case <-ctx.Done():
		return wsMessage{}, fmt.Errorf("%s: waiting for a message: %w", p.name, ctx.Err())
	}
}

// closed reports whether the reader has seen the socket end.
func (p *peer) closed() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// writeText sends one text frame, bounded by ctx's deadline.
func (p *peer) writeText(ctx context.Context, data []byte) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = p.conn.SetWriteDeadline(dl)
	}
	if err := p.conn.WriteMessage(websocket.TextMessage, data); err != nil {
		return fmt.Errorf("%s: write %d bytes: %w", p.name, len(data), err)
	}
	return nil
}

// close ends the socket from our side: a 1000 close frame (best effort,
// bounded) and then the TCP connection, which also ends the reader.
func (p *peer) close() {
	p.closeOnce.Do(func() {
		close(p.stop)
		msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
		_ = p.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(p.closeWait))
		_ = p.conn.Close()
	})
}

// closedError is how a socket ended while the checker was waiting on it.
type closedError struct {
	peer string
	err  error
}

func (e *closedError) Error() string {
	return fmt.Sprintf("%s: socket ended: %s", e.peer, describeClose(e.err))
}

func (e *closedError) Unwrap() error { return e.err }

// closeCode is the code of the close frame the relay sent, or 1006
// (abnormal closure) when the socket ended without one.
func closeCode(err error) int {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return websocket.CloseAbnormalClosure
}

func describeClose(err error) string {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		if ce.Text != "" {
			return fmt.Sprintf("close code %d (%q)", ce.Code, ce.Text)
		}
		return fmt.Sprintf("close code %d", ce.Code)
	}
	return fmt.Sprintf("no close frame (%v)", err)
}
