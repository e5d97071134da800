//go:build linux && !nopark

package ws_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/fastpath/ws"
)

// Parking: sockets served by Conn.Serve with a Parker give their goroutines
// back while idle, and every contract holds across parking: messages,
// pings and their deadline, silence, closes from either side, TLS.

// parked is a server whose sockets are served (echo) and parked.
type parked struct {
	*testServer
	p    *ws.Parker
	ends chan error // each socket's onEnd, in order
	last atomic.Pointer[ws.Conn]
}

func startParked(t *testing.T, opts ws.Options, tlsOn bool) *parked {
	t.Helper()
	p, err := ws.NewParker()
	if err != nil {
		t.Fatal(err)
	}
	ps := &parked{p: p, ends: make(chan error, 1024)}
	opts.Parker, opts.Detach = p, true
	if opts.ParkAfter == 0 {
		opts.ParkAfter = 20 * time.Millisecond
	}
	serve := func(c *ws.Conn) {
		ps.last.Store(c)
		c.Serve(func(op int, msg []byte) bool {
			if op == ws.OpText {
				return c.WriteText(msg) == nil
			}
			return c.WriteBinary(msg) == nil
		}, func(err error) { ps.ends <- err })
	}
	if tlsOn {
		ps.testServer = startTLSServer(t, opts, serve)
	} else {
		ps.testServer = startServer(t, opts, serve)
	}
	t.Cleanup(func() { _ = p.Close() })
	return ps
}

func (ps *parked) waitParked(t *testing.T, n int) {
	t.Helper()
	waitFor(t, "sockets parked", func() bool { return ps.p.Parked() == n })
}

func (ps *parked) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-ps.ends:
		return err
	case <-time.After(waitTimeout):
		t.Fatal("onEnd did not run")
		return nil
	}
}

// Idle sockets hold no goroutine, and wake for what they are sent.
func TestIdleSocketsParkWithoutGoroutines(t *testing.T) {
	const n = 200
	ps := startParked(t, ws.Options{PingInterval: time.Hour}, false)
	go func() { // the harness hands each Conn over; nobody here wants them
		for {
			select {
			case <-ps.conns:
			case <-ps.stop:
				return
			}
		}
	}()
	before := runtime.NumGoroutine()
	clients := make([]*rawClient, n)
	for i := range clients {
		clients[i] = dialRaw(t, ps.addr, 0)
	}
	ps.waitParked(t, n)
	if extra := runtime.NumGoroutine() - before; extra > n/10 {
		t.Fatalf("%d idle parked sockets keep %d goroutines", n, extra)
	}
	for round := range 3 {
		for i, rc := range clients {
			msg := []byte{byte(round), byte(i), byte(i >> 8)}
			rc.send(frame(fin|ws.OpBinary, msg))
			rc.expectFrame(ws.OpBinary, msg)
		}
		ps.waitParked(t, n) // ParkAfter after its message, each parks again
	}
	if ps.p.Registered() != n {
		t.Fatalf("%d sockets registered, expected %d", ps.p.Registered(), n)
	}
}

// A parked socket gets its pings on time and, answering none, is aborted;
// one that answers stays open, parked between pings.
func TestParkedSocketPings(t *testing.T) {
	const interval = 100 * time.Millisecond
	ps := startParked(t, ws.Options{PingInterval: interval}, false)
	quiet := dialRaw(t, ps.addr, 0)
	answering := dialRaw(t, ps.addr, 0)
	ps.waitParked(t, 2)

	for range 4 {
		f, err := answering.readFrame()
		if err != nil || f.op != ws.OpPing {
			t.Fatalf("expected a ping, got op %d, %v", f.op, err)
		}
		answering.send(frame(fin|ws.OpPong, f.payload))
	}
	// The quiet client got its first ping and answered nothing: aborted
	// at the next tick, without a close frame.
	f, err := quiet.readFrame()
	if err != nil || f.op != ws.OpPing {
		t.Fatalf("expected a ping, got op %d, %v", f.op, err)
	}
	quiet.expectEnd()
	if err := ps.end(t); err == nil {
		t.Fatal("the aborted socket's reading ended without an error")
	}
	ps.waitParked(t, 1) // the answering one, between its pings
	select {
	case err := <-ps.ends:
		t.Fatalf("the answering socket ended: %v", err)
	default:
	}
}

