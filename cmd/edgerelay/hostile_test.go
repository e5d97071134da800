package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/agent/agenttest"
	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// hostileTarget is one listener and a request its handler answers without
// credentials.
type hostileTarget struct {
	service string
	path    string
	status  int
	// headersTooLarge is the 431 body, in the listener's protocol's own
	// error shape.
	headersTooLarge *regexp.Regexp
}

// hostileTargets is every HTTP listener of the binary (TURN is not HTTP).
// The agent listener is TLS.
var hostileTargets = []hostileTarget{
	{"channel", "/health", 200, regexp.MustCompile(`^\{"error":"request headers too large"\}$`)},
	{"mailbox", "/v1/no-such-app/mailbox/x/p2c", 404, regexp.MustCompile(`^\{"error":"headers_too_large","status":431\}$`)},
	{"push-fcm", "/health", 200, pushgwHeadersTooLarge},
	{"push-apns", "/health", 200, pushgwHeadersTooLarge},
	{"agent", "/v1/no-such-path", 404, regexp.MustCompile(`^\{"error":\{"message":"request headers too large"\}\}$`)},
	{"admin", "/healthz", 200, regexp.MustCompile(`^\{"error":"request headers too large"\}$`)},
}

var pushgwHeadersTooLarge = regexp.MustCompile(`^\{"error":"request headers too large","requestId":"[0-9a-f-]{36}"\}$`)

// hostileRelay is a running relay with a TLS configuration that trusts the
// agent listener's development CA.
type hostileRelay struct {
	*relayProc
	tls *tls.Config
}

func startHostileRelay(t *testing.T, env ...string) *hostileRelay {
	t.Helper()
	s := startServer(t, env...)
	caPEM, err := os.ReadFile(filepath.Join(s.dataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatalf("agent CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("agent CA: no certificate in ca.pem")
	}
	return &hostileRelay{relayProc: s, tls: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}}
}

// isTLS reports whether service's listener speaks TLS.
func (r *hostileRelay) isTLS(service string) bool { return service == "agent" }

// dial opens a connection to service, with the TLS handshake done for the
// agent listener.
func (r *hostileRelay) dial(service string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", r.addrs[service], 10*time.Second)
	if err != nil || !r.isTLS(service) {
		return c, err
	}
	tc := tls.Client(c, r.tls)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS handshake with %s: %w", service, err)
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// httpClient is a client for service that opens a new connection per
// request, so that every request goes through the listener's accept.
func (r *hostileRelay) httpClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: r.tls, DisableKeepAlives: true}}
}

func (r *hostileRelay) url(service, path string) string {
	scheme := "http://"
	if r.isTLS(service) {
		scheme = "https://"
	}
	return scheme + r.addrs[service] + path
}

// partialHead is a request whose headers never end.
const partialHead = "GET /health HTTP/1.1\r\nHost: relay\r\nX-Slow: "

// slowEnd is how a slow client's connection ended.
type slowEnd struct {
	what string
	took time.Duration // from before the dial to the end of the connection
	got  []byte        // what the server sent before closing
	err  error         // the connection did not end as it should
}

// slowClient opens a connection to service that never completes a request
// and reports when the server ends it. kind is "silent" (nothing at all; on
// TLS that is no ClientHello), "partial" (half a request, then nothing) or
// "trickle" (a byte of header every 100 ms, which a timeout reset per read
// would never end).
func (r *hostileRelay) slowClient(service, kind string, bound time.Duration) slowEnd {
	end := slowEnd{what: service + " " + kind}
	begin := time.Now()
	var c net.Conn
	var err error
	if kind == "silent" {
		c, err = net.DialTimeout("tcp", r.addrs[service], 10*time.Second)
	} else {
		c, err = r.dial(service)
	}
	if err != nil {
		end.err = err
		return end
	}
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	switch kind {
	case "partial":
		if _, err := io.WriteString(c, partialHead); err != nil {
			end.err = fmt.Errorf("write: %w", err)
			return end
		}
	case "trickle":
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			if _, err := io.WriteString(c, partialHead); err != nil {
				return
			}
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := c.Write([]byte("a")); err != nil {
					return // the server cut it
				}
			}
		}()
	}
	_ = c.SetReadDeadline(begin.Add(bound))
	end.got, err = io.ReadAll(c)
	end.took = time.Since(begin)
	// Any end but the deadline is the server's doing: EOF, a reset, a TLS
	// alert.
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		end.err = fmt.Errorf("still open after %v", end.took)
	}
	return end
}

