package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgerelay/fastpath/procenv"
)

// binary is the edgerelay binary built once for the package's tests: the
// black-box tests run it as an operator would.
var binaryPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgerelay-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaryPath = filepath.Join(dir, "edgerelay")
	args := []string{"build", "-o", binaryPath}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// relayProc is one running `edgerelay serve` process.
type relayProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	dataDir string
	env     []string
	addrs   map[string]string // service -> host:port, from its start-up lines
	nofile  int               // when > 0, the process's open-files limit (soft and hard)
	cpu     string            // when set, the one core the process runs on (taskset -c)
	stdout  []string
	mu      sync.Mutex
	stderr  *lockedBuffer
	exited  chan struct{}
}

var listenLine = regexp.MustCompile(`^(\S+):\s+listening on (https?)://(\S+) `)

// startServer runs serve with a fresh data dir (unless RELAY_DATA_DIR is in
// env) and every listener on a free loopback port unless env says otherwise.
func startServer(t *testing.T, env ...string) *relayProc {
	t.Helper()
	return startServerNofile(t, 0, env...)
}

// startServerNofile is startServer with the process's open-files limit set
// to nofile (0: inherited).
func startServerNofile(t *testing.T, nofile int, env ...string) *relayProc {
	t.Helper()
	return startServerWith(t, &relayProc{nofile: nofile}, env...)
}

// startServerWith is startServer for a process shaped by s's nofile and
// cpu.
func startServerWith(t *testing.T, s *relayProc, env ...string) *relayProc {
	t.Helper()
	prepare(t, s, env...)
	s.start()
	return s
}

// prepare gives s its environment (startServer's defaults under env) and
// kills its process when the test ends; it starts nothing.
func prepare(t *testing.T, s *relayProc, env ...string) {
	t.Helper()
	base := []string{
		"RELAY_DATA_DIR=" + t.TempDir(),
		"RELAY_ADMIN_LISTEN=127.0.0.1:0",
		"RELAY_CHANNEL_LISTEN=127.0.0.1:0",
		"RELAY_MAILBOX_LISTEN=127.0.0.1:0",
		"RELAY_PUSH_FCM_LISTEN=127.0.0.1:0",
		"RELAY_PUSH_APNS_LISTEN=127.0.0.1:0",
		"RELAY_AGENT_LISTEN=127.0.0.1:0",
		"RELAY_TURN_LISTEN=",
		"RELAY_DRAIN_TIMEOUT=5s",
	}
	s.t, s.env = t, mergeEnv(base, env)
	for _, kv := range s.env {
		if v, ok := strings.CutPrefix(kv, "RELAY_DATA_DIR="); ok {
			s.dataDir = v
		}
	}
	t.Cleanup(func() { s.kill() })
}

// start launches the process and waits for its start-up lines.
func (s *relayProc) start() {
	s.t.Helper()
	s.awaitStart(s.launch())
}

// launch starts the process; its stdout lines arrive on the channel.
// Cluster nodes are launched together and then awaited, because each waits
// for a quorum of the others before it prints anything.
func (s *relayProc) launch() <-chan string {
	s.t.Helper()
	s.cmd = exec.Command(binaryPath, "serve")
	if s.nofile > 0 {
		// Go raises the soft limit to the hard one at start, so both go
		// down (soft first: it may not exceed the hard one). exec keeps
		// the pid, so signals reach serve itself.
		lim := strconv.Itoa(s.nofile)
		s.cmd = exec.Command("sh", "-c", "ulimit -Sn "+lim+" && ulimit -Hn "+lim+` && exec "$0" serve`, binaryPath)
	}
	if s.cpu != "" {
		// taskset execs serve, which keeps the pid; Go sizes its default
		// GOMAXPROCS by the CPUs it may run on.
		s.cmd = exec.Command("taskset", "-c", s.cpu, binaryPath, "serve")
	}
	s.cmd.Env = append(cleanEnv(), s.env...)
	s.stderr = &lockedBuffer{}
	s.cmd.Stderr = s.stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	return lines
}

// awaitStart reads the start-up lines of a launched process.
func (s *relayProc) awaitStart(lines <-chan string) {
	s.t.Helper()
	s.addrs = map[string]string{}
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				s.t.Fatalf("serve exited during start-up:\n%s\n%s", strings.Join(s.stdout, "\n"), s.stderr.String())
			}
			s.mu.Lock()
			s.stdout = append(s.stdout, line)
			s.mu.Unlock()
			if m := listenLine.FindStringSubmatch(line); m != nil {
				s.addrs[m[1]] = m[3]
			}
			// The last start-up line is TURN's (services print in order).
			if strings.HasPrefix(line, "turn:") {
				go func() {
					for range lines {
					}
				}()
				return
			}
		case <-deadline:
			s.t.Fatalf("serve did not start:\n%s", s.stderr.String())
		}
	}
}

func (s *relayProc) origin(service string) string { return "http://" + s.addrs[service] }

// signal sends sig and waits (bounded) for the exit; it returns the exit code.
func (s *relayProc) signal(sig syscall.Signal, within time.Duration) int {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(within):
		s.t.Fatalf("no exit within %v after %v", within, sig)
	}
	return s.cmd.ProcessState.ExitCode()
}

func (s *relayProc) kill() {
	if s.exited == nil {
		return
	}
	// Not cmd.ProcessState: the goroutine in Wait sets it, unsynchronized,
	// when the process exits by itself (a refused start-up), and the race
	// detector reports it. Kill of a process already gone does nothing.
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// restart stops the process with SIGKILL (no clean shutdown) and starts it
// again on the same data dir and, when fixed, the same ports.
func (s *relayProc) restartHard() {
	s.t.Helper()
	s.kill()
	s.start()
}

// edgerelay runs a command of the binary with env and returns its output.
func edgerelay(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binaryPath, args...)
	cmd.Env = append(cleanEnv(), env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// cliOK runs the binary and fails the test unless it exits 0.
func cliOK(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, errOut, code := edgerelay(t, env, args...)
	if code != 0 {
		t.Fatalf("edgerelay %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	body, _, code := getFile(t, url)
	return code, body
}

// getFile is get with the answer's Content-Type.
func getFile(t *testing.T, url string) (body, contentType string, code int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.Header.Get("Content-Type"), resp.StatusCode
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