// A silent parked socket is closed with 1001 at the silence's deadline,
// not at the next ping tick.
func TestParkedSocketSilenceTimeout(t *testing.T) {
	const silence = 300 * time.Millisecond
	ps := startParked(t, ws.Options{SilenceTimeout: silence, PingInterval: time.Hour}, false)
	start := time.Now()
	rc := dialRaw(t, ps.addr, 0)
	ps.waitParked(t, 1)
	f, err := rc.readFrame()
	took := time.Since(start)
	if err != nil || f.op != ws.OpClose || binary.BigEndian.Uint16(f.payload) != ws.CloseGoingAway {
		t.Fatalf("expected a close with 1001, got op %d %q, %v", f.op, f.payload, err)
	}
	if took < silence {
		t.Fatalf("closed after %v, before the silence of %v", took, silence)
	}
	if took > silence+lingerSlack {
		t.Fatalf("closed after %v, a silence of %v", took, silence)
	}
	rc.send(closeFrame(ws.CloseGoingAway, ""))
	var ce *ws.CloseError
	if err := ps.end(t); !errors.As(err, &ce) || !ce.ByPeer {
		t.Fatalf("reading ended with %v, expected the peer's close", err)
	}
}

// One timer carries both rules of a mailbox socket: a parked socket whose
// client reads the pings and answers none gets them every interval, and
// is closed with 1001 at the silence's deadline, between two ticks; one
// that answers stays open past several silences.
func TestParkedSocketPingsUntilItsSilence(t *testing.T) {
	const interval, silence = 200 * time.Millisecond, 500 * time.Millisecond
	ps := startParked(t, ws.Options{SilenceTimeout: silence, PingInterval: interval}, false)
	start := time.Now()
	quiet := dialRaw(t, ps.addr, 0)
	answering := dialRaw(t, ps.addr, 0)
	ps.waitParked(t, 2)
	var answered atomic.Int32
	go func() { // answers every ping; ends with the socket
		for {
			f, err := answering.readFrame()
			if err != nil {
				return
			}
			if f.op == ws.OpPing {
				answering.send(frame(fin|ws.OpPong, f.payload))
				answered.Add(1)
			}
		}
	}()

	pings := 0
	for {
		f, err := quiet.readFrame()
		if err != nil {
			t.Fatalf("after %d pings: %v", pings, err)
		}
		if f.op == ws.OpPing {
			pings++
			continue
		}
		took := time.Since(start)
		if f.op != ws.OpClose || binary.BigEndian.Uint16(f.payload) != ws.CloseGoingAway {
			t.Fatalf("expected a close with 1001, got op %d %q", f.op, f.payload)
		}
		if took < silence || took > silence+lingerSlack {
			t.Fatalf("closed after %v, a silence of %v", took, silence)
		}
		break
	}
	if pings < 2 {
		t.Fatalf("%d pings in a silence of %v, every %v", pings, silence, interval)
	}
	quiet.send(closeFrame(ws.CloseGoingAway, ""))
	if err := ps.end(t); err == nil {
		t.Fatal("the silent socket's reading ended without an error")
	}
	// Pings over three silences, each answered: still open.
	waitFor(t, "pings over three silences", func() bool { return answered.Load() > int32(3*silence/interval) })
	select {
	case err := <-ps.ends:
		t.Fatalf("the answering socket ended: %v", err)
	default:
	}
}

// Closes reach parked sockets from both sides.
func TestParkedSocketCloses(t *testing.T) {
	ps := startParked(t, ws.Options{PingInterval: time.Hour}, false)
	rc := dialRaw(t, ps.addr, 0)
	c := ps.accept(t)
	ps.waitParked(t, 1)

	// The server closes: the frame goes out, the peer's answer is read.
	c.Close(ws.CloseReplaced, "replaced")
	f, err := rc.readFrame()
	if err != nil || f.op != ws.OpClose || binary.BigEndian.Uint16(f.payload) != ws.CloseReplaced {
		t.Fatalf("expected a close with 4000, got op %d %q, %v", f.op, f.payload, err)
	}
	rc.send(closeFrame(ws.CloseReplaced, ""))
	var ce *ws.CloseError
	if err := ps.end(t); !errors.As(err, &ce) || !ce.ByPeer || ce.Code != ws.CloseReplaced {
		t.Fatalf("reading ended with %v, expected the peer's 4000", err)
	}
	rc.expectEnd()
	waitDone(t, c, waitTimeout)

	// The peer closes a parked socket: echoed, and onEnd has its close.
	rc2 := dialRaw(t, ps.addr, 0)
	c2 := ps.accept(t)
	ps.waitParked(t, 1)
	rc2.send(closeFrame(4321, "bye"))
	rc2.expectClose(4321)
	if err := ps.end(t); !errors.As(err, &ce) || !ce.ByPeer || ce.Code != 4321 || ce.Reason != "bye" {
		t.Fatalf("reading ended with %v, expected the peer's 4321 bye", err)
	}
	// The socket leaves the set when it is torn down, which may come
	// after onEnd: by the end of its writer.
	waitDone(t, c2, waitTimeout)
	if ps.p.Registered() != 0 || ps.p.Parked() != 0 {
		t.Fatalf("ended sockets still registered (%d) or parked (%d)", ps.p.Registered(), ps.p.Parked())
	}
}

