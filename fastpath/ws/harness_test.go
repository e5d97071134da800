package ws_test

// The harness: a real fasthttp server on a loopback port whose handler runs
// CheckHandshake and Upgrade, and two kinds of client, fasthttp/websocket's
// Dialer (an independent implementation of RFC 6455) and a raw TCP
// connection that writes hand-built frames, including the broken ones no
// library produces.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/netlimit"
	"edgerelay/fastpath/ws"
)

// testParker, when WS_TEST_PARK=1, serves every test server's sockets
// detached and parked, and the collector and echo read through Serve:
// make test runs the package both ways.
var testParker *ws.Parker

func TestMain(m *testing.M) {
	if os.Getenv("WS_TEST_PARK") == "1" {
		p, err := ws.NewParker()
		if err != nil {
			fmt.Fprintln(os.Stderr, "WS_TEST_PARK=1:", err)
			os.Exit(2)
		}
		testParker = p
	}
	code := m.Run()
	if testParker != nil {
		_ = testParker.Close()
	}
	os.Exit(code)
}

// waitTimeout bounds every wait for something that should happen promptly;
// it only matters when a test is about to fail.
const waitTimeout = 10 * time.Second

// testServer upgrades every valid handshake on a loopback port.
type testServer struct {
	addr  string
	conns chan *ws.Conn // every upgraded Conn, in order
	stop  chan struct{} // closed when the test ends
	wg    sync.WaitGroup

	// mu orders a handler's wg.Add against the end of the test: an Add
	// from zero while the cleanup Waits is a race.
	mu    sync.Mutex
	ended bool
}

// startServer serves WebSockets with opts. serve runs for each upgraded
// Conn; nil means "hand off": the Conn is only sent on conns, the test
// goroutine is its reader, and the hijack handler returns once the Conn is
// done (or the test ends). Refused handshakes get 400 with the error text
// and an X-Is-Upgrade header telling what ws.IsUpgrade said. A client that
// offers the subprotocol "chat" gets it.
func startServer(t testing.TB, opts ws.Options, serve func(*ws.Conn)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, opts, serve)
}

// serveOn is startServer on ln (a TLS listener, say).
func serveOn(t testing.TB, ln net.Listener, opts ws.Options, serve func(*ws.Conn)) *testServer {
	t.Helper()
	if _, plain := ln.(*net.TCPListener); plain {
		// As in the relay: netlimit's connections, which write a frame
		// queued after a pause at once (Conn.writeNow).
		ln = netlimit.Wrap(ln, netlimit.Limits{}, nil)
	}
	ts := &testServer{
		addr:  ln.Addr().String(),
		conns: make(chan *ws.Conn, 16),
		stop:  make(chan struct{}),
	}
	if testParker != nil && opts.Parker == nil {
		opts.Parker, opts.Detach = testParker, true
	}
	settings := ws.NewSettings(opts)
	srv := &fasthttp.Server{
		KeepHijackedConns: opts.Detach, // Detach needs it
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := ws.CheckHandshake(ctx); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadRequest) // resets the headers: Refusal after it
				ctx.SetStatusCode(ws.Refusal(ctx, err))
				ctx.Response.Header.Set("X-Is-Upgrade", fmt.Sprint(ws.IsUpgrade(ctx)))
				return
			}
			proto := ""
			ws.Subprotocols(ctx, func(p []byte) bool {
				if string(p) == "chat" {
					proto = "chat"
					return false
				}
				return true
			})
			ts.mu.Lock()
			if ts.ended {
				ts.mu.Unlock()
				ctx.Error("the test has ended", fasthttp.StatusServiceUnavailable)
				return
			}
			ts.wg.Add(1)
			ts.mu.Unlock()
			ws.Upgrade(ctx, settings, proto, nil, func(c *ws.Conn) {
				defer ts.wg.Done()
				ts.conns <- c
				if serve != nil {
					serve(c)
					return
				}
				select {
				case <-c.Done():
				case <-ts.stop:
				}
			})
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ts.mu.Lock()
		ts.ended = true
		ts.mu.Unlock()
		close(ts.stop)
		_ = ln.Close()
		// Every hijack handler must return: a Conn outliving its test is
		// a leak (a writer that never finishes, a reader never woken).
		done := make(chan struct{})
		go func() { ts.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Errorf("hijack handlers still running %v after the test", waitTimeout)
		}
	})
	return ts
}

