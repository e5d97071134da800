//go:build linux && !nopark

package ws

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// inlinePair is a served, parked Conn on a connection netlimit accepted,
// the raw client socket, and how many times the Conn's reading goroutine
// was started by a wake.
type inlinePair struct {
	c      *Conn
	client *net.TCPConn
	p      *Parker
	reads  atomic.Int32
	got    chan []byte // the data messages served
	ends   chan error
}

func startInline(t *testing.T, opts Options) *inlinePair {
	t.Helper()
	p, err := NewParker()
	if err != nil {
		t.Fatal(err)
	}
	s, client := netlimitPair(t, false)
	opts.Parker, opts.Detach, opts.ParkAfter = p, true, 20*time.Millisecond
	ip := &inlinePair{client: client, p: p, got: make(chan []byte, 16), ends: make(chan error, 1)}
	ip.c = newConn(s, NewSettings(opts))
	if ip.c.now == nil {
		t.Fatal("a Conn on netlimit's plain connection has no raw reads")
	}
	ip.c.readFn = func() {
		ip.reads.Add(1)
		ip.c.readLoop()
	}
	go ip.c.Serve(func(_ int, msg []byte) bool {
		ip.got <- bytes.Clone(msg)
		if string(msg) == "stop" { // as the mailbox watch refuses what is not its ping
			ip.c.Close(CloseUnsupportedData, "stop")
			return false
		}
		return true
	}, func(err error) { ip.ends <- err })
	t.Cleanup(func() {
		ip.c.Abort()
		<-ip.c.Done()
		_ = client.Close()
		_ = p.Close()
	})
	ip.waitParked(t)
	return ip
}

func (ip *inlinePair) waitParked(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(waitTimeoutInternal)
	for ip.p.Parked() != 1 || ip.c.parkState.Load() != stateParked {
		if time.Now().After(deadline) {
			t.Fatal("the socket did not park")
		}
		time.Sleep(time.Millisecond)
	}
}

// expect reads one server frame and checks it.
func (ip *inlinePair) expect(t *testing.T, op int, payload []byte) {
	t.Helper()
	_ = ip.client.SetReadDeadline(time.Now().Add(waitTimeoutInternal))
	h := make([]byte, 2)
	if _, err := io.ReadFull(ip.client, h); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, h[1]&0x7f)
	if _, err := io.ReadFull(ip.client, got); err != nil {
		t.Fatal(err)
	}
	if int(h[0]) != 0x80|op || !bytes.Equal(got, payload) {
		t.Fatalf("got frame % x with % x, want op %d with % x", h, got, op, payload)
	}
}

func (ip *inlinePair) send(t *testing.T, frames ...[]byte) {
	t.Helper()
	if _, err := ip.client.Write(bytes.Join(frames, nil)); err != nil {
		t.Fatal(err)
	}
}

// A parked socket's pings and pongs that fit its header buffer are
// answered where the parker's event came, without starting its reading
// goroutine, and it is parked again: pings with 0 to 8 bytes of payload,
// a pong, two empty pings in one segment, a pong before a ping. A ping a
// byte longer, data, a frame that breaks a rule, and the end of the input
// go to the reading goroutine, which serves them as before.
func TestParkedPingsAnsweredInline(t *testing.T) {
	ip := startInline(t, Options{PingInterval: time.Hour})
	for n := range 9 {
		payload := bytes.Repeat([]byte{byte('a' + n)}, n)
		ip.send(t, maskedFrame(OpPing, payload))
		ip.expect(t, OpPong, payload)
		ip.waitParked(t)
	}
	ip.c.pongSeen.Store(false)
	ip.send(t, maskedFrame(OpPong, []byte("pong")))
	deadline := time.Now().Add(waitTimeoutInternal)
	for !ip.c.pongSeen.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the pong was not seen")
		}
		time.Sleep(time.Millisecond)
	}
	ip.waitParked(t)
	ip.send(t, maskedFrame(OpPing, nil), maskedFrame(OpPing, []byte("x")))
	ip.expect(t, OpPong, nil)
	ip.expect(t, OpPong, []byte("x"))
	ip.waitParked(t)
	ip.send(t, maskedFrame(OpPong, nil), maskedFrame(OpPing, []byte("after")))
	ip.expect(t, OpPong, []byte("after"))
	ip.waitParked(t)
	if n := ip.reads.Load(); n != 0 {
		t.Fatalf("the reading goroutine was started %d times for pings and pongs that fit", n)
	}

	// One byte past what fits: the reading goroutine answers it.
	nine := []byte("123456789")
	ip.send(t, maskedFrame(OpPing, nine))
	ip.expect(t, OpPong, nine)
	ip.waitParked(t)
	if n := ip.reads.Load(); n != 1 {
		t.Fatalf("a ping with 9 bytes of payload started the reading goroutine %d times, want 1", n)
	}

	// A ping, then data in the same segment: the ping is answered at
	// once, the data served by the reading goroutine, in order.
	ip.send(t, maskedFrame(OpPing, []byte("p")), maskedFrame(OpBinary, []byte("data")))
	ip.expect(t, OpPong, []byte("p"))
	select {
	case msg := <-ip.got:
		if string(msg) != "data" {
			t.Fatalf("served %q, want data", msg)
		}
	case <-time.After(waitTimeoutInternal):
		t.Fatal("the data after the ping was not served")
	}
	ip.waitParked(t)
	if n := ip.reads.Load(); n != 2 {
		t.Fatalf("the data started the reading goroutine %d times in all, want 2", n)
	}

	// A ping that is not masked breaks a rule: the reading goroutine
	// closes the socket with 1002.
	ip.send(t, []byte{0x80 | OpPing, 0})
	ip.expect(t, OpClose, append([]byte{0x03, 0xea}, "client frame not masked"...))
	ip.expectEnd(t, 3, "an unmasked ping")
}

