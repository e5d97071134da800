// Package e2e runs the JavaScript SDK against the real edgerelay binary:
// the SDK's Node integration tests (test/node/) and its browser tests
// (test/browser/, headless Chromium through playwright-core), each against
// a relay this package starts on loopback. The Go side of each test is
// the part no JavaScript client can play: the relay's operator (key
// commands), an agent runtime on the instance link, a Go SDK device that
// seals what JavaScript opens and back.
package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/fastpath/procenv"
)

// binaryPath is the edgerelay binary built once for the package's tests.
var binaryPath string

// sdkDir is sdk/js, the SDK's package directory (this package's parent).
var sdkDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sdkDir = filepath.Dir(wd)
	dir, err := os.MkdirTemp("", "edgerelay-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binaryPath = filepath.Join(dir, "edgerelay")
	// Without -race: these tests are about the SDK's contracts with the
	// relay; the relay's own races are the business of cmd/edgerelay's
	// tests, whose binary is built with -race.
	build := exec.Command("go", "build", "-o", binaryPath, "edgerelay/cmd/edgerelay")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build edgerelay:", err)
		return 1
	}
	if err := buildSDK(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// buildSDK compiles the TypeScript into dist/, so that the tests run what
// the sources say now. The packages come from `npm ci` (make js, .ci/run),
// never from here: a test does not reach the network.
func buildSDK() error {
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "typescript")); err != nil {
		return fmt.Errorf("sdk/js has no node_modules: run `make js` (npm ci in sdk/js) first: %w", err)
	}
	cmd := exec.Command("npm", "run", "--silent", "build")
	cmd.Dir = sdkDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the SDK (npm run build in sdk/js): %w\n%s", err, out)
	}
	return nil
}

// relay is one running `edgerelay serve`.
type relay struct {
	t       *testing.T
	cmd     *exec.Cmd
	dataDir string
	env     []string
	// addrs is service -> host:port, read off the start-up lines
	// (mailbox, channel, agent, admin, turn).
	addrs  map[string]string
	stderr *lockedBuffer
	exited chan struct{}
}

var (
	listenLine = regexp.MustCompile(`^(\S+):\s+listening on (?:https?://|udp\+tcp )(\S+?),? `)
)

// startRelay runs serve with a fresh data dir and every listener on a free
// loopback port, TURN included (secret "e2e-turn-secret", loopback peers
// allowed so that two local browsers can relay to each other); env
// overrides or adds settings.
func startRelay(t *testing.T, env ...string) *relay {
	t.Helper()
	r := &relay{t: t, dataDir: t.TempDir(), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	r.env = mergeEnv([]string{
		"RELAY_DATA_DIR=" + r.dataDir,
		"RELAY_ADMIN_LISTEN=127.0.0.1:0",
		"RELAY_CHANNEL_LISTEN=127.0.0.1:0",
		"RELAY_MAILBOX_LISTEN=127.0.0.1:0",
		"RELAY_PUSH_FCM_LISTEN=",
		"RELAY_PUSH_APNS_LISTEN=",
		"RELAY_AGENT_LISTEN=127.0.0.1:0",
		"RELAY_TURN_LISTEN=127.0.0.1:0",
		"RELAY_TURN_SECRET=e2e-turn-secret",
		"RELAY_TURN_ALLOW_PEERS=127.0.0.0/8",
		"RELAY_APPS=demo:signal,ice",
		"RELAY_DRAIN_TIMEOUT=2s",
	}, env)
	r.cmd = exec.Command(binaryPath, "serve")
	r.cmd.Env = append(cleanEnv(), r.env...)
	r.cmd.Stderr = r.stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(r.stop)
	r.addrs = map[string]string{}
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("serve exited during start-up:\n%s", r.stderr.String())
			}
			if m := listenLine.FindStringSubmatch(line); m != nil {
				r.addrs[m[1]] = m[2]
			}
			// TURN prints last (services print in order).
			if strings.HasPrefix(line, "turn:") {
				go func() {
					for range lines {
					}
				}()
				return r
			}
		case <-deadline:
			t.Fatalf("serve did not start:\n%s", r.stderr.String())
		}
	}
}

// stop ends the process (SIGKILL: these tests keep no state across it).
func (r *relay) stop() {
	select {
	case <-r.exited:
	default:
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// mailboxOrigin is the mailbox listener's origin, http://127.0.0.1:port.
func (r *relay) mailboxOrigin() string { return "http://" + r.addrs["mailbox"] }

// agentOrigin is the agent listener's origin (TLS with the development
// certificate; its CA is caPath).
func (r *relay) agentOrigin() string { return "https://" + r.addrs["agent"] }

// caPath is the development CA that signed the agent listener's
// certificate.
func (r *relay) caPath() string { return filepath.Join(r.dataDir, "tls", "ca.pem") }

// cli runs a command of the binary against this relay (through its admin
// listener) and returns the last line of its output, where key commands
// print the key.
func (r *relay) cli(args ...string) string {
	r.t.Helper()
	cmd := exec.Command(binaryPath, append(args, "--data-dir", r.dataDir, "--admin-listen", r.addrs["admin"])...)
	cmd.Env = append(cleanEnv(), r.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("edgerelay %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return lines[len(lines)-1]
}

// runNode runs a Node.js program of the SDK's tests (path relative to
// sdk/js) with the environment env added and fails the test, with all the
// program printed, unless it exits 0. Node 20 needs a flag for its
// WebSocket.
func runNode(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("node", append([]string{"--experimental-websocket", "--no-warnings"}, args...)...)
	cmd.Dir = sdkDir
	cmd.Env = append(cleanEnv(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// mergeEnv and cleanEnv are the suite's names for procenv's two rules.
func mergeEnv(base, over []string) []string { return procenv.Merge(base, over) }
func cleanEnv() []string                    { return procenv.Clean() }
