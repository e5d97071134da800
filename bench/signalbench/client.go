package signalbench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// rawConn is one client signal socket spoken by hand over TCP: the
// handshake is written and read once, and after that every frame sent is
// bytes prepared in advance and every frame received is read into a fixed
// buffer, so the client allocates nothing per frame. That keeps the load
// generator's share of the machine small and the same for both relays,
// and makes the zero-allocation test a test of the relay alone.
type rawConn struct {
	nc  net.Conn
	br  *bufio.Reader
	hdr [8]byte
}

// dialSignal opens one side ("primary" or "companion") of mailbox i's
// signal rendezvous on addr and reads the 101.
func dialSignal(addr string, i int, side string) (*rawConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	// The key is the RFC 6455 sample; its accept value is known.
	const key, accept = "dGhlIHNhbXBsZSBub25jZQ==", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
	req := "GET " + mailboxPath(i) + "/signal/" + side + " HTTP/1.1\r\n" +
		"Host: " + addr + "\r\n" +
		"Upgrade: websocket\r\n" +
		"Connection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\n" +
		"Sec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Protocol: zerobyte.v1\r\n" +
		"Authorization: Bearer " + token + "\r\n\r\n"
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer nc.SetDeadline(time.Time{})
	fail := func(err error) (*rawConn, error) {
		_ = nc.Close()
		return nil, fmt.Errorf("signal %s of mailbox %d: %w", side, i, err)
	}
	if _, err := io.WriteString(nc, req); err != nil {
		return fail(err)
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	status, err := br.ReadString('\n')
	if err != nil {
		return fail(fmt.Errorf("reading the status line: %w", err))
	}
	if !strings.HasPrefix(status, "HTTP/1.1 101 ") {
		return fail(fmt.Errorf("%q, want 101", strings.TrimSpace(status)))
	}
	gotAccept, gotProto := false, false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return fail(fmt.Errorf("reading headers: %w", err))
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		switch {
		case strings.EqualFold(name, "Sec-WebSocket-Accept"):
			gotAccept = value == accept
		case strings.EqualFold(name, "Sec-WebSocket-Protocol"):
			gotProto = value == "zerobyte.v1"
		}
	}
	if !gotAccept || !gotProto {
		return fail(errors.New("wrong or missing Sec-WebSocket-Accept or Sec-WebSocket-Protocol"))
	}
	return &rawConn{nc: nc, br: br}, nil
}

// errClosed is a close frame from the relay.
var errClosed = errors.New("the relay closed the socket")

// readFrame reads the next server frame into buf and returns its opcode
// and length. Server frames are unmasked and unfragmented here (neither
// relay fragments what it forwards).
func (c *rawConn) readFrame(buf []byte) (op int, n int, err error) {
	if _, err := io.ReadFull(c.br, c.hdr[:2]); err != nil {
		return 0, 0, err
	}
	if c.hdr[0]&0x80 == 0 || c.hdr[1]&0x80 != 0 {
		return 0, 0, fmt.Errorf("frame header % x: want a final, unmasked frame", c.hdr[:2])
	}
	op, n = int(c.hdr[0]&0x0f), int(c.hdr[1]&0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(c.br, c.hdr[:2]); err != nil {
			return 0, 0, err
		}
		n = int(binary.BigEndian.Uint16(c.hdr[:2]))
	case 127:
		if _, err := io.ReadFull(c.br, c.hdr[:8]); err != nil {
			return 0, 0, err
		}
		n64 := binary.BigEndian.Uint64(c.hdr[:8])
		if n64 > uint64(len(buf)) {
			return 0, 0, fmt.Errorf("a %d-byte frame", n64)
		}
		n = int(n64)
	}
	if n > len(buf) {
		return 0, 0, fmt.Errorf("a %d-byte frame, %d expected at most", n, len(buf))
	}
	if _, err := io.ReadFull(c.br, buf[:n]); err != nil {
		return 0, 0, err
	}
	if op == opClose {
		return op, n, errClosed
	}
	return op, n, nil
}

// readBinary reads frames until a binary one, which it checks against
// want (or, when stop is not nil, stop) and reports which it was. Pings
// and text frames the relay may send in between are skipped: the load
// never asks for them.
func (c *rawConn) readBinary(buf, want, stop []byte) (stopped bool, err error) {
	for {
		op, n, err := c.readFrame(buf)
		if err != nil {
			return false, err
		}
		if op != opBinary {
			continue
		}
		switch got := buf[:n]; {
		case bytes.Equal(got, want):
			return false, nil
		case stop != nil && bytes.Equal(got, stop):
			return true, nil
		default:
			return false, fmt.Errorf("a %d-byte binary frame that is not the one sent", n)
		}
	}
}