// TestHostileSlowHeadersCutAtTimeout: on every listener, clients that send
// nothing, half a request, or a request one byte at a time are cut off at
// the header timeout, and not before it; on the TLS listener a client that
// never sends its ClientHello is cut too. Whatever the server says before
// closing is a 408.
func TestHostileSlowHeadersCutAtTimeout(t *testing.T) {
	const timeout = time.Second
	r := startHostileRelay(t, "RELAY_HEADER_TIMEOUT="+timeout.String())
	perKind := 2 * soakScale(t)
	ends := make(chan slowEnd)
	n := 0
	for _, tg := range hostileTargets {
		for _, kind := range []string{"silent", "partial", "trickle"} {
			for range perKind {
				n++
				go func() { ends <- r.slowClient(tg.service, kind, timeout+10*time.Second) }()
			}
		}
	}
	var slowest time.Duration
	for range n {
		e := <-ends
		if e.err != nil {
			t.Errorf("%s: %v", e.what, e.err)
			continue
		}
		if e.took < timeout {
			t.Errorf("%s: cut after %v, before the header timeout", e.what, e.took)
		}
		// (A TLS client that never said hello may get an alert instead.)
		if len(e.got) > 0 && !bytes.HasPrefix(e.got, []byte("HTTP/1.1 408 ")) && e.what != "agent silent" {
			t.Errorf("%s: the server said %.60q before closing, want a 408 or nothing", e.what, e.got)
		}
		slowest = max(slowest, e.took)
	}
	t.Logf("%d slow clients on %d listeners cut; header timeout %v, the last after %v", n, len(hostileTargets), timeout, slowest)
	if slowest > timeout+5*time.Second {
		t.Fatalf("a slow client was cut only after %v (header timeout %v)", slowest, timeout)
	}
}

// headerBlock is a GET of path whose request line, headers and final blank
// line are exactly size bytes.
func headerBlock(path string, size int) string {
	head := "GET " + path + " HTTP/1.1\r\nHost: relay\r\nX-Pad: "
	return head + strings.Repeat("a", size-len(head)-len("\r\n\r\n")) + "\r\n\r\n"
}

