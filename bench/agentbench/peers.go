package agentbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"edgerelay/bench/serverproc"
)

// The load generator's peers speak the protocol by hand over TLS 1.3: the
// instance writes prepared lines and counts line feeds, the clients write
// prepared WebSocket frames and skip over the ones they read. Neither
// decodes JSON on the measured path, so the generator costs the same
// against both relays and as little as it can.

// target is one relay under test, listening on loopback, with one paired
// instance and a client token of its account.
type target struct {
	name        string
	addr        string
	tls         *tls.Config
	instance    string
	instToken   string
	clientToken string
	close       func() error
	// proc is the relay's process when it runs in one of its own (nil
	// when it runs in this one).
	proc *serverproc.Proc
}

// peer is one connection of the load generator.
type peer struct {
	conn *tls.Conn
	br   *bufio.Reader
	hdr  [8]byte // a frame header being read; a field so that it is not allocated per frame
}

func dial(ctx context.Context, t *target) (*peer, error) {
	d := tls.Dialer{Config: t.tls}
	nc, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, err
	}
	conn := nc.(*tls.Conn)
	return &peer{conn: conn, br: bufio.NewReaderSize(conn, 64<<10)}, nil
}

// readHead reads an HTTP answer's status line and headers and checks for 101.
func (p *peer) readHead() error {
	status, err := p.br.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if !strings.HasPrefix(status, "HTTP/1.1 101 ") {
		return fmt.Errorf("answer %q, want 101", strings.TrimSpace(status))
	}
	for {
		line, err := p.br.ReadString('\n')
		if err != nil {
			return err
		}
		if line == "\r\n" {
			return nil
		}
	}
}

// openInstance connects the instance: the upgrade, the hello, the welcome.
func openInstance(ctx context.Context, t *target) (*peer, error) {
	p, err := dial(ctx, t)
	if err != nil {
		return nil, err
	}
	_ = p.conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET /v1/connect HTTP/1.1\r\nHost: " + t.addr + "\r\nUpgrade: contenox-relay/1\r\nConnection: Upgrade\r\n" +
		"Authorization: Bearer " + t.instToken + "\r\n\r\n"
	hello := `{"type":"relay.hello","instance":"` + t.instance + `","id":"hello","payload":{"protocol_version":1,"instance":"` +
		t.instance + `","agent":"agentbench/1","nonce":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}}` + "\n"
	if _, err := io.WriteString(p.conn, req); err != nil {
		p.conn.Close()
		return nil, err
	}
	if err := p.readHead(); err != nil {
		p.conn.Close()
		return nil, fmt.Errorf("link upgrade: %w", err)
	}
	if _, err := io.WriteString(p.conn, hello); err != nil {
		p.conn.Close()
		return nil, err
	}
	welcome, err := p.br.ReadString('\n')
	if err != nil || !strings.HasPrefix(welcome, `{"type":"relay.welcome"`) {
		p.conn.Close()
		return nil, fmt.Errorf("welcome %q: %v", welcome, err)
	}
	_ = p.conn.SetDeadline(time.Time{})
	return p, nil
}

// openClient attaches one client.
func openClient(ctx context.Context, t *target) (*peer, error) {
	p, err := dial(ctx, t)
	if err != nil {
		return nil, err
	}
	_ = p.conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET /v1/attach/" + t.instance + " HTTP/1.1\r\nHost: " + t.addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: contenox-relay.v1\r\n" +
		"Authorization: Bearer " + t.clientToken + "\r\n\r\n"
	if _, err := io.WriteString(p.conn, req); err != nil {
		p.conn.Close()
		return nil, err
	}
	if err := p.readHead(); err != nil {
		p.conn.Close()
		return nil, fmt.Errorf("attach: %w", err)
	}
	_ = p.conn.SetDeadline(time.Time{})
	return p, nil
}

