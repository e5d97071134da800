package ws_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/ws"
)

var roundTripSizes = []int{0, 125, 126, 65535, 65536, 200000}

// Every size on either side of a length-encoding boundary survives a round
// trip through an independent client, as text and as binary.
func TestRoundTripGorilla(t *testing.T) {
	ts := startServer(t, ws.Options{MaxMessage: 1 << 20}, echo)
	c := dialGorilla(t, ts.addr, 0)
	for _, size := range roundTripSizes {
		for _, typ := range []int{websocket.TextMessage, websocket.BinaryMessage} {
			payload := pattern(size, size)
			if typ == websocket.BinaryMessage {
				for i := range payload {
					payload[i] = byte(i * 7) // every byte value, invalid UTF-8 included
				}
			}
			if err := c.WriteMessage(typ, payload); err != nil {
				t.Fatal(err)
			}
			gotType, got, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("size %d type %d: %v", size, typ, err)
			}
			if gotType != typ || !bytes.Equal(got, payload) {
				t.Fatalf("size %d type %d: echoed type %d with %d bytes (equal: %v)",
					size, typ, gotType, len(got), bytes.Equal(got, payload))
			}
		}
	}
}

// The same sizes from a raw client, which also checks the server's frame
// headers byte by byte (shortest length form, FIN, no mask).
func TestRoundTripRaw(t *testing.T) {
	ts := startServer(t, ws.Options{MaxMessage: 1 << 20}, echo)
	rc := dialRaw(t, ts.addr, 0)
	for _, size := range roundTripSizes {
		text := pattern(size, 3)
		rc.send(frame(fin|ws.OpText, text))
		rc.expectFrame(ws.OpText, text)
		bin := bytes.Repeat([]byte{0xff, 0x00, 0x80}, size/3+1)[:size]
		rc.send(frame(fin|ws.OpBinary, bin))
		rc.expectFrame(ws.OpBinary, bin)
	}
}

// A message in four fragments with a ping between two of them: the ping is
// answered at once with the same payload, the message arrives whole, and the
// reader is ready for the next message afterwards.
func TestFragmentsWithInterleavedPing(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{}, col.serve)
	rc := dialRaw(t, ts.addr, 0)

	rc.send(frame(ws.OpText, []byte("Hel")))
	rc.send(frame(fin|ws.OpPing, []byte("ping payload")))
	rc.expectFrame(ws.OpPong, []byte("ping payload"))
	rc.send(
		frame(ws.OpContinuation, []byte("lo ")),
		frame(ws.OpContinuation, nil), // an empty fragment is legal
		frame(fin|ws.OpContinuation, []byte("world")),
	)
	if m := col.next(t); m.op != ws.OpText || string(m.data) != "Hello world" {
		t.Fatalf("got op %d %q, expected text %q", m.op, m.data, "Hello world")
	}

	// A binary message fragmented with an empty ping and a pong in between.
	rc.send(
		frame(ws.OpBinary, []byte{0, 1}),
		frame(fin|ws.OpPing, nil),
		frame(fin|ws.OpPong, []byte("unsolicited")),
		frame(fin|ws.OpContinuation, []byte{2, 3}),
		textFrame("after"),
	)
	rc.expectFrame(ws.OpPong, nil)
	if m := col.next(t); m.op != ws.OpBinary || !bytes.Equal(m.data, []byte{0, 1, 2, 3}) {
		t.Fatalf("got op %d %v, expected binary [0 1 2 3]", m.op, m.data)
	}
	if m := col.next(t); m.op != ws.OpText || string(m.data) != "after" {
		t.Fatalf("got op %d %q, expected text %q", m.op, m.data, "after")
	}
}

// expectFailure checks that the server closed with code because of what
// the client sent: the client gets the close frame and then the end of the
// connection, the server's read returns *CloseError with ByPeer false.
func expectFailure(t *testing.T, rc *rawClient, col *collector, code int) {
	t.Helper()
	rc.expectClose(code)
	expectCloseError(t, col.err(t), code, false)
}

func TestMaxMessage(t *testing.T) {
	const max = 1000
	opts := ws.Options{MaxMessage: max}
	cases := []struct {
		name   string
		frames [][]byte
		want   []int // sizes of the messages that pass, then a close with 1009 if tooBig
		tooBig bool
	}{
		{"exactly max", [][]byte{frame(fin|ws.OpBinary, make([]byte, max))}, []int{max}, false},
		{"exactly max in fragments", [][]byte{
			frame(ws.OpText, pattern(600, 0)),
			frame(fin|ws.OpContinuation, pattern(400, 0)),
		}, []int{max}, false},
		{"one over", [][]byte{frame(fin|ws.OpBinary, make([]byte, max+1))}, nil, true},
		{"one over in a later fragment", [][]byte{
			frame(ws.OpText, pattern(600, 0)),
			frame(ws.OpContinuation, nil),
			frame(fin|ws.OpContinuation, pattern(401, 0)),
		}, nil, true},
		{"max, then one over", [][]byte{
			frame(fin|ws.OpBinary, make([]byte, max)),
			frame(fin|ws.OpBinary, make([]byte, max+1)),
		}, []int{max}, true},
		// Announced sizes are refused before any payload is read.
		{"announces 2^40 bytes", [][]byte{header64(fin|ws.OpBinary, 1<<40)}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			col := newCollector()
			ts := startServer(t, opts, col.serve)
			rc := dialRaw(t, ts.addr, 0)
			rc.send(tc.frames...)
			for _, size := range tc.want {
				if m := col.next(t); len(m.data) != size {
					t.Fatalf("got %d bytes, expected %d", len(m.data), size)
				}
			}
			if tc.tooBig {
				expectFailure(t, rc, col, ws.CloseTooBig)
			} else {
				rc.send(closeFrame(ws.CloseNormal, ""))
				rc.expectClose(ws.CloseNormal)
			}
		})
	}
}

