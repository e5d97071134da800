package ws_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

// Options.SilenceTimeout: a socket from which no frame arrives for that long
// is closed with 1001; any frame (data, ping, pong) resets the clock; the
// pong rule is off; pings still go out.
//
// The durations are long next to scheduling delays on a loaded machine
// (a frame every half timeout leaves half a timeout of slack), so the tests
// that wait for several timeouts run in parallel.

const (
	silence      = time.Second
	silenceSlack = 3 * time.Second // how late the 1001 may come
)

// closeOrEnd reads server frames until a close frame or the end of the
// connection, counting pings and skipping pongs on the way. It does not
// stop the test, so that a goroutine may call it.
func (rc *rawClient) closeOrEnd() (code int, reason string, pings int, err error) {
	for {
		f, err := rc.readFrame()
		if err != nil {
			return 0, "", pings, err
		}
		switch f.op {
		case ws.OpPing:
			pings++
		case ws.OpPong:
		case ws.OpClose:
			if len(f.payload) < 2 {
				return 0, "", pings, fmt.Errorf("close frame without a code: %q", f.payload)
			}
			return int(binary.BigEndian.Uint16(f.payload)), string(f.payload[2:]), pings, nil
		default:
			return 0, "", pings, fmt.Errorf("unexpected frame op=%d payload %q", f.op, clip(f.payload))
		}
	}
}

// expectSilenceClose checks that the server closed rc with 1001 "silent
// too long" no sooner than silence after since and not much later, that
// the TCP connection then ends, and that the Conn ends with CloseCode 1001.
// It returns how many pings came before the close.
func expectSilenceClose(t *testing.T, rc *rawClient, c *ws.Conn, since time.Time) int {
	t.Helper()
	code, reason, pings, err := rc.closeOrEnd()
	d := time.Since(since)
	if err != nil {
		t.Fatalf("connection ended without a close frame after %v (%d pings): %v", d, pings, err)
	}
	if code != ws.CloseGoingAway || reason != "silent too long" {
		t.Fatalf("close %d %q after %v, expected 1001 \"silent too long\"", code, reason, d)
	}
	if d < silence {
		t.Fatalf("closed for silence %v after the last frame, before the timeout %v", d, silence)
	}
	if d > silence+silenceSlack {
		t.Fatalf("closed for silence %v after the last frame, expected about %v", d, silence)
	}
	rc.expectEnd()
	waitDone(t, c, waitTimeout)
	if got := c.CloseCode(); got != ws.CloseGoingAway {
		t.Errorf("CloseCode %d, expected 1001", got)
	}
	return pings
}

// A raw client that sends nothing after the handshake is closed with 1001
// once the timeout has passed, and the server's reader ends.
func TestSilentClientClosedWith1001(t *testing.T) {
	t.Parallel()
	col := newCollector()
	ts := startServer(t, ws.Options{SilenceTimeout: silence}, col.serve)
	start := time.Now() // before the request, so before the server's clock starts
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	expectSilenceClose(t, rc, c, start)
	var ce *ws.CloseError
	if err := col.err(t); errors.As(err, &ce) && ce.ByPeer {
		t.Errorf("read ended with %v, as if the peer had closed", err)
	}
}

