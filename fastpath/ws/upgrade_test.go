package ws_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/ws"
)

// Upgrade writes the 101 itself, from the hijacked connection: exactly the
// headers RFC 6455 asks for, nothing after them but frames, and serve runs
// for every upgrade, even when the client is gone by then.

// readRawHead reads a response head line by line, without interpreting it:
// the status line and the header lines as sent.
func readRawHead(t *testing.T, br *bufio.Reader) (status string, lines []string) {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read response head: %v (so far %q %q)", err, status, lines)
		}
		if !strings.HasSuffix(line, "\r\n") {
			t.Fatalf("head line %q does not end with CRLF", line)
		}
		line = strings.TrimSuffix(line, "\r\n")
		switch {
		case status == "":
			status = line
		case line == "":
			return status, lines
		default:
			lines = append(lines, line)
		}
	}
}

func TestUpgradeAnswerHasExactlyTheHandshakeHeaders(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra string // request headers
		want  []string
	}{
		{"no subprotocol", "", []string{
			"Upgrade: websocket",
			"Connection: Upgrade",
			"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", // RFC 6455 section 1.3
		}},
		{"subprotocol", "Sec-WebSocket-Protocol: v1, chat\r\n", []string{
			"Upgrade: websocket",
			"Connection: Upgrade",
			"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=",
			"Sec-WebSocket-Protocol: chat",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, ws.Options{}, nil)
			nc, err := net.Dial("tcp", ts.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = nc.Close() })
			_ = nc.SetDeadline(time.Now().Add(waitTimeout))
			req := strings.Replace(upgradeRequest(ts.addr), "\r\n\r\n", "\r\n"+tc.extra+"\r\n", 1)
			if _, err := io.WriteString(nc, req); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(nc)
			status, lines := readRawHead(t, br)
			if status != "HTTP/1.1 101 Switching Protocols" {
				t.Errorf("status line %q", status)
			}
			got, want := slices.Sorted(slices.Values(lines)), slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("101 headers\n%q\nexpected exactly\n%q", lines, tc.want)
			}

			// No body, nothing else: the next bytes are the server's
			// first frame.
			c := ts.accept(t)
			if err := c.WriteText([]byte("first")); err != nil {
				t.Fatal(err)
			}
			rc := &rawClient{t: t, nc: nc, br: br}
			rc.expectFrame(ws.OpText, []byte("first"))
		})
	}
}

// An independent client accepts the answer, negotiates the subprotocol and
// exchanges messages over it.
func TestUpgradeWithGorilla(t *testing.T) {
	ts := startServer(t, ws.Options{}, echo)
	for _, tc := range []struct {
		offer []string
		want  string
	}{
		{nil, ""},
		{[]string{"v1", "chat"}, "chat"},
		{[]string{"v1"}, ""},
	} {
		d := websocket.Dialer{HandshakeTimeout: waitTimeout, Subprotocols: tc.offer}
		client, resp, err := d.Dial("ws://"+ts.addr+"/", nil)
		if err != nil {
			t.Fatalf("offer %q: dial: %v", tc.offer, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Errorf("offer %q: status %s", tc.offer, resp.Status)
		}
		wantHeaders := []string{"Connection", "Sec-Websocket-Accept", "Upgrade"}
		if tc.want != "" {
			wantHeaders = append(wantHeaders, "Sec-Websocket-Protocol")
			slices.Sort(wantHeaders)
		}
		if got := slices.Sorted(func(yield func(string) bool) {
			for k := range resp.Header {
				if !yield(k) {
					return
				}
			}
		}); !slices.Equal(got, wantHeaders) {
			t.Errorf("offer %q: headers %q, expected %q", tc.offer, got, wantHeaders)
		}
		if got := client.Subprotocol(); got != tc.want {
			t.Errorf("offer %q: subprotocol %q, expected %q", tc.offer, got, tc.want)
		}
		for _, m := range []string{"one", strings.Repeat("x", 64<<10)} {
			if err := client.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
				t.Fatal(err)
			}
			expectGorillaText(t, client, []byte(m))
		}
		_ = client.Close()
		ts.accept(t)
	}
}

