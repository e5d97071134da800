//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestExhaustFileDescriptors runs the binary with a low open-files limit and
// fills it with connections to the channel listener. Once the process has no
// descriptor left, a new connection must be closed at once (not left in the
// backlog, where a client hangs until its own timeout) and counted in
// edgerelay_listener_refused_total{reason="fds"}; the log gets a bounded
// number of warnings, not one per attempt; the process keeps running, and
// what was open keeps working: keep-alive HTTP connections on the exhausted
// listener and on the admin listener, and a computer's control socket with
// its phone. Closing the filler connections makes the listener serve again.
func TestExhaustFileDescriptors(t *testing.T) {
	const nofile = 256
	dir := t.TempDir()
	// Header and idle timeouts far beyond the test: the filler connections
	// must stay open until the test closes them.
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_HEADER_TIMEOUT=10m", "RELAY_IDLE_TIMEOUT=10m", quickRaceExit}
	out, errOut, code := edgerelay(t, env, "keys", "channel", "add", "--host", "alpha")
	if code != 0 {
		t.Fatalf("keys channel add: %d %s", code, errOut)
	}
	s := startServerNofile(t, nofile, env...)
	started := time.Now()
	channelAddr := s.addrs["channel"]
	// The caps (10,000 per listener by default) allow far more than 256:
	// serve says so at start (standard error is copied on its own, so
	// wait for it).
	waitUntil(t, func() bool {
		logs := s.stderr.String()
		return strings.Contains(logs, `"msg":"the open-files limit is below what the connection caps allow`) &&
			strings.Contains(logs, `"open_files_limit":256`)
	})

	pair := newHostileChannel(t, s, lastLine(out))
	phone, phoneID := pair.phone(t, nil)
	admin := dialKeepAlive(t, s.addrs["admin"])
	if st, err := admin.get("/healthz"); err != nil || st != 200 {
		t.Fatalf("admin before: %d %v", st, err)
	}

	refused := 0 // connections the test saw closed without an answer
	cycles := soakScale(t)
	var exhaustedAt int
	for cycle := range cycles {
		// Fill: every connection that gets its answer holds one of the
		// server's descriptors (keep-alive); the first one closed without
		// an answer shows that none is left.
		var held []*keepAlive
		for {
			c, err := tryKeepAlive(channelAddr, "/health")
			if err != nil {
				if !errors.Is(err, errRefused) {
					t.Fatalf("cycle %d, connection %d: %v\n%s", cycle, len(held)+1, err, s.exitReport())
				}
				refused++
				break
			}
			held = append(held, c)
			if len(held) > nofile {
				t.Fatalf("cycle %d: %d connections held with an open-files limit of %d", cycle, len(held), nofile)
			}
		}
		exhaustedAt = processFDs(t, s)
		t.Logf("cycle %d: %d connections held; the process has %d descriptors open of %d", cycle, len(held), exhaustedAt, nofile)
		if exhaustedAt < nofile-2 {
			t.Fatalf("refusing with %d of %d descriptors open", exhaustedAt, nofile)
		}

		// Every further attempt is closed promptly: a bounded wait, far
		// below what a client would give a server, and far above what
		// closing at accept takes.
		attempts := 40
		var slowest time.Duration
		for i := range attempts {
			begin := time.Now()
			_, err := tryKeepAlive(channelAddr, "/health")
			if !errors.Is(err, errRefused) {
				t.Fatalf("cycle %d, attempt %d while exhausted: %v, want the connection closed without an answer\n%s", cycle, i, err, s.exitReport())
			}
			refused++
			slowest = max(slowest, time.Since(begin))
		}
		t.Logf("cycle %d: %d attempts refused, slowest in %v", cycle, attempts, slowest)
		if slowest > 3*time.Second {
			t.Fatalf("a refused connection took %v to close", slowest)
		}

		// What was open keeps working, on the exhausted listener too.
		if st, err := held[0].get("/health"); err != nil || st != 200 {
			t.Fatalf("held keep-alive connection: %d %v", st, err)
		}
		if st, err := admin.get("/healthz"); err != nil || st != 200 {
			t.Fatalf("admin keep-alive connection: %d %v", st, err)
		}
		pair.roundTrip(t, phone, phoneID, fmt.Sprintf("cycle %d", cycle))

		// The load drops: new connections are served again.
		for _, c := range held {
			c.close()
		}
		begin := time.Now()
		deadline := begin.Add(10 * time.Second)
		for {
			c, err := tryKeepAlive(channelAddr, "/health")
			if err == nil {
				c.close()
				break
			}
			if !errors.Is(err, errRefused) {
				t.Fatalf("after the load dropped: %v", err)
			}
			refused++
			if time.Now().After(deadline) {
				t.Fatal("still refusing 10 s after the connections closed")
			}
		}
		t.Logf("cycle %d: serving again %v after the connections closed", cycle, time.Since(begin))
	}

	if report := s.exitReport(); report != "" {
		t.Fatal(report)
	}
	if got := hostileMetric(t, s, `edgerelay_listener_refused_total{reason="fds",service="channel"}`); got != float64(refused) {
		t.Fatalf("refusals counted: %v, the clients saw %d", got, refused)
	}
	// One warning when the refusing starts, at most one more per 10 s while
	// it lasts (netlimit's fdWarnEvery), whatever the number of attempts.
	logs := s.stderr.String()
	warnings := strings.Count(logs, "out of file descriptors")
	allowed := 1 + int(time.Since(started)/(10*time.Second))
	if warnings < 1 || warnings > allowed {
		t.Fatalf("%d warnings for %d refused connections in %v, want 1 to %d:\n%s", warnings, refused, time.Since(started), allowed, logs)
	}
	if !strings.Contains(logs, "file descriptors available again") {
		t.Fatalf("the recovery is not logged:\n%s", logs)
	}
	t.Logf("%d refused in all, %d warnings logged", refused, warnings)
	if code := s.signal(syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, logs)
	}
}