// expectEnd waits for the socket's reading to end, by the reading
// goroutine's reads-th start, and returns what onEnd got.
func (ip *inlinePair) expectEnd(t *testing.T, reads int32, what string) error {
	t.Helper()
	var err error
	select {
	case err = <-ip.ends:
	case <-time.After(waitTimeoutInternal):
		t.Fatalf("the socket's reading did not end after %s", what)
	}
	if n := ip.reads.Load(); n != reads {
		t.Fatalf("by its end after %s, the reading goroutine was started %d times, want %d", what, n, reads)
	}
	return err
}

// expectMessage waits for onMessage to be handed msg.
func (ip *inlinePair) expectMessage(t *testing.T, msg string) {
	t.Helper()
	select {
	case got := <-ip.got:
		if string(got) != msg {
			t.Fatalf("served %q, want %q", got, msg)
		}
	case <-time.After(waitTimeoutInternal):
		t.Fatalf("%q was not served", msg)
	}
}

// With InlineMessages a parked socket's small messages go to onMessage on
// the parker's goroutine too, one per wake, after the pings before them:
// text and binary of up to 8 bytes, two in one segment; a message a byte
// longer, text that is not UTF-8 (closed with 1007), and a message on
// which onMessage closes the socket end as on the reading goroutine.
func TestParkedSmallMessagesInline(t *testing.T) {
	ip := startInline(t, Options{PingInterval: time.Hour, InlineMessages: true})
	ip.send(t, maskedFrame(OpText, []byte("ping")))
	ip.expectMessage(t, "ping")
	ip.waitParked(t)
	ip.send(t, maskedFrame(OpPing, []byte("p")), maskedFrame(OpBinary, []byte("12345678")))
	ip.expect(t, OpPong, []byte("p"))
	ip.expectMessage(t, "12345678")
	ip.waitParked(t)
	ip.send(t, maskedFrame(OpText, []byte("a")), maskedFrame(OpText, []byte("b")))
	ip.expectMessage(t, "a")
	ip.expectMessage(t, "b")
	ip.waitParked(t)
	if n := ip.reads.Load(); n != 0 {
		t.Fatalf("the reading goroutine was started %d times for small messages", n)
	}
	ip.send(t, maskedFrame(OpText, []byte("123456789")))
	ip.expectMessage(t, "123456789")
	ip.waitParked(t)
	if n := ip.reads.Load(); n != 1 {
		t.Fatalf("a 9-byte message started the reading goroutine %d times, want 1", n)
	}

	// Closed by onMessage, inline: the close goes out and the reading
	// ends with no error, as when onMessage returns false on its
	// goroutine.
	ip.send(t, maskedFrame(OpText, []byte("stop")))
	ip.expectMessage(t, "stop")
	ip.expect(t, OpClose, append([]byte{0x03, 0xeb}, "stop"...))
	if err := ip.expectEnd(t, 1, "onMessage's close"); err != nil {
		t.Fatalf("reading ended with %v, want nil (onMessage closed it)", err)
	}
}

