package channel_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/alloctest"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/channel/control"
	"edgerelay/store"
)

// The tests in this file prove the design's first hot-path promise: frame
// forwarding allocates nothing per frame in steady state. The relay is the
// real one (fasthttp, our ws package, the control codec, Pebble behind the
// claims), but both of its peers are raw TCP clients that write pre-built
// frames and read into fixed buffers, so that they allocate nothing
// themselves. testing.AllocsPerRun counts every malloc in the process, the
// relay's reader and writer goroutines included, so a zero here is a zero
// for the relay.

// forwardPayloadSize is the phone frame every round trip carries.
const forwardPayloadSize = 1 << 10

// rawSocket is one client WebSocket spoken by hand over TCP: the handshake
// is written and read once, and after that every frame is bytes prepared in
// advance, so nothing on this side allocates per frame.
type rawSocket struct {
	nc net.Conn
	br *bufio.Reader
}

// dialRaw opens path on addr with token as bearer and reads the 101; the
// socket is closed when the test ends.
func dialRaw(tb testing.TB, addr, path, token string) *rawSocket {
	tb.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nc.Close() })
	br, err := handshake(nc, addr, path, token)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return &rawSocket{nc: nc, br: br}
}

// handshake writes the upgrade request and reads the answer up to the end
// of its headers. The returned reader keeps whatever the relay sent after
// them, so frames are read through it.
func handshake(nc net.Conn, addr, path, token string) (*bufio.Reader, error) {
	// The key is the RFC 6455 sample; its accept value is known.
	const key, accept = "dGhlIHNhbXBsZSBub25jZQ==", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
	req := "GET " + path + " HTTP/1.1\r\n" +
		"Host: " + addr + "\r\n" +
		"Upgrade: websocket\r\n" +
		"Connection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\n" +
		"Sec-WebSocket-Version: 13\r\n" +
		"Authorization: Bearer " + token + "\r\n\r\n"
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer nc.SetDeadline(time.Time{})
	if _, err := io.WriteString(nc, req); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	status, err := br.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("reading the status line: %w", err)
	}
	if !strings.HasPrefix(status, "HTTP/1.1 101 ") {
		return nil, fmt.Errorf("%q, want 101", strings.TrimSpace(status))
	}
	gotAccept := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("reading headers: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, _ := strings.Cut(line, ":")
		if strings.EqualFold(name, "Sec-WebSocket-Accept") && strings.TrimSpace(value) == accept {
			gotAccept = true
		}
	}
	if !gotAccept {
		return nil, errors.New("no or wrong Sec-WebSocket-Accept")
	}
	return br, nil
}

// readExact reads exactly len(buf) bytes and reports whether they equal
// want. It neither allocates nor formats unless the bytes differ.
func (s *rawSocket) readExact(buf, want []byte) error {
	if _, err := io.ReadFull(s.br, buf[:len(want)]); err != nil {
		return err
	}
	if !bytes.Equal(buf[:len(want)], want) {
		return fmt.Errorf("got %.120q, want %.120q", buf[:len(want)], want)
	}
	return nil
}

// readServerText reads one unmasked server text frame of any length, for
// the handshake-time messages whose content is not known in advance.
func (s *rawSocket) readServerText() ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(s.br, h[:]); err != nil {
		return nil, err
	}
	if h[0] != 0x81 || h[1]&0x80 != 0 {
		return nil, fmt.Errorf("frame header % x, want an unmasked final text frame", h)
	}
	n := int(h[1])
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(s.br, l[:]); err != nil {
			return nil, err
		}
		n = int(binary.BigEndian.Uint16(l[:]))
	case 127:
		return nil, fmt.Errorf("unexpectedly long frame")
	}
	p := make([]byte, n)
	_, err := io.ReadFull(s.br, p)
	return p, err
}

// serverText is payload framed as the relay sends it: final, text, unmasked.
func serverText(payload []byte) []byte {
	return frame(payload, nil)
}

// clientText is payload framed as a client must send it: final, text,
// masked with key.
func clientText(payload []byte, key [4]byte) []byte {
	return frame(payload, key[:])
}

