package ws_test

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/tlsconf"
	"edgerelay/fastpath/ws"
)

// The linger (conn.go): a close behind frames in flight reaches a peer
// that is sending as well, instead of being thrown away with the rest of
// the send buffer by the reset a socket closed with unread input gets.

// busyPeer is a client that keeps sending text frames (about 10 MB/s,
// paced: the drain's byte bound is for floods) until its socket fails, as
// a phone does.
func busyPeer(c *websocket.Conn) {
	msg := []byte(strings.Repeat("x", 1000))
	for c.WriteMessage(websocket.TextMessage, msg) == nil {
		time.Sleep(100 * time.Microsecond)
	}
}

// readClose reads until the client's read fails: the close code it got
// (-1: a reset or a bare EOF took the close frame), the frames before it
// and the error.
func readClose(c *websocket.Conn) (int, int, error) {
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	for n := 0; ; n++ {
		if _, _, err := c.ReadMessage(); err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, n, err
			}
			return -1, n, err
		}
	}
}

const (
	busyFrames    = 300 // 300 KB: on loopback the server's send buffer takes them at once
	busyRcvbuf    = 8 << 10
	busyRounds    = 10
	busyFrameSize = 1000
)

// queueFrames queues busyFrames frames for the peer.
func queueFrames(c *ws.Conn) {
	msg := []byte(strings.Repeat("y", busyFrameSize))
	for range busyFrames {
		_ = c.WriteText(msg)
	}
}

// closePath is one way a socket gets closed behind queued frames: the
// close it makes and the frames the peer gets before the close frame.
type closePath struct {
	name   string
	opts   ws.Options
	close  func(*ws.Conn) // after queueFrames; nil: the handler returns (1000)
	code   int
	frames int // -1: some, the write in progress (an overflow drops the backlog)
}

var closePaths = []closePath{
	{"Return1000", ws.Options{}, nil, ws.CloseNormal, busyFrames},
	{"Drain1001", ws.Options{}, func(c *ws.Conn) { c.Close(ws.CloseGoingAway, "draining") }, ws.CloseGoingAway, busyFrames},
	{"Replaced4000", ws.Options{}, func(c *ws.Conn) { c.Close(ws.CloseReplaced, "replaced") }, ws.CloseReplaced, busyFrames},
	{"QueueFull1013", ws.Options{OverflowCode: ws.CloseTryAgainLater, MaxQueue: 64 << 10}, func(c *ws.Conn) {
		for c.WriteText(make([]byte, busyFrameSize)) == nil {
		}
	}, ws.CloseTryAgainLater, -1},
}

// TestCloseReachesABusyPeer: on every close path, a peer that reads while
// it sends gets every frame queued before the close and then the close
// frame, whether the handler still reads (the router closed the socket
// from elsewhere) or stopped reading with the peer's frames unread; over
// TCP and TLS. Before the linger, the server's kernel had the frames (Write
// had returned) but the peer did not, and the reset dropped them.
func TestCloseReachesABusyPeer(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{false, true} {
		for _, path := range closePaths {
			for _, reading := range []bool{true, false} {
				name := map[bool]string{false: "TCP/", true: "TLS/"}[secure] + path.name +
					map[bool]string{true: "/HandlerReads", false: "/HandlerStopped"}[reading]
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					busyPeerGetsClose(t, secure, path, reading)
				})
			}
		}
	}
}

func busyPeerGetsClose(t *testing.T, secure bool, path closePath, reading bool) {
	byPeer := make(chan error, busyRounds)
	serve := func(c *ws.Conn) {
		if _, _, err := c.ReadMessage(); err != nil { // the peer is busy
			return
		}
		if !reading || path.close == nil {
			// Close with the peer's frames unread and return.
			queueFrames(c)
			if path.close != nil {
				path.close(c)
			}
			return
		}
		go func() { queueFrames(c); path.close(c) }()
		for {
			_, _, err := c.ReadMessage()
			var ce *ws.CloseError
			if err != nil {
				// The read ends at the peer's answer to the close.
				if !errors.As(err, &ce) || !ce.ByPeer {
					byPeer <- err
					return
				}
				byPeer <- nil
				return
			}
		}
	}
	var ts *testServer
	scheme := "ws://"
	if secure {
		ts, scheme = startTLSServer(t, path.opts, serve), "wss://"
	} else {
		ts = startServer(t, path.opts, serve)
	}
	go func() { // the handler took each one already
		for range ts.conns {
		}
	}()
	for i := range busyRounds {
		client := dialBusy(t, scheme+ts.addr)
		go busyPeer(client)
		code, n, err := readClose(client)
		if code != path.code || (path.frames >= 0 && n != path.frames) {
			t.Fatalf("round %d: the busy peer got %d frames, then %d (%v), want %d and the close frame %d",
				i, n, code, err, path.frames, path.code)
		}
		_ = client.Close()
		if reading && path.close != nil {
			if err := <-byPeer; err != nil {
				t.Fatalf("round %d: the handler's read ended with %v, want the peer's close", i, err)
			}
		}
	}
}

