package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/internal/freeport"
)

// hostileStateRequest is one request a stranger can send without a secret,
// and the status it must get. {id} and {tok} are replaced by a fresh random
// mailbox id (or instance id) and bearer for every request.
type hostileStateRequest struct {
	head   bool // a HEAD: the answer has no body
	req    string
	status int
}

// upgradeHeaders make a request a WebSocket handshake (refused before any
// upgrade: the bearer is refused first).
const upgradeHeaders = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"

// hostileStateMix is, per listener, the unauthenticated requests of the
// soak: every mailbox path (of a mailbox that does not exist, and of one
// another token holds), and the other listeners' paths that look a secret
// up before anything else.
func hostileStateMix(held string) map[string][]hostileStateRequest {
	mb := "/v1/chat/mailbox/{id}"
	env := make([]byte, 25)
	env[0] = 0x01
	env[8] = 1 // sequence 1
	// send is a request with a stranger's bearer; {tok} in body becomes
	// the same 32-character bearer.
	send := func(method, path, extra, body string) string {
		n := len(body) + strings.Count(body, "{tok}")*(32-len("{tok}"))
		return method + " " + path + " HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {tok}\r\n" + extra +
			"Content-Length: " + strconv.Itoa(n) + "\r\n\r\n" + body
	}
	put := func(path, extra string, body []byte) string { return send("PUT", path, extra, string(body)) }
	post := func(path, body string) string { return send("POST", path, "Content-Type: application/json\r\n", body) }
	req := func(method, path, extra string) string {
		return method + " " + path + " HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {tok}\r\n" + extra + "\r\n"
	}
	return map[string][]hostileStateRequest{
		"mailbox": {
			{true, req("HEAD", mb+"/p2c", ""), 404},
			{false, req("GET", mb+"/c2p?after=0&limit=10", ""), 404},
			{false, req("GET", mb+"/p2c/1", ""), 404},
			{true, req("HEAD", mb+"/c2p/9", ""), 404},
			{false, put(mb+"/p2c/1", "Content-Type: application/octet-stream\r\nX-Relay-Notify: alert\r\n", env), 404},
			{false, req("GET", mb+"/p2c/watch?after=0", upgradeHeaders), 404},
			{false, req("GET", mb+"/signal/primary", upgradeHeaders), 404},
			{false, req("GET", mb+"/ice", ""), 404},
			{false, put(mb+"/c2p/push", "Content-Type: application/json\r\n", []byte(`{"service":"fcm","token":"x","tag":"t"}`)), 404},
			{false, req("DELETE", mb+"/p2c?through=1", ""), 404},
			{false, req("DELETE", mb, ""), 404},
			// A mailbox that exists, with a stranger's bearer.
			{true, req("HEAD", "/v1/chat/mailbox/"+held+"/p2c", ""), 403},
			{false, req("GET", "/v1/chat/mailbox/"+held+"/c2p/watch", upgradeHeaders), 403},
			{false, req("GET", "/v1/chat/mailbox/"+held+"/ice", ""), 403},
			{false, put("/v1/chat/mailbox/"+held, "", nil), 409},
		},
		"channel": {
			{false, req("GET", "/status", ""), 404},
			{false, req("GET", "/host", upgradeHeaders), 403},
			{false, req("GET", "/botharness-device/channel", upgradeHeaders), 403},
			{false, post("/claim", `{"ownerToken":"`+strings.Repeat("a", 64)+`","phoneToken":"`+strings.Repeat("b", 64)+`"}`), 403},
		},
		"agent": {
			{false, req("GET", "/v1/connect", "Connection: Upgrade\r\nUpgrade: contenox-relay/1\r\n"), 403},
			{false, req("GET", "/v1/attach/{id}", upgradeHeaders), 401},
			{false, post("/v1/pair/redeem", `{"key":"{tok}","instance_name":"x"}`), 403},
		},
		"push-fcm":  {{false, post("/send", ""), 401}},
		"push-apns": {{false, post("/send", ""), 401}},
		"admin": {
			{false, req("GET", "/v1/keys/channel", ""), 401},
			{false, req("GET", "/v1/keys/agent/accounts", ""), 401},
		},
	}
}