func TestTextMustBeUTF8(t *testing.T) {
	euro := []byte("€") // e2 82 ac
	cases := []struct {
		name   string
		frames [][]byte
		pass   []byte // the message read when valid
	}{
		{"invalid byte", [][]byte{frame(fin|ws.OpText, []byte("ok \xff"))}, nil},
		{"surrogate half", [][]byte{frame(fin|ws.OpText, []byte("\xed\xa0\x80"))}, nil},
		{"truncated rune at the end", [][]byte{frame(fin|ws.OpText, euro[:2])}, nil},
		{"rune split across fragments", [][]byte{
			frame(ws.OpText, append([]byte("a"), euro[:2]...)),
			frame(fin|ws.OpContinuation, append(euro[2:], 'b')),
		}, []byte("a€b")},
		{"rune split over three fragments", [][]byte{
			frame(ws.OpText, euro[:1]),
			frame(ws.OpContinuation, euro[1:2]),
			frame(fin|ws.OpContinuation, euro[2:]),
		}, euro},
		{"split rune never completed", [][]byte{
			frame(ws.OpText, append([]byte("a"), euro[:2]...)),
			frame(fin|ws.OpContinuation, []byte("b")),
		}, nil},
		{"binary is not checked", [][]byte{frame(fin|ws.OpBinary, []byte("\xff\xfe"))}, []byte("\xff\xfe")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			col := newCollector()
			ts := startServer(t, ws.Options{}, col.serve)
			rc := dialRaw(t, ts.addr, 0)
			rc.send(tc.frames...)
			if tc.pass == nil {
				expectFailure(t, rc, col, ws.CloseInvalidPayload)
				return
			}
			if m := col.next(t); !bytes.Equal(m.data, tc.pass) {
				t.Fatalf("got %q, expected %q", m.data, tc.pass)
			}
		})
	}
}

// Frames that break RFC 6455 close the connection with 1002.
func TestProtocolErrors(t *testing.T) {
	closeBody := func(code int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(code)) }
	cases := []struct {
		name   string
		frames [][]byte
		passes int // whole messages before the violation
	}{
		{"unmasked text", [][]byte{buildFrame(fin|ws.OpText, []byte("hi"), false)}, 0},
		{"unmasked close", [][]byte{buildFrame(fin|ws.OpClose, closeBody(1000), false)}, 0},
		{"RSV1", [][]byte{frame(fin|rsv1|ws.OpText, []byte("hi"))}, 0},
		{"RSV2", [][]byte{frame(fin|rsv2|ws.OpBinary, []byte("hi"))}, 0},
		{"RSV3 on a ping", [][]byte{frame(fin|rsv3|ws.OpPing, nil)}, 0},
		{"RSV1 on a continuation", [][]byte{frame(ws.OpText, []byte("a")), frame(fin|rsv1|ws.OpContinuation, []byte("b"))}, 0},
		{"reserved data opcode 3", [][]byte{frame(fin|0x3, []byte("hi"))}, 0},
		{"reserved data opcode 7", [][]byte{frame(fin|0x7, nil)}, 0},
		{"reserved control opcode 0xB", [][]byte{frame(fin|0xB, []byte("hi"))}, 0},
		{"reserved control opcode 0xF", [][]byte{frame(fin|0xF, nil)}, 0},
		{"continuation without a start", [][]byte{frame(fin|ws.OpContinuation, []byte("hi"))}, 0},
		{"continuation after a whole message", [][]byte{textFrame("done"), frame(fin|ws.OpContinuation, []byte("hi"))}, 1},
		{"new message inside a fragmented one", [][]byte{frame(ws.OpText, []byte("a")), frame(fin|ws.OpText, []byte("b"))}, 0},
		{"ping of 126 bytes", [][]byte{frame(fin|ws.OpPing, make([]byte, 126))}, 0},
		{"close of 126 bytes", [][]byte{frame(fin|ws.OpClose, append(closeBody(1000), make([]byte, 124)...))}, 0},
		{"fragmented ping", [][]byte{frame(ws.OpPing, []byte("a"))}, 0},
		{"fragmented pong", [][]byte{frame(ws.OpPong, nil)}, 0},
		{"close with a 1-byte body", [][]byte{frame(fin|ws.OpClose, []byte{3})}, 0},
		{"close code 0", [][]byte{closeFrame(0, "")}, 0},
		{"close code 999", [][]byte{closeFrame(999, "")}, 0},
		{"close code 1004", [][]byte{closeFrame(1004, "")}, 0},
		{"close code 1005 on the wire", [][]byte{closeFrame(1005, "")}, 0},
		{"close code 1006", [][]byte{closeFrame(1006, "")}, 0},
		{"close code 1015", [][]byte{closeFrame(1015, "")}, 0},
		{"close code 1016", [][]byte{closeFrame(1016, "")}, 0},
		{"close code 2999", [][]byte{closeFrame(2999, "")}, 0},
		{"close code 5000", [][]byte{closeFrame(5000, "")}, 0},
		{"64-bit length with its high bit set", [][]byte{header64(fin|ws.OpBinary, 1<<63)}, 0},
		// 3 + (2^64-1) wraps around to 2 in 64 bits: this once passed the
		// size check and panicked the process in make.
		{"continuation whose length wraps the size check", [][]byte{
			frame(ws.OpBinary, []byte("abc")), header64(fin|ws.OpContinuation, 1<<64-1),
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			col := newCollector()
			ts := startServer(t, ws.Options{}, col.serve)
			rc := dialRaw(t, ts.addr, 0)
			rc.send(tc.frames...)
			for range tc.passes {
				col.next(t)
			}
			expectFailure(t, rc, col, ws.CloseProtocolError)
		})
	}
}