// waitText reads frames until a text frame, which must be want.
func (c *rawConn) waitText(want string) error {
	var buf [128]byte
	for {
		op, n, err := c.readFrame(buf[:])
		if err != nil {
			return err
		}
		if op != opText {
			continue
		}
		if string(buf[:n]) != want {
			return fmt.Errorf("text %q, want %q", buf[:n], want)
		}
		return nil
	}
}

func (c *rawConn) close() error { return c.nc.Close() }

// Opcodes of RFC 6455 section 5.2 that the client meets.
const (
	opText   = 0x1
	opBinary = 0x2
	opClose  = 0x8
)

// clientFrame is payload framed as a client must send it: final, masked
// with key.
func clientFrame(op int, payload []byte, key [4]byte) []byte {
	out := []byte{0x80 | byte(op)}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n <= 0xffff:
		out = append(out, 0x80|126, byte(n>>8), byte(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	out = append(out, key[:]...)
	for i, c := range payload {
		out = append(out, c^key[i&3])
	}
	return out
}

// frames are one frame size's prepared bytes, shared read-only by every
// pair: the payload, shaped like a sealed signal frame (version byte, a
// millisecond counter, ciphertext-like bytes), the same payload masked as
// the clients send it, and a stop frame that ends a round.
type frames struct {
	size            int
	payload, masked []byte
	stop, stopMask  []byte
}

func newFrames(size int) frames {
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i*131 + 7)
	}
	payload[0] = 0x01
	if size >= 9 {
		binary.BigEndian.PutUint64(payload[1:9], uint64(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()))
	}
	stop := bytes.Clone(payload)
	stop[0] = 0xff
	key := [4]byte{0x11, 0x22, 0x33, 0x44}
	return frames{size: size, payload: payload, masked: clientFrame(opBinary, payload, key),
		stop: stop, stopMask: clientFrame(opBinary, stop, key)}
}

// pair is one mailbox's two signal sockets.
type pair struct {
	primary, companion *rawConn
}

// claim makes mailbox i on addr with the benchmark bearer (201 expected).
func claim(client *http.Client, addr string, i int) error {
	req, err := http.NewRequest(http.MethodPut, "http://"+addr+mailboxPath(i), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("claim of mailbox %d: %s", i, resp.Status)
	}
	return nil
}

// openPair claims mailbox i and opens both sides, returning once both
// have been told "peer 1": only then does the relay know both, so that no
// frame of the load is dropped for want of the other side.
func openPair(client *http.Client, addr string, i int) (*pair, error) {
	if err := claim(client, addr, i); err != nil {
		return nil, err
	}
	p, err := dialSignal(addr, i, "primary")
	if err != nil {
		return nil, err
	}
	c, err := dialSignal(addr, i, "companion")
	if err != nil {
		return nil, errors.Join(err, p.close())
	}
	pr := &pair{primary: p, companion: c}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range []*rawConn{p, c} {
		_ = s.nc.SetReadDeadline(deadline)
		if err := s.waitText("peer 1"); err != nil {
			return nil, errors.Join(fmt.Errorf("mailbox %d: %w", i, err), pr.close())
		}
		_ = s.nc.SetReadDeadline(time.Time{})
	}
	return pr, nil
}

func (p *pair) close() error { return errors.Join(p.primary.close(), p.companion.close()) }

// openPairs opens n pairs on addr, closing them all on failure.
func openPairs(addr string, n int) ([]*pair, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var pairs []*pair
	for i := range n {
		p, err := openPair(client, addr, i)
		if err != nil {
			return nil, errors.Join(err, closePairs(pairs))
		}
		pairs = append(pairs, p)
	}
	return pairs, nil
}

func closePairs(pairs []*pair) error {
	var err error
	for _, p := range pairs {
		err = errors.Join(err, p.close())
	}
	return err
}

// roundTrip sends one frame from the primary through the relay to the
// companion and the companion's echo back, checking every byte both ways:
// two forwarded frames. It allocates nothing.
func (p *pair) roundTrip(f *frames, buf []byte) error {
	if _, err := p.primary.nc.Write(f.masked); err != nil {
		return err
	}
	if _, err := p.companion.readBinary(buf, f.payload, nil); err != nil {
		return fmt.Errorf("companion: %w", err)
	}
	if _, err := p.companion.nc.Write(f.masked); err != nil {
		return err
	}
	if _, err := p.primary.readBinary(buf, f.payload, nil); err != nil {
		return fmt.Errorf("primary: %w", err)
	}
	return nil
}
