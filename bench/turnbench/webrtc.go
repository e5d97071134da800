package turnbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/turn"
)

// The real-traffic comparison (issue 17): two headless Chromium pages open
// a relay-only WebRTC data channel through the TURN server under test and
// move a fixed number of bytes one way in 16 KiB messages; the figures are
// the server's CPU time per MB moved, the throughput, and the datagrams
// the kernel dropped on the server's sockets. Chromium's SCTP sends in
// bursts paced by its congestion window, retransmits what is lost and
// slows down for it, so a server that drops pays twice: more packets per
// delivered MB, and a slower transfer.
//
// The browser side is webrtc/driver.mjs (playwright-core from sdk/js's
// node_modules) with webrtc/page.html, which builds the RTCPeerConnections
// by hand (iceTransportPolicy "relay", the server under test the only ICE
// server) and exchanges whole SDP through page.evaluate: no signalling
// server is involved. One browser serves every round; each run makes a new
// pair of connections, hence new allocations on the server.

// WebRTCOptions shapes the WebRTC comparison. Zero fields take the
// defaults noted.
type WebRTCOptions struct {
	// Rounds is the rounds, the first a warm-up. Default 5.
	Rounds int
	// Bytes is the bytes moved per run. Default 100 MB (10^8).
	Bytes int
	// Message is the data channel message size. Default 16,384.
	Message int
	// ServerCPU and LoadCPU are the cores of the servers and of the
	// browser (node and every Chromium process). Defaults 0 and 1; a
	// negative LoadCPU leaves the browser unpinned (it may then use the
	// servers' core too: faster, burstier transfers, on a 2-core machine).
	ServerCPU, LoadCPU int
	// Chromium is the browser. Default /usr/bin/chromium.
	Chromium string
	// Node runs the driver. Default "node" on PATH.
	Node string
	// Root is the module's root directory (for the driver and sdk/js);
	// found from the working directory when empty.
	Root string
	// Turnserve, Turnserver and SocketBuffer as in Options.
	Turnserve, Turnserver string
	SocketBuffer          int
	// Progress, when not nil, gets one line per run.
	Progress io.Writer
}

func (o WebRTCOptions) withDefaults() (WebRTCOptions, error) {
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Bytes == 0 {
		o.Bytes = 100_000_000
	}
	if o.Message == 0 {
		o.Message = 16384
	}
	if o.ServerCPU == 0 && o.LoadCPU == 0 {
		o.LoadCPU = 1
	}
	if o.Chromium == "" {
		o.Chromium = "/usr/bin/chromium"
	}
	if o.Node == "" {
		o.Node = "node"
	}
	if o.Turnserver == "" {
		o.Turnserver = "turnserver"
	}
	if o.Rounds < 2 {
		return o, fmt.Errorf("turnbench: WebRTC Rounds %d: need at least 2 (the first is a warm-up)", o.Rounds)
	}
	if o.Root == "" {
		root, err := moduleRoot()
		if err != nil {
			return o, err
		}
		o.Root = root
	}
	return o, nil
}

// ErrNoChromium is Compare's answer when the browser is not installed:
// the comparison is skipped, and the report says so.
var ErrNoChromium = errors.New("turnbench: chromium not found (Debian: apt-get install chromium)")

// WebRTCRun is one transfer through one server.
type WebRTCRun struct {
	Bytes   int           // bytes the receiving page got
	Elapsed time.Duration // from the first send to the last byte's arrival, as Go saw it
	CPU     time.Duration // the server process's CPU time over Elapsed
	Drops   uint64        // datagrams the kernel dropped on the server's UDP sockets over Elapsed
	OpenMs  int           // the data channel's set-up, ICE through the server included
}

// MBPerSec is the throughput in MB (10^6 bytes) per second.
func (r WebRTCRun) MBPerSec() float64 { return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds() }

// CPUPerMB is the server's CPU milliseconds per MB moved.
func (r WebRTCRun) CPUPerMB() float64 {
	return float64(r.CPU) / float64(time.Millisecond) / (float64(r.Bytes) / 1e6)
}

// WebRTCSide is one server over the counted rounds: medians, and the
// drops of all rounds summed.
type WebRTCSide struct {
	Name               string
	Runs               []WebRTCRun
	MBPerSec, CPUPerMB float64
	Drops              uint64
}