func TestCloseReasonMustBeUTF8(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	rc.send(closeFrame(ws.CloseNormal, "bye \xff"))
	expectFailure(t, rc, col, ws.CloseInvalidPayload)
}

// A close from the client is echoed with its code, and ReadMessage reports
// it as the peer's.
func TestPeerCloseEchoed(t *testing.T) {
	for _, code := range []int{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 4000, 4999} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			col := newCollector()
			ts := startServer(t, ws.Options{}, col.serve)
			rc := dialRaw(t, ts.addr, 0)
			c := ts.accept(t)
			rc.send(closeFrame(code, "bye"))
			rc.expectClose(code)
			ce := expectCloseError(t, col.err(t), code, true)
			if ce.Reason != "bye" {
				t.Errorf("reason %q, expected bye", ce.Reason)
			}
			waitDone(t, c, waitTimeout)
			if got := c.CloseCode(); got != code {
				t.Errorf("CloseCode %d, expected the echoed %d", got, code)
			}
		})
	}
}

// A close without a body is echoed with 1000; the reader sees 1005, "no
// status received".
func TestPeerCloseWithoutBody(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	rc.send(frame(fin|ws.OpClose, nil))
	if reason := rc.expectClose(ws.CloseNormal); reason != "" {
		t.Errorf("echo has reason %q, expected none", reason)
	}
	expectCloseError(t, col.err(t), ws.CloseNoStatus, true)
}

// The close handshake with an independent client.
func TestPeerCloseGorilla(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{}, col.serve)
	c := dialGorilla(t, ts.addr, 0)
	if err := c.WriteMessage(websocket.TextMessage, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye")); err != nil {
		t.Fatal(err)
	}
	_, _, err := c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseNormalClosure {
		t.Fatalf("client read %v, expected the echoed close 1000", err)
	}
	if m := col.next(t); string(m.data) != "last words" {
		t.Fatalf("server read %q", m.data)
	}
	if ce := expectCloseError(t, col.err(t), ws.CloseNormal, true); ce.Reason != "bye" {
		t.Errorf("reason %q, expected bye", ce.Reason)
	}
}

// Control payloads are read in place in the read buffer: a buffer asked
// smaller than the largest (125 bytes) is raised to hold it. A ping and a
// close at the limit are answered whole; a ping one past it is refused.
func TestControlFramesAtTheLimitWithTheSmallestBuffer(t *testing.T) {
	col := newCollector()
	ts := startServer(t, ws.Options{ReadBufferSize: 16}, col.serve)
	rc := dialRaw(t, ts.addr, 0)
	ping := pattern(125, 5)
	rc.send(frame(fin|ws.OpPing, ping), textFrame("after the ping"))
	rc.expectFrame(ws.OpPong, ping)
	if m := col.next(t); m.op != ws.OpText || string(m.data) != "after the ping" {
		t.Fatalf("got op %d %q, expected the text after the ping", m.op, m.data)
	}
	reason := string(pattern(123, 9))
	rc.send(closeFrame(ws.CloseNormal, reason))
	rc.expectClose(ws.CloseNormal)
	var ce *ws.CloseError
	if err := col.err(t); !errors.As(err, &ce) || !ce.ByPeer || ce.Code != ws.CloseNormal || ce.Reason != reason {
		t.Fatalf("reading ended with %v, expected the peer's close with its 123-byte reason", err)
	}

	col = newCollector()
	ts = startServer(t, ws.Options{ReadBufferSize: 16}, col.serve)
	rc = dialRaw(t, ts.addr, 0)
	rc.send(frame(fin|ws.OpPing, make([]byte, 126)))
	expectFailure(t, rc, col, ws.CloseProtocolError)
}