// A drain closes parked sockets with 1001 and waits for them.
func TestGroupDrainsParkedSockets(t *testing.T) {
	ps := startParked(t, ws.Options{PingInterval: time.Hour}, false)
	var g ws.Group
	clients := make([]*rawClient, 20)
	for i := range clients {
		clients[i] = dialRaw(t, ps.addr, 0)
		g.Add(ps.accept(t))
	}
	ps.waitParked(t, len(clients))
	drained := make(chan error, 1)
	go func() { drained <- g.Drain(t.Context(), ws.CloseGoingAway) }()
	for _, rc := range clients {
		f, err := rc.readFrame()
		if err != nil || f.op != ws.OpClose || binary.BigEndian.Uint16(f.payload) != ws.CloseGoingAway {
			t.Fatalf("expected a close with 1001, got op %d %q, %v", f.op, f.payload, err)
		}
		rc.send(closeFrame(ws.CloseGoingAway, ""))
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the drain did not end")
	}
}

// A fragmented message in progress keeps its goroutine: the socket does
// not park between fragments, and the message arrives whole.
func TestFragmentedMessageDoesNotPark(t *testing.T) {
	ps := startParked(t, ws.Options{PingInterval: time.Hour, ParkAfter: 10 * time.Millisecond}, false)
	rc := dialRaw(t, ps.addr, 0)
	ps.waitParked(t, 1)
	rc.send(frame(ws.OpText, []byte("hel")))
	waitFor(t, "the socket to wake", func() bool { return ps.p.Parked() == 0 })
	time.Sleep(100 * time.Millisecond) // ten park waits: it must not park meanwhile
	if ps.p.Parked() != 0 {
		t.Fatal("parked inside a fragmented message")
	}
	rc.send(frame(fin|ws.OpContinuation, []byte("lo")))
	rc.expectFrame(ws.OpText, []byte("hello"))
	ps.waitParked(t, 1)
}

// Under TLS, a record the TLS layer read ahead of the one it returned sits
// in crypto/tls's buffer, where epoll cannot see it: the socket must read
// it before it parks. A pong and a message in two records of one segment
// leave the message there once the pong is read.
func TestParkedTLSReadsBufferedRecords(t *testing.T) {
	ps := startParked(t, ws.Options{PingInterval: time.Hour}, true)
	raw, err := net.Dial("tcp", ps.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	held := &heldConn{Conn: raw}
	tc := tls.Client(held, &tls.Config{InsecureSkipVerify: true}) // the test's own certificate
	_ = tc.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := tc.Write([]byte(upgradeRequest(ps.addr))); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	rc := &rawClient{t: t, nc: tc, br: br}
	ps.waitParked(t, 1)
	for i := range 20 {
		held.hold.Store(true)
		if _, err := tc.Write(frame(fin|ws.OpPong, nil)); err != nil {
			t.Fatal(err)
		}
		msg := []byte{'m', byte(i)}
		if _, err := tc.Write(frame(fin|ws.OpBinary, msg)); err != nil {
			t.Fatal(err)
		}
		held.flush(t)
		rc.expectFrame(ws.OpBinary, msg)
		ps.waitParked(t, 1)
	}
	// Parked, the socket's records are tlsrec's (crypto/tls dropped with
	// its buffers); the messages above went both ways through it, and so
	// does the close.
	if !ws.TLSTakenOver(ps.last.Load()) {
		t.Fatal("a parked TLS 1.3 socket kept crypto/tls's record layer")
	}
	// A delivery to the parked socket builds its write keys, and they go
	// when its writer is done.
	if err := ps.last.Load().WriteText([]byte("delivered")); err != nil {
		t.Fatal(err)
	}
	rc.expectFrame(ws.OpText, []byte("delivered"))
	waitFor(t, "the write keys to go", func() bool { return !ws.TLSWriteKeysHeld(ps.last.Load()) })
	ps.last.Load().Close(ws.CloseNormal, "bye")
	rc.expectClose(ws.CloseNormal)
}

// heldConn gathers writes while hold is set and sends them in one write
// on flush: two TLS records in one segment.
type heldConn struct {
	net.Conn
	hold atomic.Bool
	buf  bytes.Buffer
}

func (h *heldConn) Write(p []byte) (int, error) {
	if h.hold.Load() {
		return h.buf.Write(p)
	}
	return h.Conn.Write(p)
}

func (h *heldConn) flush(t *testing.T) {
	t.Helper()
	h.hold.Store(false)
	if _, err := h.Conn.Write(h.buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	h.buf.Reset()
}