// accept returns the next Conn the server upgraded.
func (ts *testServer) accept(t testing.TB) *ws.Conn {
	t.Helper()
	select {
	case c := <-ts.conns:
		return c
	case <-time.After(waitTimeout):
		t.Fatal("no connection was upgraded")
		return nil
	}
}

// message is one data message a server-side reader received, or the error
// its read ended with.
type message struct {
	op   int
	data []byte
	err  error
}

// collector is a serve function that reads until the Conn fails and
// reports, in order, each message (copied) and the final error.
type collector struct {
	events chan message
}

func newCollector() *collector { return &collector{events: make(chan message, 256)} }

func (col *collector) serve(c *ws.Conn) {
	if testParker != nil {
		c.Serve(func(op int, p []byte) bool {
			col.events <- message{op: op, data: bytes.Clone(p)}
			return true
		}, func(err error) { col.events <- message{err: err} })
		return
	}
	for {
		op, p, err := c.ReadMessage()
		if err != nil {
			col.events <- message{err: err}
			return
		}
		col.events <- message{op: op, data: bytes.Clone(p)}
	}
}

func (col *collector) event(t testing.TB) message {
	t.Helper()
	select {
	case m := <-col.events:
		return m
	case <-time.After(waitTimeout):
		t.Fatal("the server's reader reported nothing")
	}
	return message{}
}

// next returns the next message the server read.
func (col *collector) next(t testing.TB) message {
	t.Helper()
	m := col.event(t)
	if m.err != nil {
		t.Fatalf("server read ended with %v, expected a message", m.err)
	}
	return m
}

// err returns the error the server's read ended with.
func (col *collector) err(t testing.TB) error {
	t.Helper()
	m := col.event(t)
	if m.err == nil {
		t.Fatalf("server read a message (op %d, %d bytes), expected its read to fail", m.op, len(m.data))
	}
	return m.err
}

// expectCloseError checks that err is the *ws.CloseError ReadMessage
// returns for code.
func expectCloseError(t testing.TB, err error, code int, byPeer bool) *ws.CloseError {
	t.Helper()
	var ce *ws.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("server read ended with %v (%T), expected a *ws.CloseError", err, err)
	}
	if ce.Code != code || ce.ByPeer != byPeer {
		t.Fatalf("server read ended with %v: code %d byPeer %v, expected code %d byPeer %v",
			ce, ce.Code, ce.ByPeer, code, byPeer)
	}
	return ce
}

// echo is a serve function that sends every message back with its type.
func echo(c *ws.Conn) {
	if testParker != nil {
		c.Serve(func(op int, p []byte) bool {
			if op == ws.OpText {
				return c.WriteText(p) == nil
			}
			return c.WriteBinary(p) == nil
		}, func(error) {})
		return
	}
	for {
		op, p, err := c.ReadMessage()
		if err != nil {
			return
		}
		if op == ws.OpText {
			err = c.WriteText(p)
		} else {
			err = c.WriteBinary(p)
		}
		if err != nil {
			return
		}
	}
}

