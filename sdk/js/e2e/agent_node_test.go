package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestAgentNode runs test/node/agent.mjs: an AgentClient in Node attaches
// over TLS (NODE_EXTRA_CA_CERTS = the development CA) to an echo runtime's
// instance. The script checks the round trip byte for byte, the relay's
// heartbeat ack, refused attaches; this side answers its steps: "detach"
// (the runtime saw the second client's acp.detach), "restart" (the relay
// is killed and started again on the same ports without the runtime, and
// the client must reattach and get unknown_instance), "runtime" (the
// runtime dials the new relay and the client's requests flow again).
func TestAgentNode(t *testing.T) {
	r := startRelay(t)
	in := pairInstance(t, r, "node-a")
	other := pairInstance(t, r, "node-b")
	echo := runEchoRuntime(t, r, in)
	runEchoRuntime(t, r, other) // online, so that its refusal is about the account

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--experimental-websocket", "--no-warnings", "test/node/agent.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(cleanEnv(),
		"NODE_EXTRA_CA_CERTS="+r.caPath(),
		"AGENT="+r.agentOrigin(),
		"INSTANCE="+in.ID,
		"TOKEN="+in.ClientToken,
		"OTHER_INSTANCE="+other.ID,
	)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var printed strings.Builder
	fail := func(format string, args ...any) {
		t.Helper()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("%s\nnode stdout:\n%s\nnode stderr:\n%s", fmt.Sprintf(format, args...), printed.String(), stderr.String())
	}
	answer := func(step string) {
		if _, err := io.WriteString(stdin, "ok "+step+"\n"); err != nil {
			fail("answer %s: %v", step, err)
		}
	}
	sc := bufio.NewScanner(stdout)
	done := false
	for sc.Scan() {
		line := sc.Text()
		printed.WriteString(line + "\n")
		step, isStep := strings.CutPrefix(line, "STEP ")
		switch {
		case line == "agent ok":
			done = true
		case !isStep:
		case step == "detach":
			waitDetaches(t, echo, 1)
			answer(step)
		case step == "restart":
			r = respawnRelay(t, r)
			answer(step)
		case step == "runtime":
			runEchoRuntime(t, r, in)
			answer(step)
		default:
			fail("unknown step %q", step)
		}
	}
	err = cmd.Wait()
	if err != nil || !done {
		t.Fatalf("node test/node/agent.mjs: %v (finished: %v)\nnode stdout:\n%s\nnode stderr:\n%s", err, done, printed.String(), stderr.String())
	}
	t.Logf("node test/node/agent.mjs:\n%s", printed.String())
}

// respawnRelay kills old and starts the binary again on the same data dir
// and the same ports, so that clients holding its addresses find it again
// (a relay restart as an operator does it), with old's other settings. The ports were free a moment
// ago; another process taking one in between fails the start.
func respawnRelay(t *testing.T, old *relay) *relay {
	t.Helper()
	old.stop()
	env := []string{"RELAY_DATA_DIR=" + old.dataDir}
	for service, name := range map[string]string{
		"mailbox": "RELAY_MAILBOX_LISTEN", "agent": "RELAY_AGENT_LISTEN", "admin": "RELAY_ADMIN_LISTEN",
		"channel": "RELAY_CHANNEL_LISTEN", "turn": "RELAY_TURN_LISTEN",
	} {
		if a := old.addrs[service]; a != "" {
			env = append(env, name+"="+a)
		}
	}
	r := startRelay(t, mergeEnv(old.env, env)...)
	r.dataDir = old.dataDir
	for service, a := range old.addrs {
		if r.addrs[service] != a {
			t.Fatalf("restarted %s on %s, want %s", service, r.addrs[service], a)
		}
	}
	return r
}