func frame(payload, mask []byte) []byte {
	maskBit := byte(0)
	if mask != nil {
		maskBit = 0x80
	}
	out := []byte{0x81}
	switch n := len(payload); {
	case n < 126:
		out = append(out, maskBit|byte(n))
	case n <= 0xffff:
		out = append(out, maskBit|126, byte(n>>8), byte(n))
	default:
		out = append(out, maskBit|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if mask == nil {
		return append(out, payload...)
	}
	out = append(out, mask...)
	for i, c := range payload {
		out = append(out, c^mask[i&3])
	}
	return out
}

// forwardLoop is one computer and one phone connected to a relay with the
// frames of one round trip prepared.
type forwardLoop struct {
	computer, phone *rawSocket

	phoneOut    []byte // the phone's masked 1 KiB text frame
	computerIn  []byte // that frame wrapped in a data message, as the relay sends it
	computerOut []byte // the computer's masked answer: the same data message
	phoneIn     []byte // the answer's data as the relay sends it to the phone
	buf         []byte // read buffer, large enough for either direction
}

// newForwardLoop connects the raw computer (owner token) and phone (phone
// token) to the relay at addr and learns the channel id from the open
// message the computer gets.
func newForwardLoop(tb testing.TB, addr, owner, phoneToken string) *forwardLoop {
	tb.Helper()
	// The relay registers the computer before answering its 101 and holds
	// an early phone until the control socket is ready, so the phone can
	// dial at once.
	l := &forwardLoop{
		computer: dialRaw(tb, addr, "/host", owner),
		phone:    dialRaw(tb, addr, "/botharness-device/channel", phoneToken),
	}
	_ = l.computer.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	open, err := l.computer.readServerText()
	if err != nil {
		tb.Fatalf("reading the open message: %v", err)
	}
	prefix, suffix := `{"type":"open","id":"`, `"}`
	if len(open) != len(prefix)+control.IDLen+len(suffix) ||
		!bytes.HasPrefix(open, []byte(prefix)) || !bytes.HasSuffix(open, []byte(suffix)) {
		tb.Fatalf("open message %q", open)
	}
	var id control.ID
	copy(id[:], open[len(prefix):])

	// Ciphertext-like text with a quote, a backslash and a newline, so the
	// relay's escaper and unescaper both have work on every frame.
	raw := make([]byte, forwardPayloadSize)
	for i := range raw {
		raw[i] = byte(i * 7)
	}
	payload := []byte(base64.StdEncoding.EncodeToString(raw))[:forwardPayloadSize]
	copy(payload[100:], "\"\\\n")

	wrapped := control.AppendData(nil, &id, payload)
	l.phoneOut = clientText(payload, [4]byte{0x11, 0x22, 0x33, 0x44})
	l.computerIn = serverText(wrapped)
	l.computerOut = clientText(wrapped, [4]byte{0x55, 0x66, 0x77, 0x88})
	l.phoneIn = serverText(payload)
	l.buf = make([]byte, max(len(l.computerIn), len(l.phoneIn)))
	return l
}

// roundTrip sends one phone frame through the relay to the computer and the
// computer's answer back to the phone, checking every byte both ways.
func (l *forwardLoop) roundTrip() error {
	if _, err := l.phone.nc.Write(l.phoneOut); err != nil {
		return err
	}
	if err := l.computer.readExact(l.buf, l.computerIn); err != nil {
		return fmt.Errorf("computer: %w", err)
	}
	if _, err := l.computer.nc.Write(l.computerOut); err != nil {
		return err
	}
	if err := l.phone.readExact(l.buf, l.phoneIn); err != nil {
		return fmt.Errorf("phone: %w", err)
	}
	return nil
}

// setDeadlines bounds every read and write until d from now, so a relay
// that stops forwarding fails the test instead of hanging it. It is set
// once, outside the measured loop.
func (l *forwardLoop) setDeadlines(d time.Duration) {
	at := time.Now().Add(d)
	_ = l.computer.nc.SetDeadline(at)
	_ = l.phone.nc.SetDeadline(at)
}

func TestForwardingAllocatesNothing(t *testing.T) {
	// An hour between pings keeps ping frames out of the byte-exact reads.
	r := startRelay(t, relayOpts{ping: time.Hour})
	c := r.claim(r.addKey("alloc"))
	addr := strings.TrimPrefix(r.origin, "http://")
	l := newForwardLoop(t, addr, c.owner, c.phone)
	l.setDeadlines(60 * time.Second)

	// Warm up: pooled buffers, send queues and the parse scratch grow to
	// their steady-state sizes in the first 200.
	count := alloctest.Measure(t, 200, 1000, l.roundTrip)
	t.Logf("AllocsPerRun: %v per round trip; %d mallocs in %d more round trips", count.PerRun, count.Mallocs, count.Runs)
	if alloctest.RaceEnabled() {
		// Under the race detector sync.Pool drops a quarter of what is
		// put back, on purpose, so the relay's pooled wrap buffers are
		// reallocated now and then. The loop above still ran under the
		// detector; the zero is asserted by runs without -race.
		t.Skip("allocation count not meaningful under -race")
	}
	avg := count.PerRun
	if avg != 0 {
		t.Errorf("forwarding allocates %v times per round trip, want 0", avg)
	}
}

// BenchmarkForwardRoundTrip measures one phone → relay → computer → relay →
// phone round trip of a 1 KiB frame with the cheapest possible clients, so
// ns/op is close to the relay's own cost per frame pair and allocs/op is
// the relay's (the clients allocate nothing).
func BenchmarkForwardRoundTrip(b *testing.B) {
	addr, owner, phoneToken := benchRelay(b)
	l := newForwardLoop(b, addr, owner, phoneToken)
	for range 200 {
		if err := l.roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
	l.setDeadlines(10 * time.Minute)
	b.SetBytes(2 * forwardPayloadSize) // the frame goes there and back
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := l.roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*2/b.Elapsed().Seconds(), "frames/s")
}

// benchRelay is startRelay, addKey and claim for a benchmark (the harness
// helpers take *testing.T): the same wiring, returning the relay's address
// and the claimed computer's owner and phone tokens.
func benchRelay(b *testing.B) (addr, owner, phone string) {
	b.Helper()
	db, err := store.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	claims := store.NewChannelClaims(db)
	h := channel.New(channel.Config{Claims: claims, PingInterval: time.Hour})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h.ServeHTTP, MaxRequestBodySize: 64 << 10}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() {
		_ = srv.Shutdown()
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		_ = h.Drain(ctx)
		_ = db.Close()
	})
	key, err := channel.Keys{Claims: claims}.Add("bench")
	if err != nil {
		b.Fatal(err)
	}
	owner, phone = strings.Repeat("a", 64), strings.Repeat("b", 64)
	req, err := http.NewRequest("POST", "http://"+ln.Addr().String()+"/claim",
		bytes.NewReader(claimBody(owner, phone)))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("claim: %s", resp.Status)
	}
	return ln.Addr().String(), owner, phone
}