// rawRequest sends req on a new connection to service and reads the answer.
func (r *hostileRelay) rawRequest(t *testing.T, service, req string) (*http.Response, []byte) {
	t.Helper()
	c, err := r.dial(service)
	if err != nil {
		t.Fatalf("%s: %v", service, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("%s: write: %v", service, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s: read the answer: %v", service, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read the body: %v", service, err)
	}
	return resp, body
}

// TestHostileHeaderSizeLimit: on every listener, a request whose header
// block is exactly RELAY_MAX_HEADER_BYTES reaches its handler, and one byte
// more is refused with 431 and the JSON error body.
func TestHostileHeaderSizeLimit(t *testing.T) {
	const limit = 6000
	r := startHostileRelay(t, "RELAY_MAX_HEADER_BYTES="+strconv.Itoa(limit))
	for _, tg := range hostileTargets {
		resp, body := r.rawRequest(t, tg.service, headerBlock(tg.path, limit))
		if resp.StatusCode != tg.status {
			t.Errorf("%s: %d header bytes answered %d %s, want %d from the handler", tg.service, limit, resp.StatusCode, body, tg.status)
		}
		resp, body = r.rawRequest(t, tg.service, headerBlock(tg.path, limit+1))
		switch {
		case resp.StatusCode != 431:
			t.Errorf("%s: %d header bytes answered %d %s, want 431", tg.service, limit+1, resp.StatusCode, body)
		case resp.Header.Get("Content-Type") != "application/json":
			t.Errorf("%s: 431 with Content-Type %q", tg.service, resp.Header.Get("Content-Type"))
		case !tg.headersTooLarge.Match(body):
			t.Errorf("%s: 431 body %s, want %s", tg.service, body, tg.headersTooLarge)
		}
	}
}

// TestHostileSlowClientsDoNotStarveOthers holds many slow clients open on
// every listener (half a request, or nothing; on TLS no ClientHello) and
// checks that ordinary requests on the same listeners are all answered,
// each within a bound far below the header timeout, while the slow ones are
// still held.
func TestHostileSlowClientsDoNotStarveOthers(t *testing.T) {
	const headerTimeout = 5 * time.Minute
	r := startHostileRelay(t, "RELAY_HEADER_TIMEOUT="+headerTimeout.String(),
		"RELAY_MAX_CONNS=100000", "RELAY_MAX_CONNS_PER_IP=100000", "RELAY_ACCEPT_BURST=100000")
	slow := 100 * soakScale(t)
	for _, tg := range hostileTargets {
		for i := range slow {
			var c net.Conn
			var err error
			if i%2 == 0 {
				c, err = net.DialTimeout("tcp", r.addrs[tg.service], 10*time.Second)
			} else if c, err = r.dial(tg.service); err == nil {
				_, err = io.WriteString(c, partialHead)
			}
			if err != nil {
				t.Fatalf("%s: slow client %d: %v", tg.service, i, err)
			}
			t.Cleanup(func() { c.Close() })
		}
	}
	held := func(service string) float64 {
		return hostileMetric(t, r.relayProc, `edgerelay_listener_open_connections{service="`+service+`"}`)
	}
	for _, tg := range hostileTargets {
		waitUntil(t, func() bool { return held(tg.service) >= float64(slow) })
	}

	// Ordinary clients: a new connection per request, several at a time.
	const bound = 5 * time.Second
	const clients = 3
	requests := 20 * soakScale(t)
	type outcome struct {
		service string
		took    time.Duration
		err     error
	}
	outcomes := make(chan outcome)
	for _, tg := range hostileTargets {
		for range clients {
			go func() {
				hc := r.httpClient()
				for range requests {
					begin := time.Now()
					resp, err := hc.Get(r.url(tg.service, tg.path))
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != tg.status {
							err = fmt.Errorf("status %d, want %d", resp.StatusCode, tg.status)
						}
					}
					outcomes <- outcome{tg.service, time.Since(begin), err}
				}
			}()
		}
	}
	var slowest time.Duration
	for range len(hostileTargets) * clients * requests {
		o := <-outcomes
		if o.err != nil {
			t.Errorf("%s: %v", o.service, o.err)
		}
		if o.took > bound {
			t.Errorf("%s: answered in %v, want under %v (header timeout %v)", o.service, o.took, bound, headerTimeout)
		}
		slowest = max(slowest, o.took)
	}
	for _, tg := range hostileTargets {
		if n := held(tg.service); n < float64(slow) {
			t.Errorf("%s: %v connections open after the requests, want the %d slow ones still held", tg.service, n, slow)
		}
	}
	t.Logf("%d slow clients held on each of %d listeners; %d requests each answered, the slowest in %v",
		slow, len(hostileTargets), clients*requests, slowest)
}

// hostileMetric reads one series from the relay's /metrics; the test fails
// when it is missing.
func hostileMetric(t *testing.T, s *relayProc, series string) float64 {
	t.Helper()
	code, body := get(t, s.origin("admin")+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}

// hostileChannel is a claimed computer with its control socket open.
type hostileChannel struct {
	s   *relayProc
	tok string // the phone token
	ctl *websocket.Conn
	wmu sync.Mutex // one writer at a time on ctl
}

func newHostileChannel(t *testing.T, s *relayProc, claimKey string) *hostileChannel {
	t.Helper()
	st, owner, phone := claim(t, s.origin("channel"), claimKey)
	if st != 200 {
		t.Fatalf("claim: %d", st)
	}
	ctl, _, err := websocket.DefaultDialer.Dial("ws://"+s.addrs["channel"]+"/host", http.Header{"Authorization": {"Bearer " + owner}})
	if err != nil {
		t.Fatalf("control socket: %v", err)
	}
	t.Cleanup(func() { ctl.Close() })
	return &hostileChannel{s: s, tok: phone, ctl: ctl}
}

// phone connects a phone through d (nil: the default dialer) and returns it
// with the id the computer got in its open message. Only while nothing else
// reads the control socket.
func (h *hostileChannel) phone(t *testing.T, d *websocket.Dialer) (*websocket.Conn, string) {
	t.Helper()
	if d == nil {
		d = websocket.DefaultDialer
	}
	ph, _, err := d.Dial("ws://"+h.s.addrs["channel"]+"/botharness-device/channel", http.Header{"Authorization": {"Bearer " + h.tok}})
	if err != nil {
		t.Fatalf("phone: %v", err)
	}
	t.Cleanup(func() { ph.Close() })
	m, err := h.next(10 * time.Second)
	if err != nil || m.Type != "open" {
		t.Fatalf("computer: %+v %v, want open", m, err)
	}
	return ph, m.ID
}

type hostileCtlMsg struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Data string `json:"data"`
}