// dialBusy connects a fasthttp/websocket client with a small receive
// buffer to url (ws:// or wss://, any certificate).
func dialBusy(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{
		HandshakeTimeout: waitTimeout,
		NetDial:          smallBufferDialer(busyRcvbuf).Dial,
		TLSClientConfig:  &tls.Config{InsecureSkipVerify: true}, // the test's own certificate
	}
	c, resp, err := d.Dial(url+"/", nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	_ = resp.Body.Close()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startTLSServer is startServer behind TLS, with a development certificate.
func startTLSServer(t *testing.T, opts ws.Options, serve func(*ws.Conn)) *testServer {
	t.Helper()
	paths, err := tlsconf.EnsureDevCert(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(paths.Cert, paths.Key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}), opts, serve)
}

// lingerSlack is how late a bounded linger may end on a loaded machine.
const lingerSlack = 700 * time.Millisecond

// TestLingerIsBounded: a closed socket is held for its peer's close, but
// not without bound.
func TestLingerIsBounded(t *testing.T) {
	t.Parallel()
	const quiet = 250 * time.Millisecond // drainQuiet
	t.Run("QuietPeerWithEverything", func(t *testing.T) {
		t.Parallel()
		// A peer that neither reads nor sends, whose kernel has taken
		// the close frame: released after the quiet time, well within
		// CloseTimeout.
		ts := startServer(t, ws.Options{CloseTimeout: waitTimeout}, nil)
		rc := dialRaw(t, ts.addr, 0)
		c := ts.accept(t)
		go func() { _, _, _ = c.ReadMessage() }() // the handler reads on
		start := time.Now()
		c.Close(ws.CloseGoingAway, "")
		waitDone(t, c, waitTimeout)
		if d := time.Since(start); d < quiet || d > quiet+lingerSlack {
			t.Fatalf("a quiet peer held the close %v, want about %v", d, quiet)
		}
		rc.expectClose(ws.CloseGoingAway) // it was there all along, and then the end
	})
	t.Run("PeerWithoutEverything", func(t *testing.T) {
		t.Parallel()
		// A peer that does not read, whose kernel has not taken all of
		// it (its receive buffer is full): held until CloseTimeout, not
		// past it.
		const closeTimeout = 600 * time.Millisecond
		ts := startServer(t, ws.Options{CloseTimeout: closeTimeout}, nil)
		_ = dialRaw(t, ts.addr, busyRcvbuf)
		c := ts.accept(t)
		queueFrames(c) // fits the server's send buffer, not the peer's
		start := time.Now()
		c.Close(ws.CloseGoingAway, "")
		waitDone(t, c, waitTimeout)
		if d := time.Since(start); d < closeTimeout || d > closeTimeout+lingerSlack {
			t.Fatalf("a peer that does not read held the close %v, want CloseTimeout %v", d, closeTimeout)
		}
	})
	t.Run("FloodingPeer", func(t *testing.T) {
		t.Parallel()
		// A peer that floods after the close is cut at the byte bound,
		// well before CloseTimeout.
		ts := startServer(t, ws.Options{CloseTimeout: waitTimeout}, nil)
		rc := dialRaw(t, ts.addr, 0)
		c := ts.accept(t)
		go func() { _, _, _ = c.ReadMessage() }()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			f := frame(fin|ws.OpBinary, make([]byte, 32<<10))
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = rc.nc.SetWriteDeadline(time.Now().Add(waitTimeout))
				if _, err := rc.nc.Write(f); err != nil {
					return
				}
			}
		}()
		start := time.Now()
		c.Close(ws.CloseGoingAway, "")
		waitDone(t, c, waitTimeout)
		if d := time.Since(start); d > waitTimeout/2 {
			t.Fatalf("a flooding peer held the close %v, want the byte bound to end it before CloseTimeout %v", d, waitTimeout)
		}
	})
}