// countingServer upgrades every valid handshake and counts, for each,
// the calls of Upgrade and of serve. Before calling Upgrade, the handler
// runs beforeUpgrade (when set) with the request's connection.
type countingServer struct {
	addr          string
	upgrades      atomic.Int32
	serves        atomic.Int32
	reads         chan error // what each serve's first read returned
	beforeUpgrade func(net.Conn)
}

func startCountingServer(t *testing.T, beforeUpgrade func(net.Conn)) *countingServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingServer{addr: ln.Addr().String(), reads: make(chan error, 64), beforeUpgrade: beforeUpgrade}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if err := ws.CheckHandshake(ctx); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadRequest)
			return
		}
		if cs.beforeUpgrade != nil {
			cs.beforeUpgrade(ctx.Conn())
		}
		cs.upgrades.Add(1)
		ws.Upgrade(ctx, ws.NewSettings(ws.Options{}), "", nil, func(c *ws.Conn) {
			cs.serves.Add(1)
			_, _, err := c.ReadMessage()
			cs.reads <- err
		})
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = ln.Close() })
	return cs
}

// waitServes waits until serve has run once for each of n upgrades, and
// checks that each of those reads failed (the client was gone).
func (cs *countingServer) waitServes(t *testing.T, n int) {
	t.Helper()
	waitFor(t, "serve to run for every upgrade", func() bool { return cs.serves.Load() >= int32(n) })
	if got := cs.upgrades.Load(); got != int32(n) {
		t.Errorf("%d upgrades, expected %d", got, n)
	}
	if got := cs.serves.Load(); got != int32(n) {
		t.Errorf("serve ran %d times for %d upgrades", got, n)
	}
	for range n {
		select {
		case err := <-cs.reads:
			if err == nil {
				t.Error("serve read a message from a client that sent none")
			}
		case <-time.After(waitTimeout):
			t.Fatal("a serve's read did not end although its client is gone")
		}
	}
}

// A client that sends a valid upgrade request and closes its socket at
// once still gets its serve call.
func TestUpgradeServesClientThatClosedAtOnce(t *testing.T) {
	const clients = 20
	cs := startCountingServer(t, nil)
	for range clients {
		nc, err := net.Dial("tcp", cs.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(nc, upgradeRequest(cs.addr)); err != nil {
			t.Fatal(err)
		}
		_ = nc.Close()
	}
	cs.waitServes(t, clients)
}

// The same when the client is already gone with a reset by the time the
// server answers, so that writing the 101 fails: serve still runs (its
// read fails at once) and whatever the caller reserved for the socket
// is released there.
func TestUpgradeServesClientResetBeforeTheAnswer(t *testing.T) {
	const clients = 5
	arrived := make(chan struct{})
	reset := make(chan error, clients)
	cs := startCountingServer(t, func(nc net.Conn) {
		arrived <- struct{}{}
		reset <- waitForReset(nc)
	})
	for range clients {
		nc, err := net.Dial("tcp", cs.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(nc, upgradeRequest(cs.addr)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-arrived:
		case <-time.After(waitTimeout):
			t.Fatal("the request never reached the handler")
		}
		// Linger 0: close sends a reset rather than a FIN.
		if err := nc.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		_ = nc.Close()
		if err := <-reset; err != nil {
			t.Fatal(err)
		}
	}
	cs.waitServes(t, clients)
}

// waitForReset polls the server side of a connection, without consuming
// anything, until the client's reset has arrived there.
func waitForReset(nc net.Conn) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return errors.New("the request's connection has no file descriptor")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		var rerr error
		var n int
		if err := raw.Read(func(fd uintptr) bool {
			var b [1]byte
			n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			return true
		}); err != nil {
			return err
		}
		switch {
		case errors.Is(rerr, syscall.ECONNRESET):
			return nil
		case rerr == nil && n > 0:
			return errors.New("the client sent more than its request")
		case rerr == nil && n == 0:
			return errors.New("the client closed with a FIN, not a reset")
		case !errors.Is(rerr, syscall.EAGAIN):
			return rerr
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("no reset arrived")
}