// next reads the computer's next control message, waiting at most within.
func (h *hostileChannel) next(within time.Duration) (hostileCtlMsg, error) {
	var m hostileCtlMsg
	_ = h.ctl.SetReadDeadline(time.Now().Add(within))
	_, raw, err := h.ctl.ReadMessage()
	if err != nil {
		return m, fmt.Errorf("control socket: %w", err)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("control message %.80q: %w", raw, err)
	}
	return m, nil
}

// send has the computer send data to the phone id.
func (h *hostileChannel) send(id, data string) error {
	b, err := json.Marshal(hostileCtlMsg{Type: "data", ID: id, Data: data})
	if err != nil {
		return err
	}
	h.wmu.Lock()
	defer h.wmu.Unlock()
	_ = h.ctl.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return h.ctl.WriteMessage(websocket.TextMessage, b)
}

// roundTrip sends text from the computer to the phone and back.
func (h *hostileChannel) roundTrip(t *testing.T, phone *websocket.Conn, id, text string) {
	t.Helper()
	if err := h.send(id, text); err != nil {
		t.Fatal(err)
	}
	_ = phone.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, got, err := phone.ReadMessage(); err != nil || string(got) != text {
		t.Fatalf("phone got %q %v, want %q", got, err, text)
	}
	if err := phone.WriteMessage(websocket.TextMessage, []byte(text)); err != nil {
		t.Fatal(err)
	}
	m, err := h.next(10 * time.Second)
	if err != nil || m.Type != "data" || m.ID != id || m.Data != text {
		t.Fatalf("computer got %+v %v, want %q from %s", m, err, text, id)
	}
}

// frozenDialer dials WebSockets for a client that will never read: its
// receive buffer is made small so that the server's send queue, not the
// kernel, holds what it is behind by, and the test needs to send only a few
// MiB.
func frozenDialer(tlsConf *tls.Config) *websocket.Dialer {
	nd := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	return &websocket.Dialer{NetDialContext: nd.DialContext, TLSClientConfig: tlsConf, HandshakeTimeout: 10 * time.Second}
}

// frozenBytes is how much a test sends to a frozen client whose server-side
// queue holds bound bytes: the bound plus more than the kernel's buffers
// hold on loopback (the server's send buffer grows to 4 MiB).
func frozenBytes(bound int) int { return bound + 5<<20 }

// expectCutOff reads what a frozen client was sent until its connection
// ends: with closeCode, or without a close frame (the server cuts a peer
// that does not read it within its close timeout). Fewer than sent messages
// may have arrived.
func expectCutOff(t *testing.T, c *websocket.Conn, closeCode, sent int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n := 0
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			n++
			continue
		}
		var ne net.Error
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			t.Fatalf("the frozen client is still connected after %d messages", n)
		case errors.As(err, &ce) && ce.Code != closeCode && ce.Code != websocket.CloseAbnormalClosure:
			t.Fatalf("the frozen client was closed with %d after %d messages, want %d", ce.Code, n, closeCode)
		}
		if n >= sent {
			t.Fatalf("the frozen client got all %d messages: it was never behind", n)
		}
		t.Logf("the frozen client found %d of %d messages, then %v", n, sent, err)
		return
	}
}

// liveReader reads n messages from c on its own goroutine and reports each
// index read on progress; check says whether message i is the right one.
// The result (nil when all n arrived in order) comes on the returned
// channel.
func liveReader(c *websocket.Conn, n int, progress chan<- int, check func(i int, msg []byte) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		for i := range n {
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, msg, err := c.ReadMessage()
			if err == nil {
				err = check(i, msg)
			}
			if err != nil {
				done <- fmt.Errorf("message %d: %w", i, err)
				return
			}
			progress <- i
		}
		done <- nil
	}()
	return done
}

