package turnbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pion/stun/v3"
)

// server is one contender's process: ours (turnserve) or coturn's
// turnserver, pinned to the server core.
type server struct {
	name string
	cmd  *exec.Cmd
	addr netip.AddrPort // UDP and TCP
	// tlsAddr is the turns: listener, when the server was started with
	// a certificate.
	tlsAddr netip.AddrPort
	debug   string // ours: the /stats and pprof address
	done    chan error
}

// pinned prefixes argv with taskset when a core is given.
func pinned(cpu int, argv ...string) []string {
	if cpu < 0 {
		return argv
	}
	return append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
}

// oursOptions are how one of our servers is started beside the common
// secret, realm and core.
type oursOptions struct {
	// socketBuffer, when positive, is turnserve's -socket-buffer (else its
	// default).
	socketBuffer int
	// cert, when not nil, adds a turns: listener.
	cert *benchCert
	// noGRO starts it with -no-gro, under the name "ours-nogro".
	noGRO bool
	// name, when set, is its name in place of "ours".
	name string
}

// startOurs runs the turnserve binary and reads its start-up line.
func startOurs(ctx context.Context, bin, secret, realm string, cpu int, oo oursOptions) (*server, error) {
	args := []string{bin, "-listen", "127.0.0.1:0", "-secret", secret, "-realm", realm, "-allow-peers", "127.0.0.0/8"}
	if oo.socketBuffer > 0 {
		args = append(args, "-socket-buffer", strconv.Itoa(oo.socketBuffer))
	}
	cert := oo.cert
	if cert != nil {
		args = append(args, "-tls-listen", "127.0.0.1:0", "-tls-cert", cert.certFile, "-tls-key", cert.keyFile)
	}
	name := "ours"
	if oo.noGRO {
		args = append(args, "-no-gro")
		name = "ours-nogro"
	}
	if oo.name != "" {
		name = oo.name
	}
	argv := pinned(cpu, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("turnbench: starting turnserve: %w", err)
	}
	s := &server{name: name, cmd: cmd, done: make(chan error, 1)}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { s.done <- cmd.Wait() }()
	select {
	case l, ok := <-line:
		if !ok {
			_ = s.stop()
			return nil, errors.New("turnbench: turnserve exited before listening")
		}
		for _, f := range strings.Fields(l) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "udp":
				s.addr, err = netip.ParseAddrPort(v)
			case "tls":
				s.tlsAddr, err = netip.ParseAddrPort(v)
			case "debug":
				s.debug = v
			}
		}
		if err != nil || !s.addr.IsValid() || s.debug == "" || (cert != nil && !s.tlsAddr.IsValid()) {
			_ = s.stop()
			return nil, fmt.Errorf("turnbench: turnserve start-up line %q", l)
		}
	case <-time.After(10 * time.Second):
		_ = s.stop()
		return nil, errors.New("turnbench: turnserve did not start within 10 s")
	}
	return s, nil
}

// startCoturn runs coturn's turnserver with the same REST secret and
// realm, on loopback, with loopback peers allowed (as ours), no DTLS or
// CLI, and no configuration file; TLS only when cert is not nil. Its
// relay threads are coturn's default (one per CPU it sees, all on the
// pinned core).
func startCoturn(ctx context.Context, bin, secret, realm, dir string, cpu int, cert *benchCert) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{bin, "-n",
		"--use-auth-secret", "--static-auth-secret=" + secret, "--realm=" + realm,
		"--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", "--listening-port=" + strconv.Itoa(port),
		"--allow-loopback-peers", "--no-cli", "--no-dtls",
		"--pidfile=" + filepath.Join(dir, "turnserver.pid"),
		"--log-file=" + filepath.Join(dir, "turnserver.log"), "--no-stdout-log", "--simple-log"}
	tlsPort := 0
	if cert == nil {
		args = append(args, "--no-tls")
	} else {
		if tlsPort, err = freePort(); err != nil {
			return nil, err
		}
		// The alternative ports (listening-port + 1, tls port + 1) are
		// coturn's too; nothing here needs them, so they may be taken.
		args = append(args, "--tls-listening-port="+strconv.Itoa(tlsPort), "--cert="+cert.certFile, "--pkey="+cert.keyFile)
	}
	argv := pinned(cpu, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("turnbench: starting turnserver: %w", err)
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	s := &server{name: "coturn", cmd: cmd, addr: netip.AddrPortFrom(loopback, uint16(port)), done: make(chan error, 1)}
	if cert != nil {
		s.tlsAddr = netip.AddrPortFrom(loopback, uint16(tlsPort))
	}
	go func() { s.done <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if stunPing(s.addr) == nil && (cert == nil || tlsListening(s.tlsAddr)) {
			return s, nil
		}
		select {
		case err := <-s.done:
			return nil, fmt.Errorf("turnbench: turnserver exited at start-up: %v (log in %s)", err, dir)
		default:
		}
		if time.Now().After(deadline) {
			_ = s.stop()
			return nil, errors.New("turnbench: turnserver did not answer STUN within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort finds a port free for UDP and TCP on loopback.
func freePort() (int, error) {
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		_ = pc.Close()
		if err == nil {
			_ = ln.Close()
			return port, nil
		}
	}
	return 0, errors.New("turnbench: no free port")
}

// stunPing sends one Binding request and waits for the answer.
func stunPing(addr netip.AddrPort) error {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return err
	}
	defer c.Close()
	m := stun.MustBuild(stun.TransactionID, stun.BindingRequest)
	if _, err := c.Write(m.Raw); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !stun.IsMessage(buf[:n]) {
		return errors.New("not STUN")
	}
	return nil
}

// tlsListening reports whether a TCP connection to addr is accepted.
func tlsListening(addr netip.AddrPort) bool {
	c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// stop ends the process: SIGTERM, then SIGKILL after 3 s.
func (s *server) stop() error {
	if s.cmd.Process == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(3 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	return nil
}

// drops is the kernel's drop count on the process's UDP sockets.
func (s *server) drops() (UDPDrops, error) { return ProcessUDPDrops(s.cmd.Process.Pid) }

// cpuTime is the process's user plus system CPU time so far, from
// /proc/PID/stat (all its threads).
func (s *server) cpuTime() (time.Duration, error) {
	return processCPU(s.cmd.Process.Pid)
}

func processCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("turnbench: CPU time: %w", err)
	}
	// Fields after the command name (which may hold spaces) in parentheses:
	// state is field 3, utime 14, stime 15 (1-based), in clock ticks.
	rest := string(raw[strings.LastIndexByte(string(raw), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, errors.New("turnbench: short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("turnbench: bad /proc stat")
	}
	const clockTick = 100 // USER_HZ: 100 on every Linux architecture Go runs on
	return time.Duration(utime+stime) * time.Second / clockTick, nil
}

// Stats is turnserve's /stats answer.
type Stats struct {
	Mallocs        uint64 `json:"mallocs"`
	NumGC          uint32 `json:"num_gc"`
	Allocations    int    `json:"allocations"`
	RelayedPackets uint64 `json:"relayed_packets"`
	RelayedBytes   uint64 `json:"relayed_bytes"`
}

func (s *server) stats(ctx context.Context) (Stats, error) {
	var st Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.debug+"/stats", nil)
	if err != nil {
		return st, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("turnbench: /stats: %w", err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("turnbench: /stats: %w", err)
	}
	return st, nil
}

// profile fetches a CPU profile of seconds into file.
func (s *server) profile(ctx context.Context, seconds int, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.debug, seconds), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("turnbench: profile: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("turnbench: profile: %s", res.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, res.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
