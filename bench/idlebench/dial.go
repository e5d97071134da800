package idlebench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"edgerelay/bench/serverproc"
)

// DefaultAliases is how many loopback source addresses the clients spread
// their sockets over (127.0.0.2, 127.0.0.3, …): each gives its own ~28,000
// ephemeral ports, so 100,000 sockets fit, and no address passes the
// binary's 1,000 connections per IP in a storm of 10,000.
const DefaultAliases = 64

// dialTimeout bounds one socket's TCP connect, TLS handshake and upgrade.
const dialTimeout = 10 * time.Second

// client opens WebSockets to one idleserve process, the way a device or a
// computer does, by hand: an upgrade request, the 101, and then whatever
// the benchmark reads itself.
type client struct {
	mailboxAddr, channelAddr string
	tls                      *tls.Config // nil: plain TCP
	aliases                  int
}

// newClient is a client of the server whose ready line is ready
// ("<mailbox addr> <channel addr>").
func newClient(ready string, useTLS bool, aliases int) (*client, error) {
	m, c, ok := strings.Cut(ready, " ")
	if !ok {
		return nil, fmt.Errorf("idlebench: ready line %q: want two addresses", ready)
	}
	cl := &client{mailboxAddr: m, channelAddr: c, aliases: aliases}
	if cl.aliases <= 0 {
		cl.aliases = DefaultAliases
	}
	if cl.aliases > 250 {
		return nil, fmt.Errorf("idlebench: %d source addresses: at most 250 (127.0.0.2 to 127.0.0.251)", cl.aliases)
	}
	if useTLS {
		// The certificate is the server's development one, made a moment
		// ago; what is measured is the server, so the client trusts it
		// without checking (and keeps no session cache: every socket is a
		// full handshake, as a fleet's first connections are).
		cl.tls = &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	}
	return cl, nil
}

// sock is one client WebSocket. Its Close resets the connection (linger
// 0), so that no TIME_WAIT is left to eat the next server's ports and the
// server sees the socket end at once, as after a NAT rebinding.
type sock struct {
	net.Conn               // the TLS connection, or the TCP one
	tcp      *net.TCPConn  // under it
	br       *bufio.Reader // what follows the 101
}

func (s *sock) Close() error {
	_ = s.tcp.SetLinger(0)
	return s.tcp.Close()
}

// open opens socket i of the layout.
func (c *client) open(ctx context.Context, l Layout, i int) (*sock, error) {
	addr := c.mailboxAddr
	if l.Kind.onChannel() {
		addr = c.channelAddr
	}
	switch l.Kind {
	case Silent:
		return c.connect(ctx, addr, i)
	case KeepAlive:
		return c.keepAlive(ctx, addr, i)
	}
	path, header := l.request(i)
	return c.upgrade(ctx, addr, i, path, header)
}

// connect connects from source i to addr, over TLS its handshake done,
// and sends nothing.
func (c *client) connect(ctx context.Context, addr string, i int) (*sock, error) {
	s, err := c.dial(ctx, addr, i)
	if err != nil {
		return nil, err
	}
	_ = s.SetDeadline(time.Time{})
	return s, nil
}

// keepAlive connects from source i to addr, has GET /health answered,
// and keeps the connection.
func (c *client) keepAlive(ctx context.Context, addr string, i int) (*sock, error) {
	s, err := c.dial(ctx, addr, i)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*sock, error) {
		_ = s.Close()
		return nil, fmt.Errorf("GET /health: %w", err)
	}
	if _, err := io.WriteString(s.Conn, "GET /health HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		return fail(err)
	}
	s.br = bufio.NewReaderSize(s.Conn, 512)
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		return fail(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	switch {
	case err != nil:
		return fail(err)
	case resp.StatusCode != http.StatusOK || resp.Close:
		return fail(fmt.Errorf("answered %d (close %v), want 200 kept alive", resp.StatusCode, resp.Close))
	}
	_ = s.SetDeadline(time.Time{})
	return s, nil
}

// dial connects from source i to addr and, over TLS, shakes hands, within
// dialTimeout; the connection keeps that deadline (or ctx's, if sooner)
// for what the caller then sends and reads, until it clears it.
func (c *client) dial(ctx context.Context, addr string, i int) (*sock, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	d := net.Dialer{LocalAddr: serverproc.LoopbackSource(i, c.aliases)}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &sock{Conn: nc, tcp: nc.(*net.TCPConn)}
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	if c.tls != nil {
		tc := tls.Client(nc, c.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		s.Conn = tc
	}
	return s, nil
}

// openControl opens computer i's control socket.
func (c *client) openControl(ctx context.Context, i int) (*sock, error) {
	path, header := controlRequest(i)
	return c.upgrade(ctx, c.channelAddr, i, path, header)
}

// upgrade connects from source i to addr and asks for a WebSocket on path
// with the header lines given.
func (c *client) upgrade(ctx context.Context, addr string, i int, path string, header []string) (*sock, error) {
	s, err := c.dial(ctx, addr, i)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	fail := func(err error) (*sock, error) {
		_ = s.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := io.WriteString(s.Conn, serverproc.UpgradeRequest(addr, path, header...)); err != nil {
		return fail(err)
	}
	// A small reader: the sockets are idle, and ten thousand of them are
	// the client's memory, not the server's.
	s.br = bufio.NewReaderSize(s.Conn, 512)
	status, err := s.br.ReadString('\n')
	if err != nil {
		return fail(fmt.Errorf("reading the status line: %w", err))
	}
	if !strings.HasPrefix(status, "HTTP/1.1 101 ") {
		return fail(&refusedError{status: strings.TrimSpace(status)})
	}
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			return fail(fmt.Errorf("reading the headers: %w", err))
		}
		if line == "\r\n" {
			break
		}
	}
	_ = s.SetDeadline(time.Time{})
	return s, nil
}

// refusedError is an answer other than 101.
type refusedError struct{ status string }

func (e *refusedError) Error() string { return fmt.Sprintf("answered %q, want 101", e.status) }

// readFrame reads the next server frame (unmasked) into buf's storage and
// returns its opcode and payload.
func (s *sock) readFrame(buf []byte) (op byte, payload []byte, err error) {
	var hdr [10]byte
	if _, err := io.ReadFull(s.br, hdr[:2]); err != nil {
		return 0, nil, err
	}
	n := int(hdr[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(s.br, hdr[2:4]); err != nil {
			return 0, nil, err
		}
		n = int(binary.BigEndian.Uint16(hdr[2:4]))
	case 127:
		if _, err := io.ReadFull(s.br, hdr[2:10]); err != nil {
			return 0, nil, err
		}
		n = int(binary.BigEndian.Uint64(hdr[2:10]))
	}
	if hdr[1]&0x80 != 0 {
		return 0, nil, errors.New("idlebench: a masked frame from the server")
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("idlebench: a %d-byte frame", n)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	payload = buf[:n]
	if _, err := io.ReadFull(s.br, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0] & 0x0f, payload, nil
}