// pace runs send(i) for i in [0, n) while keeping at most window messages
// ahead of the live reader, so that the live client, which reads, is never
// behind by its bound; it fails the test when the live reader fails.
func pace(t *testing.T, n, window int, progress <-chan int, live <-chan error, send func(i int) error) {
	t.Helper()
	seen, finished := -1, false
	waitFor := func(target, sent int) {
		for seen < target {
			if finished { // every index is already in progress's buffer
				seen = <-progress
				continue
			}
			select {
			case seen = <-progress:
			case err := <-live:
				if err != nil {
					t.Fatalf("the live client after %d messages (sent %d): %v", seen+1, sent, err)
				}
				finished = true
			}
		}
	}
	for i := range n {
		waitFor(i-window, i)
		if err := send(i); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	waitFor(n-1, n)
	if !finished {
		if err := <-live; err != nil {
			t.Fatalf("the live client: %v", err)
		}
	}
}

// awaitNotice waits for what tells a peer that a frozen client is gone: a
// reader goroutine sends nil on gone when it sees it, its error otherwise.
func awaitNotice(t *testing.T, gone <-chan error, what string) {
	t.Helper()
	select {
	case err := <-gone:
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30 s", what)
	}
}

// TestHostileFrozenReaders: on each kind of WebSocket, a client that never
// reads is cut off at its bound (the spec's close code, or a closed
// connection) while another client of the same relay gets every frame, in
// order, before, during and after.
func TestHostileFrozenReaders(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_APPS=chat:signal"}
	keys := make([]string, soakScale(t))
	for i := range keys {
		keys[i] = lastLine(cliOK(t, env, "keys", "channel", "add", "--host", "frozen-"+strconv.Itoa(i)))
	}
	clientToken := lastLine(cliOK(t, env, "keys", "agent", "account", "add", "acme"))
	pairKey := lastLine(cliOK(t, env, "keys", "agent", "pair-key", "acme"))
	r := startHostileRelay(t, env...)

	for round := range soakScale(t) {
		t.Run("channel phone/"+strconv.Itoa(round), func(t *testing.T) { frozenPhone(t, r, keys[round]) })
		t.Run("mailbox watch/"+strconv.Itoa(round), func(t *testing.T) { frozenWatcher(t, r) })
		t.Run("mailbox signal/"+strconv.Itoa(round), func(t *testing.T) { frozenSignal(t, r) })
	}
	inst := agentInstance(t, r, pairKey)
	for round := range soakScale(t) {
		t.Run("agent client/"+strconv.Itoa(round), func(t *testing.T) { frozenAgentClient(t, r, inst, clientToken) })
	}
}

// frozenPhone: the computer sends to a phone that never reads until the
// relay drops it (2 MiB queue, spec/private-channel.md) and tells the
// computer; another phone of the same computer gets every frame.
func frozenPhone(t *testing.T, r *hostileRelay, claimKey string) {
	_ = frozenPhoneOf(t, newHostileChannel(t, r.relayProc, claimKey), "")
}

// frozenPhoneOf is frozenPhone on pair's computer (where says where the
// phones are, for the messages): a phone that stops reading is dropped at
// its 2 MiB queue and the computer told, while another phone gets every
// frame, in order. It returns the live phone, still open.
func frozenPhoneOf(t *testing.T, pair *hostileChannel, where string) *websocket.Conn {
	frozen, frozenID := pair.phone(t, frozenDialer(nil))
	live, liveID := pair.phone(t, nil)

	gone := make(chan error, 1) // the computer hears that the frozen phone left
	go func() {
		for {
			m, err := pair.next(time.Minute)
			if err != nil || (m.Type == "close" && m.ID == frozenID) {
				gone <- err
				return
			}
		}
	}()
	big := strings.Repeat("z", 60000)
	n := frozenBytes(2<<20) / len(big)
	progress := make(chan int, n)
	liveDone := liveReader(live, n, progress, func(i int, msg []byte) error {
		if want := "live " + strconv.Itoa(i); string(msg) != want {
			return fmt.Errorf("got %.40q, want %q", msg, want)
		}
		return nil
	})
	pace(t, n, 4, progress, liveDone, func(i int) error {
		if err := pair.send(frozenID, big); err != nil {
			return err
		}
		return pair.send(liveID, "live "+strconv.Itoa(i))
	})
	awaitNotice(t, gone, "the computer's close message for the frozen phone"+where)
	expectCutOff(t, frozen, websocket.ClosePolicyViolation, n)
	pair.roundTrip(t, live, liveID, "still here")
	return live
}

// hostileMailbox claims a fresh mailbox of app chat.
func hostileMailbox(t *testing.T, r *hostileRelay) (id, token string) {
	t.Helper()
	l, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mb := (&sdkmailbox.Client{BaseURL: r.origin("mailbox"), App: "chat"}).Mailbox(l.ID, l.AccessToken())
	if _, err := mb.Claim(ctx); err != nil {
		t.Fatalf("claim a mailbox: %v", err)
	}
	return l.ID, l.AccessToken()
}

// mailboxSocket opens a watch or signal socket (path under the mailbox)
// through d (nil: the default dialer).
func mailboxSocket(t *testing.T, r *hostileRelay, d *websocket.Dialer, id, token, path string) *websocket.Conn {
	t.Helper()
	if d == nil {
		d = websocket.DefaultDialer
	}
	dd := *d
	dd.Subprotocols = []string{sdkmailbox.Subprotocol}
	c, resp, err := dd.Dial("ws://"+r.addrs["mailbox"]+"/v1/chat/mailbox/"+id+path, http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		t.Fatalf("%s: %v %v", path, err, resp)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frozenWatcher: envelopes are written while one watcher of the direction
// never reads; it is closed at 1 MiB behind (1013, spec/mailbox.md) and
// another watcher gets every envelope.
func frozenWatcher(t *testing.T, r *hostileRelay) {
	id, token := hostileMailbox(t, r)
	frozen := mailboxSocket(t, r, frozenDialer(nil), id, token, "/p2c/watch?after=0")
	live := mailboxSocket(t, r, nil, id, token, "/p2c/watch?after=0")
	watchers := func() float64 { return hostileMetric(t, r.relayProc, "edgerelay_mailbox_watch_sockets") }
	waitUntil(t, func() bool { return watchers() == 2 })

	const size = 60000
	n := frozenBytes(1<<20) / size // about 105: within the burst of 120 writes
	mb := (&sdkmailbox.Client{BaseURL: r.origin("mailbox"), App: "chat"}).Mailbox(id, token)
	progress := make(chan int, n)
	liveDone := liveReader(live, n, progress, func(i int, msg []byte) error {
		if len(msg) != size || binary.BigEndian.Uint64(msg[1:9]) != uint64(i+1) {
			return fmt.Errorf("got %d bytes, want envelope %d", len(msg), i+1)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pace(t, n, 4, progress, liveDone, func(i int) error {
		seq := uint64(i + 1)
		env := make([]byte, size)
		env[0] = 1
		binary.BigEndian.PutUint64(env[1:9], seq)
		_, err := mb.Put(ctx, link.P2C, seq, env, "")
		return err
	})
	waitUntil(t, func() bool { return watchers() == 1 })
	expectCutOff(t, frozen, websocket.CloseTryAgainLater, n)
}

// frozenSignal: one side of a signal pair never reads while the other sends;
// it is closed at 1 MiB behind (1013) and its peer is told; the pair of
// another mailbox gets every frame meanwhile.
func frozenSignal(t *testing.T, r *hostileRelay) {
	idA, tokA := hostileMailbox(t, r)
	idB, tokB := hostileMailbox(t, r)
	sender := mailboxSocket(t, r, nil, idA, tokA, "/signal/primary")
	frozen := mailboxSocket(t, r, frozenDialer(nil), idA, tokA, "/signal/companion")
	liveSender := mailboxSocket(t, r, nil, idB, tokB, "/signal/primary")
	live := mailboxSocket(t, r, nil, idB, tokB, "/signal/companion")
	for _, c := range []*websocket.Conn{sender, liveSender, live} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "peer 1" {
			t.Fatalf("got %q %v, want peer 1", msg, err)
		}
	}
	gone := make(chan error, 1) // the sender hears that its peer left
	go func() {
		for {
			_ = sender.SetReadDeadline(time.Now().Add(time.Minute))
			_, msg, err := sender.ReadMessage()
			if err != nil || string(msg) == "peer 0" {
				gone <- err
				return
			}
		}
	}()

	big := bytes.Repeat([]byte{0xa5}, 60000)
	n := frozenBytes(1<<20) / len(big) // within the burst of 400 frames
	progress := make(chan int, n)
	liveDone := liveReader(live, n, progress, func(i int, msg []byte) error {
		if string(msg) != strconv.Itoa(i) {
			return fmt.Errorf("got %.20q, want frame %d", msg, i)
		}
		return nil
	})
	pace(t, n, 4, progress, liveDone, func(i int) error {
		if err := sender.WriteMessage(websocket.BinaryMessage, big); err != nil {
			return err
		}
		return liveSender.WriteMessage(websocket.BinaryMessage, []byte(strconv.Itoa(i)))
	})
	awaitNotice(t, gone, "peer 0 for the sender")
	expectCutOff(t, frozen, websocket.CloseTryAgainLater, n)
}

// agentInstance pairs an instance of account acme with pairKey and
// connects it.
func agentInstance(t *testing.T, r *hostileRelay, pairKey string) *hostileInstance {
	t.Helper()
	return connectInstance(t, r, redeemPairKey(t, r.httpClient(), r.url("agent", ""), pairKey, "frozen-box"))
}

// connectInstance connects the instance redeemed names, until the test ends.
func connectInstance(t *testing.T, r *hostileRelay, redeemed pairRedemption) *hostileInstance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := agenttest.Dial(ctx, agenttest.Options{
		Addr: r.addrs["agent"], ServerName: "127.0.0.1", RootCAs: r.tls.RootCAs,
		Token: redeemed.InstanceToken, Instance: redeemed.InstanceID,
	})
	if err != nil {
		t.Fatalf("connector: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &hostileInstance{id: redeemed.InstanceID, conn: conn}
}

type hostileInstance struct {
	id   string
	conn *agenttest.Connector
}

// attach attaches a browser client through d and returns it with the
// session the instance sees its frames under.
func (in *hostileInstance) attach(t *testing.T, r *hostileRelay, d *websocket.Dialer, clientToken string) (*websocket.Conn, string) {
	t.Helper()
	dd := *d
	dd.TLSClientConfig = r.tls
	dd.Subprotocols = []string{"contenox-relay.v1", "bearer." + clientToken}
	c, resp, err := dd.Dial("wss://"+r.addrs["agent"]+"/v1/attach/"+in.id, nil)
	if err != nil {
		t.Fatalf("attach: %v %v", err, resp)
	}
	t.Cleanup(func() { c.Close() })
	return c, in.routed(t, c, "hello-"+randHex(t)[:8])
}

// routed sends a frame with id from client c and returns the session it
// reaches the instance under.
func (in *hostileInstance) routed(t *testing.T, c *websocket.Conn, id string) string {
	t.Helper()
	if err := c.WriteMessage(websocket.TextMessage, []byte(`{"type":"acp.message","id":"`+id+`"}`)); err != nil {
		t.Fatalf("client: %v", err)
	}
	for {
		f, err := in.conn.Next(10 * time.Second)
		if err != nil {
			t.Fatalf("instance, waiting for %s: %v", id, err)
		}
		if f.ID == id {
			return f.Session
		}
	}
}

// frozenAgentClient: the instance sends to a browser client that never
// reads; it is closed at its bound (1013, spec/agent-relay.md; 32 MiB:
// room for a largest frame behind another, README) and the instance gets
// its acp.detach, while another client of the same instance gets every
// frame.
func frozenAgentClient(t *testing.T, r *hostileRelay, in *hostileInstance, clientToken string) {
	frozen, frozenSess := in.attach(t, r, frozenDialer(nil), clientToken)
	live, liveSess := in.attach(t, r, websocket.DefaultDialer, clientToken)

	pad := strings.Repeat("x", 60000)
	n := frozenBytes(32<<20) / len(pad)
	line := func(sess string, i int, pad string) []byte {
		return []byte(`{"type":"acp.message","instance":"` + in.id + `","session":"` + sess + `","n":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`)
	}
	progress := make(chan int, n)
	liveDone := liveReader(live, n, progress, func(i int, msg []byte) error {
		if want := line(liveSess, i, ""); !bytes.Equal(msg, want) {
			return fmt.Errorf("got %.120s, want %s", msg, want)
		}
		return nil
	})
	pace(t, n, 4, progress, liveDone, func(i int) error {
		if err := in.conn.Send(line(frozenSess, i, pad)); err != nil {
			return err
		}
		return in.conn.Send(line(liveSess, i, ""))
	})
	for {
		f, err := in.conn.Next(30 * time.Second)
		if err != nil {
			t.Fatalf("waiting for the frozen client's detach: %v", err)
		}
		if f.Type == "acp.detach" && f.Session == frozenSess {
			break
		}
	}
	expectCutOff(t, frozen, websocket.CloseTryAgainLater, n)
	// The live client still reaches the instance.
	if sess := in.routed(t, live, "still-here"); sess != liveSess {
		t.Fatalf("still-here under session %q, want %q", sess, liveSess)
	}
}