// WebRTCReport is the outcome of CompareWebRTC.
type WebRTCReport struct {
	Options      WebRTCOptions
	Ours, Coturn WebRTCSide
	// CPURatio is ours' CPU per MB over coturn's, the median of the
	// per-round ratios (below 1: ours costs less); CPURatioOfMedians the
	// ratio of the medians.
	CPURatio, CPURatioOfMedians float64
	Pinned                      bool
	ChromiumVersion             string
	CoturnVersion               string
	Elapsed                     time.Duration
	Warnings                    []string
}

// CompareWebRTC starts both servers and the browser, then runs one
// transfer per server and round, alternating (ABBA).
func CompareWebRTC(ctx context.Context, o WebRTCOptions) (rep WebRTCReport, err error) {
	start := time.Now()
	if o, err = o.withDefaults(); err != nil {
		return WebRTCReport{}, err
	}
	rep.Options = o
	if _, err := os.Stat(o.Chromium); err != nil {
		return rep, fmt.Errorf("%w: %s", ErrNoChromium, o.Chromium)
	}
	// Debian's /usr/bin/chromium is a shell wrapper that may complain on
	// stderr; the version is the stdout line.
	out, _ := exec.CommandContext(ctx, o.Chromium, "--version").Output()
	rep.ChromiumVersion = firstLine(string(out))
	coturnBin, err := exec.LookPath(o.Turnserver)
	if err != nil {
		return rep, fmt.Errorf("turnbench: coturn's turnserver not found (%w): run .ci/install-coturn.sh", err)
	}
	rep.CoturnVersion = coturnVersion(ctx, coturnBin)
	dir, err := os.MkdirTemp("", "turnbench-webrtc")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	if o.Turnserve == "" {
		o.Turnserve = filepath.Join(dir, "turnserve")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.Turnserve, "edgerelay/bench/turnbench/cmd/turnserve")
		if out, err := build.CombinedOutput(); err != nil {
			return rep, fmt.Errorf("turnbench: building turnserve: %w\n%s", err, out)
		}
	}
	serverCPU, loadCPU := o.ServerCPU, o.LoadCPU
	_, tasksetErr := exec.LookPath("taskset")
	// (A negative loadCPU stays negative below: pinned leaves it alone.)
	rep.Pinned = runtime.NumCPU() >= 2 && tasksetErr == nil
	if !rep.Pinned {
		serverCPU, loadCPU = -1, -1
		rep.Warnings = append(rep.Warnings, "not pinned: needs taskset and 2 cores; servers and browser share the machine")
	}

	const secret, realm = "turnbench-secret", "turnbench"
	ours, err := startOurs(ctx, o.Turnserve, secret, realm, serverCPU, oursOptions{socketBuffer: o.SocketBuffer})
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, ours.stop()) }()
	coturn, err := startCoturn(ctx, coturnBin, secret, realm, dir, serverCPU, nil)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, coturn.stop()) }()
	servers := [2]*server{ours, coturn}

	b, err := startBrowser(ctx, o, loadCPU)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, b.quit()) }()

	runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (WebRTCRun, error) {
		r, err := transfer(b, servers[side], secret, o)
		if err != nil {
			return r, fmt.Errorf("turnbench: WebRTC round %d, %s: %w", round, servers[side].name, err)
		}
		if o.Progress != nil {
			note := ""
			if round == 0 {
				note = " (warm-up)"
			}
			fmt.Fprintf(o.Progress, "webrtc round %d %-6s %6.1f MB/s  %6.2f CPU ms/MB  drops %d  open %d ms%s\n",
				round, servers[side].name, r.MBPerSec(), r.CPUPerMB(), r.Drops, r.OpenMs, note)
		}
		return r, nil
	})
	if err != nil {
		return rep, err
	}
	rep.Ours, rep.Coturn = summarizeWebRTC("ours", runs[0]), summarizeWebRTC("coturn", runs[1])
	rep.CPURatio = abtest.RoundRatio(cpuPerMB(runs[0]), cpuPerMB(runs[1]))
	rep.CPURatioOfMedians = rep.Ours.CPUPerMB / rep.Coturn.CPUPerMB
	rep.Elapsed = time.Since(start)
	return rep, nil
}

func cpuPerMB(runs []WebRTCRun) []float64 { return abtest.Values(runs, WebRTCRun.CPUPerMB) }

func summarizeWebRTC(name string, runs []WebRTCRun) WebRTCSide {
	s := WebRTCSide{Name: name, Runs: runs}
	s.MBPerSec = abtest.Median(abtest.Values(runs, WebRTCRun.MBPerSec))
	s.CPUPerMB = abtest.Median(cpuPerMB(runs))
	for _, r := range runs {
		s.Drops += r.Drops
	}
	return s
}