// A client that stalls in the middle of a frame is just as silent: it is
// closed with 1001 too, not with the 1000 of a reader that merely returned.
func TestClientSilentInsideAFrameClosedWith1001(t *testing.T) {
	t.Parallel()
	col := newCollector()
	ts := startServer(t, ws.Options{SilenceTimeout: silence}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	// Header and mask of a 5-byte text frame, then only 2 payload bytes.
	f := textFrame("hello")
	start := time.Now()
	rc.send(f[:len(f)-3])
	expectSilenceClose(t, rc, c, start)
	if err := col.err(t); err == nil {
		t.Fatal("expected the read to fail")
	}
}

// Every frame resets the clock: a raw client that sends a frame (text or
// ping, alternately) every half timeout, and never answers the server's
// pings, stays open for several timeouts; once it stops, it is closed a
// timeout after its last frame.
func TestFramesEveryHalfTimeoutKeepClientOpen(t *testing.T) {
	t.Parallel()
	col := newCollector()
	ts := startServer(t, ws.Options{SilenceTimeout: silence, PingInterval: silence / 4}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	// The server's pings are read (and ignored) on the side so that
	// nothing backs up, and so that a close or an end shows at once.
	type result struct {
		code  int
		pings int
		err   error
		at    time.Time
	}
	ended := make(chan result, 1)
	go func() {
		code, _, pings, err := rc.closeOrEnd()
		ended <- result{code, pings, err, time.Now()}
	}()

	texts := 0
	tick := time.NewTicker(silence / 2)
	defer tick.Stop()
	var last time.Time
	for i := range 8 { // four timeouts
		select {
		case r := <-ended:
			t.Fatalf("connection ended (close %d, %v) after %d frames sent every %v", r.code, r.err, i, silence/2)
		case <-tick.C:
		}
		last = time.Now()
		if i%2 == 0 {
			rc.send(textFrame("here"))
			texts++
		} else {
			rc.send(frame(fin|ws.OpPing, []byte("me too")))
		}
	}
	if isDone(c) || c.CloseCode() != 0 {
		t.Fatalf("server closed a client that sent a frame every half timeout (CloseCode %d)", c.CloseCode())
	}
	for range texts {
		if m := col.next(t); string(m.data) != "here" {
			t.Fatalf("server read %q", m.data)
		}
	}

	// Now silent: the clock runs from the last frame.
	var r result
	select {
	case r = <-ended:
	case <-time.After(silence + silenceSlack + waitTimeout):
		t.Fatal("a client silent after its frames was never closed")
	}
	d := r.at.Sub(last)
	if r.err != nil || r.code != ws.CloseGoingAway {
		t.Fatalf("after going silent: close %d, %v; expected 1001", r.code, r.err)
	}
	if d < silence || d > silence+silenceSlack {
		t.Fatalf("closed %v after the last frame, expected about %v", d, silence)
	}
	if r.pings < 4 {
		t.Errorf("%d pings over more than four timeouts, expected pings every %v", r.pings, silence/4)
	}
	rc.expectEnd()
	waitDone(t, c, waitTimeout)
}

// The pong rule is off: a raw client that never answers a ping but sends
// data regularly stays open across many ping intervals, and the pings keep
// coming.
func TestSilenceTimeoutDisablesThePongRule(t *testing.T) {
	t.Parallel()
	const interval = 50 * time.Millisecond
	col := newCollector()
	ts := startServer(t, ws.Options{SilenceTimeout: silence, PingInterval: interval}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	var pings atomic.Int32
	ended := make(chan int, 1) // the close code, 0 for an end without one
	go func() {
		for {
			f, err := rc.readFrame()
			if err != nil {
				ended <- 0
				return
			}
			switch f.op {
			case ws.OpPing:
				pings.Add(1)
			case ws.OpClose:
				ended <- int(binary.BigEndian.Uint16(f.payload))
				return
			}
		}
	}()

	tick := time.NewTicker(silence / 4)
	defer tick.Stop()
	sent := 0
	for pings.Load() < 12 { // 12 unanswered pings: the pong rule drops at the second
		select {
		case code := <-ended:
			t.Fatalf("server ended the connection (close code %d) after %d unanswered pings", code, pings.Load())
		case <-tick.C:
		case <-time.After(waitTimeout):
			t.Fatalf("only %d pings", pings.Load())
		}
		rc.send(textFrame("data"))
		sent++
	}
	if isDone(c) || c.CloseCode() != 0 {
		t.Fatalf("server closed the connection (CloseCode %d)", c.CloseCode())
	}
	for range sent {
		if m := col.next(t); string(m.data) != "data" {
			t.Fatalf("server read %q", m.data)
		}
	}
	rc.send(closeFrame(ws.CloseNormal, ""))
	select {
	case code := <-ended:
		if code != ws.CloseNormal {
			t.Fatalf("close code %d, expected the echoed 1000", code)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no echo of the close")
	}
	expectCloseError(t, col.err(t), ws.CloseNormal, true)
}

// A raw client that reads the server's pings but answers none and sends
// nothing else is silent: it is closed with 1001 at the timeout, after
// several pings (not aborted by the pong rule at the second tick).
func TestUnansweredPingsDoNotKeepClientOpen(t *testing.T) {
	t.Parallel()
	col := newCollector()
	ts := startServer(t, ws.Options{SilenceTimeout: silence, PingInterval: silence / 5}, col.serve)
	start := time.Now()
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	if pings := expectSilenceClose(t, rc, c, start); pings < 3 {
		t.Errorf("%d pings before the close, expected about 5", pings)
	}
	if err := col.err(t); err == nil {
		t.Fatal("expected the read to fail")
	}
}

// Pongs are frames: a fasthttp/websocket client that only reads answers
// the server's pings by itself and, with PingInterval below the timeout,
// stays open for several timeouts without sending anything else.
func TestPongsKeepReadingClientOpen(t *testing.T) {
	t.Parallel()
	col := newCollector()
	ts := startServer(t, ws.Options{SilenceTimeout: silence, PingInterval: silence / 4}, col.serve)
	client := dialGorilla(t, ts.addr, 0)
	c := ts.accept(t)

	var pings atomic.Int32
	defaultHandler := client.PingHandler()
	client.SetPingHandler(func(data string) error {
		pings.Add(1)
		return defaultHandler(data) // the library's own answer
	})
	readErr := make(chan error, 1)
	go func() {
		for {
			if _, _, err := client.ReadMessage(); err != nil {
				readErr <- err
				return
			}
		}
	}()

	select {
	case err := <-readErr:
		t.Fatalf("client read ended with %v after %d pings", err, pings.Load())
	case <-c.Done():
		t.Fatalf("server ended the connection (CloseCode %d) after %d answered pings", c.CloseCode(), pings.Load())
	case <-time.After(4 * silence):
	}
	if n := pings.Load(); n < 8 {
		t.Errorf("%d pings over four timeouts, expected about 16", n)
	}
	if err := client.WriteMessage(websocket.TextMessage, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if m := col.next(t); string(m.data) != "still here" {
		t.Fatalf("server read %q", m.data)
	}
	if err := client.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")); err != nil {
		t.Fatal(err)
	}
	var ce *websocket.CloseError
	if err := <-readErr; !errors.As(err, &ce) || ce.Code != websocket.CloseNormalClosure {
		t.Fatalf("client read ended with %v, expected the echoed close", err)
	}
}

// The same client without pings to answer is silent and closed with 1001:
// what kept it open above was its pongs.
func TestReadingClientWithoutPingsIsSilent(t *testing.T) {
	t.Parallel()
	ts := startServer(t, ws.Options{SilenceTimeout: silence}, newCollector().serve)
	start := time.Now()
	client := dialGorilla(t, ts.addr, 0)
	c := ts.accept(t)
	expectGorillaClose(t, client, ws.CloseGoingAway, "silent too long")
	if d := time.Since(start); d < silence || d > silence+silenceSlack {
		t.Errorf("closed %v after the upgrade, expected about %v", d, silence)
	}
	waitDone(t, c, waitTimeout)
}

// teardownWithin is how soon a torn-down socket must end its reader. The
// silence deadline (a minute) must not hold it.
const teardownWithin = time.Second

// endedReader is a serve function that reads until an error and reports
// when its read failed.
type endedReader struct {
	col   *collector
	ended chan time.Time
}

func newEndedReader() *endedReader {
	return &endedReader{col: newCollector(), ended: make(chan time.Time, 1)}
}

func (er *endedReader) serve(c *ws.Conn) {
	er.col.serve(c)
	er.ended <- time.Now()
}

func (er *endedReader) waitEnded(t *testing.T, since time.Time) {
	t.Helper()
	select {
	case at := <-er.ended:
		if d := at.Sub(since); d > teardownWithin {
			t.Fatalf("serve returned %v after the teardown, expected within %v", d, teardownWithin)
		}
	case <-time.After(teardownWithin + waitTimeout):
		t.Fatal("serve did not return after the teardown")
	}
}

// Close and Abort from the server side, while the reader waits for a
// frame under a one-minute silence deadline, end the reader at once.
func TestTeardownEndsIdleReaderDespiteSilenceDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sendMsg  bool // the reader has read a message (and set a new deadline) first
		teardown func(*ws.Conn)
		code     int // the close frame the client gets; 0: none
	}{
		{"Close at once", false, func(c *ws.Conn) { c.Close(ws.CloseReplaced, "bye") }, ws.CloseReplaced},
		{"Close after a message", true, func(c *ws.Conn) { c.Close(ws.CloseReplaced, "bye") }, ws.CloseReplaced},
		{"Abort at once", false, (*ws.Conn).Abort, 0},
		{"Abort after a message", true, (*ws.Conn).Abort, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			er := newEndedReader()
			ts := startServer(t, ws.Options{SilenceTimeout: time.Minute, PingInterval: time.Minute}, er.serve)
			rc := dialRaw(t, ts.addr, 0)
			c := ts.accept(t)
			if tc.sendMsg {
				rc.send(textFrame("first"))
				if m := er.col.next(t); string(m.data) != "first" {
					t.Fatalf("server read %q", m.data)
				}
			}
			start := time.Now()
			tc.teardown(c)
			er.waitEnded(t, start)
			if tc.code != 0 {
				rc.expectClose(tc.code)
			} else {
				rc.expectEnd()
			}
			waitDone(t, c, waitTimeout)
		})
	}
}

// The reader may be between two reads when the socket is torn down: the
// next read sets a new silence deadline, which must not undo the past
// deadline of the teardown. Here the serve function itself closes (or
// aborts) after a message, waits for the writer to finish, and reads
// again; the client stays connected and sends nothing, so only the
// teardown can end that read.
func TestReadAfterTeardownFailsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		teardown func(*ws.Conn)
	}{
		{"Close", func(c *ws.Conn) { c.Close(ws.CloseNormal, "") }},
		{"Abort", (*ws.Conn).Abort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type readEnd struct {
				err error
				d   time.Duration
			}
			ended := make(chan readEnd, 1)
			ts := startServer(t, ws.Options{SilenceTimeout: time.Minute}, func(c *ws.Conn) {
				if _, _, err := c.ReadMessage(); err != nil {
					ended <- readEnd{err: err}
					return
				}
				start := time.Now()
				tc.teardown(c)
				<-c.Done()
				_, _, err := c.ReadMessage()
				ended <- readEnd{err, time.Since(start)}
			})
			rc := dialRaw(t, ts.addr, 0)
			c := ts.accept(t)
			rc.send(textFrame("go"))
			select {
			case r := <-ended:
				if r.err == nil {
					t.Fatal("read after the teardown returned a message")
				}
				if r.d > teardownWithin {
					t.Fatalf("read after the teardown failed %v later (%v), expected within %v", r.d, r.err, teardownWithin)
				}
			case <-time.After(teardownWithin + waitTimeout):
				t.Fatal("read after the teardown still waiting")
			}
			waitDone(t, c, waitTimeout)
		})
	}
}

// Setting the silence deadline before every frame costs no allocation.
func TestSilenceDeadlineAllocatesNothing(t *testing.T) {
	ts := startServer(t, ws.Options{SilenceTimeout: time.Minute}, nil)
	rc := dialRaw(t, ts.addr, 0)
	c := ts.accept(t)

	payload := pattern(1024, 0)
	frames := append(frame(fin|ws.OpPing, []byte("beat")), frame(fin|ws.OpText, payload)...)
	pong := make([]byte, 6)
	var failed error
	read := func() {
		if _, err := rc.nc.Write(frames); err != nil {
			failed = err
			return
		}
		op, p, err := c.ReadMessage()
		switch {
		case err != nil:
			failed = err
		case op != ws.OpText || !bytes.Equal(p, payload):
			failed = errors.New("read something else than was sent")
		}
		if _, err := fullRead(rc, pong); err != nil {
			failed = err
		}
	}
	for range 100 {
		read()
	}
	allocs := testing.AllocsPerRun(allocRuns, read)
	if failed != nil {
		t.Fatal(failed)
	}
	expectNoAllocs(t, allocs, "ping and 1 KiB message under a silence deadline")
}