// randomToken is n characters of base64url from rng: a valid mailbox id
// or bearer that nobody holds.
func randomToken(rng *rand.Rand, n int) string {
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	return base64.RawURLEncoding.EncodeToString(raw)[:n]
}

// hostileFlood sends n requests of mix over one connection to service,
// pipelined (at most window unanswered), each with a fresh random id and
// bearer, and checks every answer's status.
func hostileFlood(r *hostileRelay, service string, mix []hostileStateRequest, n int, seed uint64) error {
	c, err := r.dial(service)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	const window = 64
	expect := make(chan hostileStateRequest, window)
	werr := make(chan error, 1)
	go func() {
		defer close(expect)
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		bw := bufio.NewWriterSize(c, 32<<10)
		for i := range n {
			q := mix[i%len(mix)]
			line := strings.Replace(q.req, "{id}", randomToken(rng, 22), 1)
			line = strings.ReplaceAll(line, "{tok}", randomToken(rng, 32))
			select {
			case expect <- q:
			default:
				// The window is full: send what is buffered, then wait.
				if err := bw.Flush(); err != nil {
					werr <- err
					return
				}
				expect <- q
			}
			if _, err := bw.WriteString(line); err != nil {
				werr <- err
				return
			}
		}
		werr <- bw.Flush()
	}()
	br := bufio.NewReaderSize(c, 32<<10)
	got := 0
	for q := range expect {
		status, err := readStatus(br, q.head)
		if err != nil {
			return fmt.Errorf("%s: answer %d of %d: %w", service, got+1, n, err)
		}
		if status != q.status {
			return fmt.Errorf("%s: %q answered %d, want %d", service, strings.SplitN(q.req, "\r\n", 2)[0], status, q.status)
		}
		got++
	}
	return <-werr
}

// readStatus reads one HTTP/1.1 answer and returns its status; the body
// (by Content-Length, none for a HEAD) is skipped.
func readStatus(br *bufio.Reader, head bool) (int, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, fmt.Errorf("status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("status line %q", line)
	}
	length := 0
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(h, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return 0, fmt.Errorf("header %q", h)
			}
		}
	}
	if !head {
		if _, err := br.Discard(length); err != nil {
			return 0, err
		}
	}
	return status, nil
}

// turnFlood sends n unauthenticated Allocate requests to the TURN listener
// over UDP, window at a time, and checks each gets the 401 challenge (an
// Allocate error response). pion's nonces are stateless: nothing is kept.
func turnFlood(addr string, n int, seed uint64) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(seed, seed))
	req := make([]byte, 28)
	binary.BigEndian.PutUint16(req[0:], 0x0003) // Allocate request
	binary.BigEndian.PutUint16(req[2:], 8)
	binary.BigEndian.PutUint32(req[4:], 0x2112A442)
	binary.BigEndian.PutUint16(req[20:], 0x0019) // REQUESTED-TRANSPORT
	binary.BigEndian.PutUint16(req[22:], 4)
	req[24] = 17 // UDP
	const window = 16
	buf := make([]byte, 1500)
	for sent := 0; sent < n; sent += window {
		for range window {
			binary.BigEndian.PutUint64(req[8:], rng.Uint64())
			binary.BigEndian.PutUint32(req[16:], rng.Uint32())
			if _, err := c.Write(req); err != nil {
				return err
			}
		}
		for range window {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			k, err := c.Read(buf)
			if err != nil {
				return fmt.Errorf("turn: after %d requests: %w", sent, err)
			}
			if k < 20 || binary.BigEndian.Uint16(buf) != 0x0113 {
				return fmt.Errorf("turn: answer type %#x, want an Allocate error response", buf[:2])
			}
		}
	}
	return nil
}

// processRSS is the relay process's resident set size in bytes.
func processRSS(t *testing.T, s *relayProc) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

