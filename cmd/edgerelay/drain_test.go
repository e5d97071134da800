package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/pion/logging"
	pionturn "github.com/pion/turn/v4"

	"edgerelay/internal/freeport"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// restCredential is a coturn REST credential under secret, valid for an hour.
func restCredential(secret, label string) (username, password string) {
	username = fmt.Sprintf("%d:%s", time.Now().Add(time.Hour).Unix(), label)
	mac := hmac.New(sha1.New, []byte(secret))
	mac.Write([]byte(username))
	return username, base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// turnClient is a pion TURN client of addr, listening for its answers.
func turnClient(t *testing.T, addr, secret, label string) *pionturn.Client {
	t.Helper()
	user, pass := restCredential(secret, label)
	c, err := pionturn.NewClient(&pionturn.ClientConfig{
		TURNServerAddr: addr, Username: user, Password: pass,
		Conn: mustUDP(t), LoggerFactory: logging.NewDefaultLoggerFactory(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.Listen(); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReliabilitySIGTERMDrainsEveryServiceAtOnce holds a TURN allocation
// open (as a closed browser tab does) and checks that SIGTERM still stops
// every service at once: the watch socket gets its 1001 while TURN waits,
// no new connection is accepted, a kept-alive connection cannot claim a
// mailbox, TURN refuses new allocations, and the process exits at the
// drain bound with exit 0 and TURN's error named once.
func TestReliabilitySIGTERMDrainsEveryServiceAtOnce(t *testing.T) {
	const drain = 8 * time.Second
	const secret = "drain-rest-secret"
	for cycle := range soakScale(t) {
		turnAddr := freeport.TCPAndUDP(t)
		s := startServer(t, "RELAY_APPS=notes", "RELAY_DRAIN_TIMEOUT="+drain.String(),
			"RELAY_TURN_LISTEN="+turnAddr, "RELAY_TURN_SECRET="+secret)
		base := s.origin("mailbox") + "/v1/notes/mailbox/drain-mailbox-0001"
		const tok = "drain-test-token-0123456789abcdef"
		if code := mailboxDo(t, "PUT", base, tok, nil); code != 201 {
			t.Fatalf("claim: %d", code)
		}
		d := websocket.Dialer{Subprotocols: []string{sdkmailbox.Subprotocol}}
		watch, _, err := d.Dial("ws"+strings.TrimPrefix(base, "http")+"/p2c/watch?after=0", http.Header{"Authorization": {"Bearer " + tok}})
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		defer watch.Close()
		// A kept-alive connection, idle after one answer.
		keep, err := net.Dial("tcp", s.addrs["mailbox"])
		if err != nil {
			t.Fatal(err)
		}
		defer keep.Close()
		keepR := bufio.NewReader(keep)
		head := fmt.Sprintf("HEAD /v1/notes/mailbox/drain-mailbox-0001/p2c HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer %s\r\n\r\n", tok)
		if _, err := keep.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		if resp, err := http.ReadResponse(keepR, &http.Request{Method: "HEAD"}); err != nil || resp.StatusCode != 200 {
			t.Fatalf("kept-alive HEAD: %v %v", resp, err)
		}
		held := turnClient(t, turnAddr, secret, "held")
		relayed, err := held.Allocate()
		if err != nil {
			t.Fatalf("allocate: %v", err)
		}
		defer relayed.Close()

		begin := time.Now()
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// The watch socket is closed with 1001 while TURN still waits for
		// its allocation: before the bound, not after it.
		_ = watch.SetReadDeadline(begin.Add(drain - time.Second))
		for {
			_, _, err := watch.ReadMessage()
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				if ce.Code != websocket.CloseGoingAway {
					t.Fatalf("cycle %d: watch closed with %d, want 1001", cycle, ce.Code)
				}
				break
			}
			if err != nil {
				t.Fatalf("cycle %d: no 1001 on the watch socket %v after SIGTERM: %v", cycle, time.Since(begin), err)
			}
		}
		// No new connection, on the mailbox listener or any other.
		for _, svc := range []string{"mailbox", "channel", "push-fcm", "agent"} {
			waitUntil(t, func() bool {
				c, err := net.Dial("tcp", s.addrs[svc])
				if err == nil {
					c.Close()
				}
				return err != nil
			})
		}
		// The idle kept-alive connection is closed by the server, and then
		// cannot claim. (A request written before the server got to it
		// would be one in flight, answered with Connection: close: the
		// listener closes first, the idle connections a moment later.)
		_ = keep.SetReadDeadline(time.Now().Add(drain))
		if _, err := keepR.ReadByte(); err == nil {
			t.Fatalf("cycle %d: the idle kept-alive connection sent bytes after SIGTERM", cycle)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("cycle %d: the idle kept-alive connection is still open %v after SIGTERM", cycle, time.Since(begin))
		}
		claim := "PUT /v1/notes/mailbox/drain-mailbox-0002 HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer " + tok + "\r\nContent-Length: 0\r\n\r\n"
		_, _ = keep.Write([]byte(claim))
		if resp, err := http.ReadResponse(keepR, nil); err == nil {
			t.Fatalf("cycle %d: a kept-alive connection was answered %d after SIGTERM", cycle, resp.StatusCode)
		}
		// TURN takes no new allocation (508) while it drains.
		if _, err := turnClient(t, turnAddr, secret, "late").Allocate(); err == nil {
			t.Fatalf("cycle %d: a new TURN allocation after SIGTERM", cycle)
		}
		select {
		case <-s.exited:
			t.Fatalf("cycle %d: exited %v after SIGTERM with a TURN allocation live", cycle, time.Since(begin))
		default:
		}
		select {
		case <-s.exited:
		case <-time.After(drain + 5*time.Second):
			t.Fatalf("cycle %d: no exit within %v after SIGTERM", cycle, drain+5*time.Second)
		}
		if code := s.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("cycle %d: exit %d\n%s", cycle, code, s.stderr.String())
		}
		logs := s.stderr.String()
		if !strings.Contains(logs, "turn: drain cut short with 1 allocations") || strings.Contains(logs, "turn: turn:") {
			t.Fatalf("cycle %d: the drain's end should name TURN once:\n%s", cycle, logs)
		}
		// Nothing was claimed after SIGTERM.
		s.start()
		if code := mailboxDo(t, "HEAD", s.origin("mailbox")+"/v1/notes/mailbox/drain-mailbox-0002/p2c", tok, nil); code != 404 {
			t.Fatalf("cycle %d: the claim after SIGTERM was stored (%d)", cycle, code)
		}
		s.kill()
	}
}