// appendClientFrame appends payload as one final, masked text frame. The
// mask key is zero, so the masked bytes are the payload's own and a frame
// can be patched in place (the latency runs write a sequence number into
// each); a zero key is as valid as any other.
func appendClientFrame(dst, payload []byte) []byte {
	dst = append(dst, 0x81)
	switch n := len(payload); {
	case n < 126:
		dst = append(dst, 0x80|byte(n))
	case n <= 0xffff:
		dst = append(dst, 0x80|126, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0x80|127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	dst = append(dst, 0, 0, 0, 0)
	return append(dst, payload...)
}

// readServerFrame reads one server frame's header and returns its opcode
// and payload length.
func (p *peer) readServerFrame() (op byte, n int, err error) {
	h := p.hdr[:2]
	if _, err := io.ReadFull(p.br, h); err != nil {
		return 0, 0, err
	}
	op = h[0] & 0x0f
	switch l := h[1] & 0x7f; l {
	case 126:
		e := p.hdr[:2]
		if _, err := io.ReadFull(p.br, e); err != nil {
			return 0, 0, err
		}
		n = int(binary.BigEndian.Uint16(e))
	case 127:
		e := p.hdr[:8]
		if _, err := io.ReadFull(p.br, e); err != nil {
			return 0, 0, err
		}
		n = int(binary.BigEndian.Uint64(e))
	default:
		n = int(l)
	}
	if op == 0x8 {
		return op, n, errors.New("the relay closed the client")
	}
	return op, n, nil
}

// rig is one instance and its attached clients, with the session of each.
type rig struct {
	t        *target
	inst     *peer
	clients  []*peer
	sessions []string
}

// setUp connects the instance and n clients and learns each client's
// session from a first frame.
func setUp(ctx context.Context, t *target, n int) (*rig, error) {
	inst, err := openInstance(ctx, t)
	if err != nil {
		return nil, err
	}
	r := &rig{t: t, inst: inst, sessions: make([]string, n)}
	for i := range n {
		c, err := openClient(ctx, t)
		if err != nil {
			r.close()
			return nil, err
		}
		r.clients = append(r.clients, c)
		msg := fmt.Sprintf(`{"type":"acp.message","id":"hello-%d"}`, i)
		if _, err := c.conn.Write(appendClientFrame(nil, []byte(msg))); err != nil {
			r.close()
			return nil, err
		}
	}
	_ = inst.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer inst.conn.SetReadDeadline(time.Time{})
	for range n {
		line, err := inst.br.ReadBytes('\n')
		if err != nil {
			r.close()
			return nil, fmt.Errorf("first frames: %w", err)
		}
		var f struct{ ID, Session string }
		var i int
		if err := json.Unmarshal(line, &f); err != nil {
			r.close()
			return nil, fmt.Errorf("first frame %q: %w", line, err)
		}
		if _, err := fmt.Sscanf(f.ID, "hello-%d", &i); err != nil || i < 0 || i >= n || f.Session == "" {
			r.close()
			return nil, fmt.Errorf("first frame %q", line)
		}
		r.sessions[i] = f.Session
	}
	return r, nil
}

func (r *rig) close() {
	if r.inst != nil {
		r.inst.conn.Close()
	}
	for _, c := range r.clients {
		c.conn.Close()
	}
}

// marker precedes the sequence number in every measured frame's payload:
// ten decimal digits in a string, which a re-encoding relay keeps as is.
var marker = []byte(`"n":"`)

const seqDigits = 10

// putSeq writes n as ten digits at b[0:10].
func putSeq(b []byte, n int) {
	for i := seqDigits - 1; i >= 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
}

// findSeq returns the sequence number after the marker in b, or -1.
func findSeq(b []byte) int {
	i := bytes.Index(b, marker)
	if i < 0 || i+len(marker)+seqDigits > len(b) {
		return -1
	}
	n := 0
	for _, c := range b[i+len(marker) : i+len(marker)+seqDigits] {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// payloadText is n bytes of ordinary JSON string content.
func payloadText(n int) string {
	const words = "the agent streams a token of its answer to the browser "
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words)
	}
	return b.String()[:n]
}

// instanceLine is a frame the instance sends to session, with a sequence
// number slot, and the offset of that slot.
func instanceLine(instance, session string, size int) ([]byte, int) {
	head := `{"type":"acp.message","instance":"` + instance + `","session":"` + session + `","payload":{"n":"`
	line := head + strings.Repeat("0", seqDigits) + `","text":"` + payloadText(size) + `"}}` + "\n"
	return []byte(line), len(head)
}

// clientMessage is a frame a client sends, with a sequence number slot,
// framed for the wire, and the offset of the slot in the framed bytes.
func clientMessage(size int) ([]byte, int) {
	head := `{"type":"acp.message","id":"req","payload":{"n":"`
	msg := []byte(head + strings.Repeat("0", seqDigits) + `","text":"` + payloadText(size) + `"}}`)
	framed := appendClientFrame(nil, msg)
	return framed, len(framed) - len(msg) + len(head)
}