// exitReport says, when the relay has exited, so and what it logged; ""
// while it runs.
func (s *relayProc) exitReport() string {
	select {
	case <-s.exited:
		return fmt.Sprintf("serve exited (%v):\n%s", s.cmd.ProcessState, s.stderr.String())
	default:
		return ""
	}
}

// quickRaceExit spares a race-enabled binary its default second of sleep at
// exit, so that exit bounds measure the server.
const quickRaceExit = "GORACE=atexit_sleep_ms=0"

// processFDs counts the descriptors the relay process holds.
func processFDs(t *testing.T, s *relayProc) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/fd")
	if err != nil {
		t.Fatalf("descriptors of the relay: %v", err)
	}
	return len(entries)
}

// errRefused: the server closed the connection without answering.
var errRefused = errors.New("connection closed without an answer")

// keepAlive is one HTTP/1.1 connection kept open between requests, so that
// a test knows which connection a request used.
type keepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func dialKeepAlive(t *testing.T, addr string) *keepAlive {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	k := &keepAlive{c: c, br: bufio.NewReader(c)}
	t.Cleanup(k.close)
	return k
}

// tryKeepAlive opens a connection and asks for path on it: errRefused when
// the server closes it without an answer; the open connection otherwise.
func tryKeepAlive(addr, path string) (*keepAlive, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	k := &keepAlive{c: c, br: bufio.NewReader(c)}
	st, err := k.get(path)
	if err != nil {
		k.close()
		return nil, err
	}
	if st != 200 {
		k.close()
		return nil, fmt.Errorf("GET %s: %d", path, st)
	}
	return k, nil
}

// get sends GET path and reads the answer, bounded by 10 s.
func (k *keepAlive) get(path string) (int, error) {
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: relay\r\n\r\n"); err != nil {
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return 0, errRefused
		}
		return 0, fmt.Errorf("GET %s: %w", path, err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return 0, errRefused
		}
		return 0, fmt.Errorf("GET %s: %w", path, err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("GET %s: body: %w", path, err)
	}
	return resp.StatusCode, nil
}

func (k *keepAlive) close() { _ = k.c.Close() }
