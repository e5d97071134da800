package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// TestIdleSocketsParkThroughTheBinary: with RELAY_WS_PARK on (the default)
// idle watch, signal, control and phone sockets are parked
// (edgerelay_ws_parked_sockets counts them all) and hold almost no
// goroutine; with it off every socket keeps its reader. Both ways, parked
// or not, every socket still gets what it is sent: envelopes on the
// watches, signal frames, channel frames both ways.
func TestIdleSocketsParkThroughTheBinary(t *testing.T) {
	for _, park := range []bool{true, false} {
		t.Run("RELAY_WS_PARK="+strconv.FormatBool(park), func(t *testing.T) {
			idleSocketsServed(t, park)
		})
	}
}

func idleSocketsServed(t *testing.T, park bool) {
	const (
		mailboxes = 4
		watchers  = 8 // per mailbox, the most one direction may have
		phones    = 16
	)
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_APPS=chat:signal", "RELAY_WS_PARK=" + strconv.FormatBool(park)}
	claimKey := lastLine(cliOK(t, env, "keys", "channel", "add", "--host", "parked"))
	r := startHostileRelay(t, env...)
	goroutines := func() float64 { return hostileMetric(t, r.relayProc, "go_goroutines") }
	before := goroutines()

	type box struct {
		id, token   string
		watches     []*websocket.Conn
		signalPairs [2]*websocket.Conn
	}
	boxes := make([]box, mailboxes)
	for i := range boxes {
		b := &boxes[i]
		b.id, b.token = hostileMailbox(t, r)
		for range watchers {
			b.watches = append(b.watches, mailboxSocket(t, r, nil, b.id, b.token, "/p2c/watch?after=0"))
		}
		b.signalPairs[0] = mailboxSocket(t, r, nil, b.id, b.token, "/signal/primary")
		b.signalPairs[1] = mailboxSocket(t, r, nil, b.id, b.token, "/signal/companion")
		for _, c := range b.signalPairs {
			expectText(t, c, "peer 1")
		}
	}
	ch := newHostileChannel(t, r.relayProc, claimKey)
	phoneConns := make([]*websocket.Conn, phones)
	phoneIDs := make([]string, phones)
	for i := range phoneConns {
		phoneConns[i], phoneIDs[i] = ch.phone(t, nil)
	}
	sockets := mailboxes*(watchers+2) + 1 + phones

	if park {
		parked := func() float64 { return hostileMetric(t, r.relayProc, "edgerelay_ws_parked_sockets") }
		waitUntil(t, func() bool { return parked() == float64(sockets) })
		// Parked sockets keep no goroutine; a handful run for other
		// reasons (fasthttp's idle workers, a timer's callback).
		per := (goroutines() - before) / float64(sockets)
		t.Logf("%d sockets parked, %.2f goroutines each", sockets, per)
		if per > 0.25 {
			t.Fatalf("%.2f goroutines per parked socket", per)
		}
	} else {
		waitUntil(t, func() bool {
			return hostileMetric(t, r.relayProc, "edgerelay_mailbox_watch_sockets") == mailboxes*watchers
		})
		per := (goroutines() - before) / float64(sockets)
		t.Logf("%d sockets unparked, %.2f goroutines each", sockets, per)
		if per < 1 {
			t.Fatalf("%.2f goroutines per socket with parking off: not a reader per socket", per)
		}
	}

	// Everything is delivered to idle sockets, parked or not, twice (a
	// woken socket parks again).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := range 2 {
		seq := uint64(round + 1)
		for _, b := range boxes {
			env := make([]byte, 64)
			env[0] = 1
			binary.BigEndian.PutUint64(env[1:9], seq)
			mb := (&sdkmailbox.Client{BaseURL: r.origin("mailbox"), App: "chat"}).Mailbox(b.id, b.token)
			if _, err := mb.Put(ctx, link.P2C, seq, env, ""); err != nil {
				t.Fatalf("put: %v", err)
			}
			for _, w := range b.watches {
				_ = w.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, msg, err := w.ReadMessage()
				if err != nil || len(msg) != 64 || binary.BigEndian.Uint64(msg[1:9]) != seq {
					t.Fatalf("watch round %d: %d bytes %v", round, len(msg), err)
				}
			}
			frame := []byte("signal " + strconv.Itoa(round))
			if err := b.signalPairs[0].WriteMessage(websocket.BinaryMessage, frame); err != nil {
				t.Fatal(err)
			}
			_ = b.signalPairs[1].SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, msg, err := b.signalPairs[1].ReadMessage(); err != nil || string(msg) != string(frame) {
				t.Fatalf("signal round %d: %q %v", round, msg, err)
			}
		}
		for i, ph := range phoneConns {
			ch.roundTrip(t, ph, phoneIDs[i], "round "+strconv.Itoa(round)+" phone "+strconv.Itoa(i))
		}
		if park {
			waitUntil(t, func() bool {
				return hostileMetric(t, r.relayProc, "edgerelay_ws_parked_sockets") == float64(sockets)
			})
		}
	}
}

// expectText reads the next message of c and checks it is text want.
func expectText(t *testing.T, c *websocket.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, msg, err := c.ReadMessage(); err != nil || string(msg) != want {
		t.Fatalf("got %q %v, want %q", msg, err, want)
	}
}

// TestKeepAliveConnectionsParkThroughTheBinary: plain-HTTP keep-alive
// connections left idle after a request are parked until their next one
// (edgerelay_listener_waiting_connections counts them) and hold almost no
// goroutine; their next requests are answered on the same connections.
func TestKeepAliveConnectionsParkThroughTheBinary(t *testing.T) {
	const perService = 12
	r := startHostileRelay(t, "RELAY_DATA_DIR="+t.TempDir())
	goroutines := func() float64 { return hostileMetric(t, r.relayProc, "go_goroutines") }
	waiting := func() float64 {
		return hostileMetric(t, r.relayProc, `edgerelay_listener_waiting_connections{service="channel"}`) +
			hostileMetric(t, r.relayProc, `edgerelay_listener_waiting_connections{service="admin"}`)
	}
	before := goroutines()
	type keptAlive struct {
		c    net.Conn
		r    *bufio.Reader
		addr string
		path string
	}
	var conns []keptAlive
	for _, svc := range []struct{ name, path string }{{"channel", "/health"}, {"admin", "/healthz"}} {
		for range perService {
			addr := r.relayProc.addrs[svc.name]
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			conns = append(conns, keptAlive{c: c, r: bufio.NewReader(c), addr: addr, path: svc.path})
		}
	}
	ask := func(k keptAlive) {
		t.Helper()
		_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(k.c, "GET "+k.path+" HTTP/1.1\r\nHost: "+k.addr+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(k.r, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", k.path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("GET %s: %d (close %v), want 200 kept alive", k.path, resp.StatusCode, resp.Close)
		}
	}
	for round := range 2 {
		for _, k := range conns {
			ask(k)
		}
		// The metrics scrapes are keep-alive connections of their own
		// that may be parked too: at least every test connection is.
		waitUntil(t, func() bool { return waiting() >= float64(len(conns)) })
		// fasthttp keeps the goroutines that served them for a moment,
		// for the next connections (2 s with parking on).
		var per float64
		waitUntil(t, func() bool {
			per = (goroutines() - before) / float64(len(conns))
			return per <= 0.25
		})
		t.Logf("round %d: %d keep-alive connections parked, %.2f goroutines each", round, len(conns), per)
	}
}