// Text that is not UTF-8 is left to the reading goroutine, which closes
// the socket with 1007.
func TestParkedInvalidTextGoesToTheReader(t *testing.T) {
	ip := startInline(t, Options{PingInterval: time.Hour, InlineMessages: true})
	ip.send(t, maskedFrame(OpText, []byte{'o', 0xff}))
	ip.expect(t, OpClose, append([]byte{0x03, 0xef}, "text is not UTF-8"...))
	ip.expectEnd(t, 1, "text that is not UTF-8")
}

// MaxMessage holds inline too: a message of MaxMessage bytes is served
// there, one a byte longer is left to the reading goroutine, which closes
// the socket with 1009.
func TestParkedInlineMessageAtMaxMessage(t *testing.T) {
	ip := startInline(t, Options{PingInterval: time.Hour, InlineMessages: true, MaxMessage: 4})
	ip.send(t, maskedFrame(OpText, []byte("1234")))
	ip.expectMessage(t, "1234")
	ip.waitParked(t)
	ip.send(t, maskedFrame(OpText, []byte("12345")))
	ip.expect(t, OpClose, append([]byte{0x03, 0xf1}, "message too big"...))
	ip.expectEnd(t, 1, "a message past MaxMessage")
}

// A message behind a ping whose pong overflowed the queue arrived after
// the close: dropped inline as on the reading goroutine.
func TestParkedInlineMessageAfterTheClose(t *testing.T) {
	ip := startInline(t, Options{PingInterval: time.Hour, InlineMessages: true, MaxQueue: 9})
	ip.send(t, maskedFrame(OpPing, nil), maskedFrame(OpText, []byte("x")))
	ip.expect(t, OpClose, append([]byte{0x03, 0xf0}, "send queue full"...))
	ip.client.Close() // no close of its own: the drain ends at its EOF
	ip.expectEnd(t, 1, "the overflow")
	select {
	case msg := <-ip.got:
		t.Fatalf("%q was served after the close", msg)
	default:
	}
}

// The end of the input wakes the reading goroutine, which ends the socket.
func TestParkedEOFGoesToTheReader(t *testing.T) {
	ip := startInline(t, Options{PingInterval: time.Hour})
	_ = ip.client.CloseWrite()
	ip.expectEnd(t, 1, "the peer's EOF")
}

// wholeSmallFrame at its edges, without and with data.
func TestWholeSmallFrame(t *testing.T) {
	ping := maskedFrame(OpPing, []byte("ab"))
	keyed := []byte{0x80 | OpText, 0x80 | 2, 1, 2, 3, 4, 'o' ^ 1, 'k' ^ 2} // key 1, 2, 3, 4
	for _, tc := range []struct {
		name       string
		b          []byte
		want, data int // sizes without and with data
	}{
		{"a whole ping", ping, 8, 8},
		{"a ping and more", append(bytes.Clone(ping), 1, 2, 3), 8, 8},
		{"a ping a byte short", ping[:7], 0, 0},
		{"a header alone", ping[:5], 0, 0},
		{"a pong of 125 bytes", maskedFrame(OpPong, make([]byte, 125)), 131, 131},
		{"not final", append([]byte{OpPing, 0x80}, 0, 0, 0, 0), 0, 0},
		{"a reserved bit", append([]byte{0x80 | 0x40 | OpPing, 0x80}, 0, 0, 0, 0), 0, 0},
		{"not masked", []byte{0x80 | OpPing, 0, 0, 0, 0, 0}, 0, 0},
		{"a close", maskedFrame(OpClose, nil), 0, 0},
		{"binary", maskedFrame(OpBinary, []byte{0xff}), 0, 7},
		{"text", maskedFrame(OpText, []byte("ping")), 0, 10},
		{"text under a key", keyed, 0, 8},
		{"text not UTF-8", maskedFrame(OpText, []byte{0xff}), 0, 0},
		{"text not UTF-8 once unmasked", []byte{0x80 | OpText, 0x81, 0x80, 0, 0, 0, 0x7f}, 0, 0},
		{"a fragment", append([]byte{OpText, 0x81}, 0, 0, 0, 0, 'a'), 0, 0},
		{"a continuation", maskedFrame(OpContinuation, []byte("a")), 0, 0},
		{"a 16-bit length", append([]byte{0x80 | OpPing, 0x80 | 126, 0, 5}, make([]byte, 9)...), 0, 0},
	} {
		if got, _ := wholeSmallFrame(tc.b, false); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
		if got, _ := wholeSmallFrame(tc.b, true); got != tc.data {
			t.Errorf("%s, with data: %d, want %d", tc.name, got, tc.data)
		}
	}
}
