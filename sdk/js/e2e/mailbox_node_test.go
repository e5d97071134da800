package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestMailboxNode runs test/node/mailbox.mjs, the JS SDK's Mailbox
// against the real relay: claims, sealed envelopes both ways, batch
// paging, HEAD, watch, 200 same and 409 conflict, prune, 413 at the limit
// and one past, 507, 429 with Retry-After, erase closing watches with
// 1000. When the program prints "restart", this test drains the relay
// (SIGTERM: watch sockets close with 1001), starts it again on the same
// mailbox port and data dir, and answers "restarted": the program's watch
// must resume with nothing lost or doubled.
func TestMailboxNode(t *testing.T) {
	const maxEnvelope, maxStored = 1024, 16
	env := []string{
		"RELAY_MAILBOX_LISTEN=127.0.0.1:" + strconv.Itoa(mbxFreePort(t)),
		"RELAY_DATA_DIR=" + t.TempDir(), // kept across the restart
		"RELAY_MAX_ENVELOPE=" + strconv.Itoa(maxEnvelope),
		"RELAY_MAX_STORED=" + strconv.Itoa(maxStored),
	}
	r := startRelay(t, env...)
	origin := r.mailboxOrigin()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--experimental-websocket", "--no-warnings", "test/node/mailbox.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(cleanEnv(),
		"RELAY_ORIGIN="+origin,
		"RELAY_MAX_ENVELOPE="+strconv.Itoa(maxEnvelope),
		"RELAY_MAX_STORED="+strconv.Itoa(maxStored),
	)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	output := &lockedBuffer{}
	cmd.Stderr = output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	restarts, sawOK := 0, false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(output, line)
		switch line {
		case "restart":
			restarts++
			r = mbxRestart(t, r, env...)
			if got := r.mailboxOrigin(); got != origin {
				t.Fatalf("restarted relay's mailbox origin %s, want %s", got, origin)
			}
			if _, err := io.WriteString(stdin, "restarted\n"); err != nil {
				t.Fatalf("tell node: %v\n%s", err, output.String())
			}
		case "ok":
			sawOK = true
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node test/node/mailbox.mjs: %v\n%s", err, output.String())
	}
	if !sawOK || restarts != 1 {
		t.Fatalf("node ended without its ok line or with %d restarts (want 1):\n%s", restarts, output.String())
	}
	t.Logf("node:\n%s", output.String())
}

// mbxRestart drains r with SIGTERM, waits for it to exit 0, and starts the
// relay again with the same env (fixed mailbox port and data dir).
func mbxRestart(t *testing.T, r *relay, env ...string) *relay {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-r.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("relay did not exit within 15 s of SIGTERM:\n%s", r.stderr.String())
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("relay exited with %d after SIGTERM:\n%s", code, r.stderr.String())
	}
	return startRelay(t, env...)
}

// mbxFreePort is a loopback TCP port that was free a moment ago (the
// restart needs the mailbox listener on a port known in advance).
func mbxFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