// transfer opens a data channel through s, moves o.Bytes, and takes the
// server's CPU time and drops over the transfer alone (not the set-up).
func transfer(b *browser, s *server, secret string, o WebRTCOptions) (WebRTCRun, error) {
	var r WebRTCRun
	user, pass := turn.Credentials(secret, "webrtc", time.Hour, time.Now())
	var ready struct {
		Ready  bool              `json:"ready"`
		OpenMs int               `json:"openMs"`
		Pair   []json.RawMessage `json:"pair"`
	}
	err := b.call(map[string]any{"cmd": "open", "urls": []string{"turn:" + s.addr.String() + "?transport=udp"},
		"username": user, "credential": pass}, &ready)
	if err != nil {
		return r, err
	}
	r.OpenMs = ready.OpenMs
	for _, p := range ready.Pair {
		var pair struct{ Local, Remote string }
		if json.Unmarshal(p, &pair) != nil || pair.Local != "relay" || pair.Remote != "relay" {
			_ = b.call(map[string]any{"cmd": "close"}, nil)
			return r, fmt.Errorf("selected candidate pair %s, want relay on both ends", p)
		}
	}
	cpu0, err := s.cpuTime()
	if err != nil {
		return r, err
	}
	drops0, err := s.drops()
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	var done struct {
		Bytes int `json:"bytes"`
	}
	if err := b.call(map[string]any{"cmd": "send", "bytes": o.Bytes, "message": o.Message}, &done); err != nil {
		return r, err
	}
	r.Elapsed = time.Since(t0)
	cpu1, err := s.cpuTime()
	if err != nil {
		return r, err
	}
	drops1, err := s.drops() // before the close: coturn's relay sockets take their counts with them
	if err != nil {
		return r, err
	}
	r.Bytes, r.CPU, r.Drops = done.Bytes, cpu1-cpu0, drops1.DropsSince(drops0)
	if err := b.call(map[string]any{"cmd": "close"}, nil); err != nil {
		return r, err
	}
	if r.Bytes != o.Bytes {
		return r, fmt.Errorf("the receiving page got %d bytes of %d", r.Bytes, o.Bytes)
	}
	// Let the closed allocations' sockets go before the other server's run.
	time.Sleep(200 * time.Millisecond)
	return r, nil
}

// browser is the running driver.mjs.
type browser struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	done chan error
}

func startBrowser(ctx context.Context, o WebRTCOptions, cpu int) (*browser, error) {
	argv := pinned(cpu, o.Node, filepath.Join(o.Root, "bench", "turnbench", "webrtc", "driver.mjs"))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "SDK_JS="+filepath.Join(o.Root, "sdk", "js"), "CHROMIUM="+o.Chromium)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("turnbench: starting the WebRTC driver: %w", err)
	}
	b := &browser{cmd: cmd, in: in, out: bufio.NewScanner(stdout), done: make(chan error, 1)}
	b.out.Buffer(make([]byte, 64<<10), 1<<20)
	var started struct {
		Started bool `json:"started"`
	}
	if err := b.read(&started); err != nil || !started.Started {
		_ = b.quit()
		return nil, fmt.Errorf("turnbench: the WebRTC driver did not start (see its output above): %v", err)
	}
	return b, nil
}

// call sends one command and reads its answer into v (nil: discarded).
func (b *browser) call(cmd map[string]any, v any) error {
	line, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	if _, err := b.in.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("turnbench: WebRTC driver: %w", err)
	}
	if v == nil {
		v = &struct{}{}
	}
	return b.read(v)
}

func (b *browser) read(v any) error {
	if !b.out.Scan() {
		return fmt.Errorf("turnbench: the WebRTC driver exited: %v", b.out.Err())
	}
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b.out.Bytes(), &e) == nil && e.Error != "" {
		return fmt.Errorf("turnbench: WebRTC driver: %s", e.Error)
	}
	if err := json.Unmarshal(b.out.Bytes(), v); err != nil {
		return fmt.Errorf("turnbench: WebRTC driver said %q: %w", b.out.Text(), err)
	}
	return nil
}

// quit asks the driver to close the browser and waits for it (10 s at
// most, then kills it).
func (b *browser) quit() error {
	_, _ = b.in.Write([]byte(`{"cmd":"quit"}` + "\n"))
	_ = b.in.Close()
	go func() { b.done <- b.cmd.Wait() }()
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	return nil
}

// moduleRoot walks up from the working directory to go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("turnbench: no go.mod above the working directory")
		}
		dir = parent
	}
}