// dialGorilla connects a fasthttp/websocket client. A rcvbuf above zero
// shrinks the client's socket receive buffer, so that a client that does
// not read stalls the server's writer early.
func dialGorilla(t testing.TB, addr string, rcvbuf int, subprotocols ...string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{
		HandshakeTimeout: waitTimeout,
		Subprotocols:     subprotocols,
		NetDial:          smallBufferDialer(rcvbuf).Dial,
	}
	c, resp, err := d.Dial("ws://"+addr+"/", nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = resp.Body.Close()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// smallBufferDialer dials with a receive buffer of rcvbuf bytes (when above
// zero), set before the connection exists. Shrunk afterwards, the window
// falls below the segment size the server's kernel chose from the first,
// larger one (half the largest window seen), and on loopback the server
// then sends only when its persist timer fires, with a growing backoff: a
// reading client would look stalled for seconds.
func smallBufferDialer(rcvbuf int) *net.Dialer {
	d := &net.Dialer{}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return d
}

// rawClient is a TCP connection that completed the handshake and speaks
// frames built by hand.
type rawClient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

const handshakeKey = "dGhlIHNhbXBsZSBub25jZQ==" // the example key of RFC 6455

func upgradeRequest(addr string) string {
	return "GET /ws HTTP/1.1\r\nHost: " + addr + "\r\n" +
		"Upgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + handshakeKey + "\r\nSec-WebSocket-Version: 13\r\n\r\n"
}

// roundTrip writes a raw HTTP request and parses the response.
func roundTrip(t testing.TB, addr, request string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(nc, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	_ = nc.SetDeadline(time.Time{})
	return resp, nc, br
}

// dialRaw completes a handshake by hand. A rcvbuf above zero shrinks the
// client's receive buffer.
func dialRaw(t testing.TB, addr string, rcvbuf int) *rawClient {
	t.Helper()
	resp, nc, br := roundTrip(t, addr, upgradeRequest(addr))
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake answered %s", resp.Status)
	}
	if rcvbuf > 0 {
		if err := nc.(*net.TCPConn).SetReadBuffer(rcvbuf); err != nil {
			t.Fatal(err)
		}
	}
	return &rawClient{t: t, nc: nc, br: br}
}

// send writes frames in one write.
func (rc *rawClient) send(frames ...[]byte) {
	rc.t.Helper()
	_ = rc.nc.SetWriteDeadline(time.Now().Add(waitTimeout))
	if _, err := rc.nc.Write(bytes.Join(frames, nil)); err != nil {
		rc.t.Fatalf("client write: %v", err)
	}
}

// wireFrame is one frame the server sent.
type wireFrame struct {
	fin     bool
	op      int
	payload []byte
}

// readFrame reads one server frame, checking what every server frame must
// satisfy: no reserved bits, no mask, the shortest length encoding.
func (rc *rawClient) readFrame() (wireFrame, error) {
	rc.t.Helper()
	_ = rc.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	var h [8]byte
	if _, err := io.ReadFull(rc.br, h[:2]); err != nil {
		return wireFrame{}, err
	}
	f := wireFrame{fin: h[0]&0x80 != 0, op: int(h[0] & 0x0f)}
	if h[0]&0x70 != 0 {
		rc.t.Errorf("server frame has reserved bits %#x", h[0]&0x70)
	}
	if h[1]&0x80 != 0 {
		rc.t.Errorf("server frame is masked")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(rc.br, h[:2]); err != nil {
			return wireFrame{}, err
		}
		n = uint64(binary.BigEndian.Uint16(h[:2]))
		if n < 126 {
			rc.t.Errorf("length %d sent in 16 bits", n)
		}
	case 127:
		if _, err := io.ReadFull(rc.br, h[:8]); err != nil {
			return wireFrame{}, err
		}
		n = binary.BigEndian.Uint64(h[:8])
		if n <= 0xffff {
			rc.t.Errorf("length %d sent in 64 bits", n)
		}
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(rc.br, f.payload); err != nil {
		return wireFrame{}, err
	}
	return f, nil
}

// expectFrame reads the next frame and checks that it is a whole message
// of type op carrying payload.
func (rc *rawClient) expectFrame(op int, payload []byte) {
	rc.t.Helper()
	f, err := rc.readFrame()
	if err != nil {
		rc.t.Fatalf("expected a frame with op %d: %v", op, err)
	}
	if !f.fin || f.op != op || !bytes.Equal(f.payload, payload) {
		rc.t.Fatalf("got frame fin=%v op=%d payload %q, expected fin op=%d payload %q",
			f.fin, f.op, clip(f.payload), op, clip(payload))
	}
}

// expectClose reads the next frame, checks that it is a close frame with
// code, and then that the server ends the TCP connection.
func (rc *rawClient) expectClose(code int) string {
	rc.t.Helper()
	f, err := rc.readFrame()
	if err != nil {
		rc.t.Fatalf("expected a close frame with %d: %v", code, err)
	}
	if f.op != ws.OpClose || len(f.payload) < 2 {
		rc.t.Fatalf("got frame op=%d payload %q, expected a close frame with %d", f.op, clip(f.payload), code)
	}
	if got := int(binary.BigEndian.Uint16(f.payload)); got != code {
		rc.t.Fatalf("close frame has code %d (%q), expected %d", got, f.payload[2:], code)
	}
	rc.expectEnd()
	return string(f.payload[2:])
}

// expectEnd checks that the server ends the connection without sending
// anything more.
func (rc *rawClient) expectEnd() {
	rc.t.Helper()
	f, err := rc.readFrame()
	if err == nil {
		rc.t.Fatalf("got frame op=%d payload %q, expected the connection to end", f.op, clip(f.payload))
	}
	if !isEnd(err) {
		rc.t.Fatalf("read ended with %v, expected EOF or a reset", err)
	}
}

// isEnd reports whether err is the end of a connection the peer closed,
// as opposed to a timeout.
func isEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// Frame building. b0 is the first header byte: FIN, reserved bits, opcode.
const (
	fin  = 0x80
	rsv1 = 0x40
	rsv2 = 0x20
	rsv3 = 0x10
)

var maskKey = [4]byte{0x37, 0xfa, 0x21, 0x3d}

// frame builds a masked client frame.
func frame(b0 byte, payload []byte) []byte { return buildFrame(b0, payload, true) }

// textFrame is frame(fin|text) for a string.
func textFrame(s string) []byte { return frame(fin|ws.OpText, []byte(s)) }

// closeFrame builds a masked close frame with code and reason.
func closeFrame(code int, reason string) []byte {
	body := binary.BigEndian.AppendUint16(nil, uint16(code))
	return frame(fin|ws.OpClose, append(body, reason...))
}

func buildFrame(b0 byte, payload []byte, masked bool) []byte {
	var maskBit byte
	if masked {
		maskBit = 0x80
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, maskBit|byte(n))
	case n <= 0xffff:
		f = append(f, maskBit|126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	default:
		f = append(f, maskBit|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	if !masked {
		return append(f, payload...)
	}
	f = append(f, maskKey[:]...)
	for i, b := range payload {
		f = append(f, b^maskKey[i&3])
	}
	return f
}

// header64 is the header of a masked frame that announces n payload bytes
// in the 64-bit form, without the payload.
func header64(b0 byte, n uint64) []byte {
	f := binary.BigEndian.AppendUint64([]byte{b0, 0x80 | 127}, n)
	return append(f, maskKey[:]...)
}

// pattern is n deterministic printable bytes.
func pattern(n int, seed int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = 'a' + byte((i+seed)%26)
	}
	return p
}

// clip shortens a payload for a failure message.
func clip(p []byte) string {
	if len(p) > 40 {
		return string(p[:40]) + fmt.Sprintf("...(%d bytes)", len(p))
	}
	return string(p)
}

// waitFor polls cond until it holds or waitTimeout passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitDone waits for the Conn's writer to finish.
func waitDone(t testing.TB, c *ws.Conn, within time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(within):
		t.Fatalf("Conn not done within %v", within)
	}
}

func isDone(c *ws.Conn) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}