// TestHostileUnauthenticatedRequestsKeepNoState floods every listener with
// requests that carry no valid secret, each naming a fresh random mailbox
// (or instance) and bearer, pipelined over several connections: every
// mailbox path, the channel, agent, push gateway and admin listeners, and
// TURN's unauthenticated Allocate. Nothing may be kept for them: after a
// warm-up (fasthttp's buffers, Pebble's caches, the heap's steady size) the
// relay's RSS stays within a few MiB however many more arrive, and the
// mailbox relay holds in memory only the one mailbox that was claimed.
// Before the fix every refused mailbox request left an entry of about
// 460 bytes for ten minutes (2.9 GB after 6M requests).
func TestHostileUnauthenticatedRequestsKeepNoState(t *testing.T) {
	turnAddr := freeport.TCPAndUDP(t)
	r := startHostileRelay(t, "RELAY_APPS=chat:push=com.example.chat,signal,ice",
		"RELAY_TURN_LISTEN="+turnAddr, "RELAY_TURN_SECRET=hostile-state-secret",
		// Garbage is collected at 20% over the live heap rather than 100%,
		// so that the heap's peak, which RSS follows, sways by a few MiB
		// and growth of what is kept stands out of it.
		"GOGC=20")
	held, _ := hostileMailbox(t, r)
	mix := hostileStateMix(held)

	// Per round: mailboxConns connections to the mailbox listener and one
	// to each other listener, each sending perConn requests.
	const mailboxConns = 10
	perConn := 25000 * soakScale(t)
	if raceEnabled {
		perConn = 5000 * soakScale(t)
	}
	round := func(name string, perConn int, seed uint64) (requests int) {
		t.Helper()
		began := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		flood := func(service string, n int, seed uint64) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := hostileFlood(r, service, mix[service], n, seed); err != nil {
					errs <- err
				}
			}()
		}
		for i := range mailboxConns {
			flood("mailbox", perConn, seed+uint64(i))
		}
		for i, service := range []string{"channel", "agent", "push-fcm", "push-apns", "admin"} {
			flood(service, perConn/4, seed+100+uint64(i))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := turnFlood(turnAddr, perConn/8, seed+200); err != nil {
				errs <- err
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		n := mailboxConns*perConn + 5*(perConn/4)
		t.Logf("%s: %d requests in %v (and %d TURN Allocates)", name, n, time.Since(began).Round(time.Millisecond), perConn/8)
		return n
	}

	// The warm-up grows what is reused, not kept: connection buffers, the
	// store's block cache, the heap up to its steady size under this load.
	// RSS sways with the heap's peak between collections (and, under
	// -race, with the detector's shadow memory), so what is compared is
	// the least RSS of the last floods against the most of the warm-up's
	// end: anything kept per request shows as growth of every sample.
	const warmups, floods = 3, 4
	var before, after int64
	requests := 0
	for i := range warmups + floods {
		name := "flood " + strconv.Itoa(i+1-warmups)
		if i < warmups {
			name = "warm-up " + strconv.Itoa(i+1)
		}
		requests += round(name, perConn, uint64(1000*(i+1)))
		rss := processRSS(t, r.relayProc)
		t.Logf("RSS %.1f MiB, heap in use %.1f MiB", float64(rss)/(1<<20),
			hostileMetric(t, r.relayProc, "go_memstats_heap_inuse_bytes")/(1<<20))
		switch {
		case i == warmups-1:
			requests = 0
			fallthrough
		case i == warmups-2:
			before = max(before, rss)
		case i >= warmups+floods-2:
			if after == 0 || rss < after {
				after = rss
			}
		}
	}
	growth := after - before
	t.Logf("RSS %.1f MiB at the warm-up's end, %.1f MiB after %d more requests (%+.1f MiB, %.1f bytes per request)",
		float64(before)/(1<<20), float64(after)/(1<<20), requests, float64(growth)/(1<<20), float64(growth)/float64(requests))
	limit := int64(8 << 20)
	if raceEnabled {
		limit = 16 << 20 // the detector's shadow memory sways more
	}
	if growth > limit {
		t.Errorf("RSS grew %.1f MiB over %d unauthenticated requests (%.0f bytes each), want at most %d MiB",
			float64(growth)/(1<<20), requests, float64(growth)/float64(requests), limit>>20)
	}
	if n := hostileMetric(t, r.relayProc, "edgerelay_mailbox_loaded"); n != 1 {
		t.Errorf("edgerelay_mailbox_loaded = %v after the flood, want 1 (the claimed mailbox alone)", n)
	}
}
