package mailboxbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/bench/abtest"
)

// WatchOptions shape CompareWatchMemory. Zero fields take the defaults noted.
type WatchOptions struct {
	// Binary is the watchmem server program (see BuildWatchmem). Required.
	Binary string
	// Sockets is how many idle watch sockets each server holds. Default
	// 10,000.
	Sockets int
	// PerDirection is how many of them share one direction of a mailbox:
	// at most 8, the spec's cap. Default 8, so 625 mailboxes hold 10,000
	// sockets over their two directions.
	PerDirection int
	// Rounds is how many servers of each kind are measured, alternately;
	// each is a fresh process, so none is a warm-up. Default 1.
	Rounds int
	// ProfileDir, when set, receives a heap profile of each server with
	// its sockets open (watchmem-<impl>-<round>.pprof), for `go tool pprof`.
	ProfileDir string
	// Progress, when not nil, gets one line per server.
	Progress io.Writer
}

func (o WatchOptions) withDefaults() (WatchOptions, error) {
	if o.Sockets == 0 {
		o.Sockets = 10_000
	}
	if o.PerDirection == 0 {
		o.PerDirection = 8
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	switch {
	case o.Binary == "":
		return o, errors.New("mailboxbench: WatchOptions.Binary is required (see BuildWatchmem)")
	case o.Sockets < 1 || o.Rounds < 1:
		return o, errors.New("mailboxbench: Sockets and Rounds must be positive")
	case o.PerDirection < 1 || o.PerDirection > 8:
		return o, fmt.Errorf("mailboxbench: %d sockets per direction: the spec allows 1 to 8", o.PerDirection)
	}
	return o, nil
}

// WatchSide is one server's memory with its sockets open.
type WatchSide struct {
	// Before and After are the server's own reports, before the sockets
	// were opened (mailboxes claimed) and with all of them open.
	Before, After WatchStats
	// PerSocket is the growth of the resident set divided by the sockets,
	// in bytes; Stack and Heap split it by the runtime's accounts (the
	// rest is the runtime's own metadata and what it has not given back).
	PerSocket, StackPerSocket, HeapPerSocket float64
	// GoroutinesPerSocket is the goroutines each socket keeps.
	GoroutinesPerSocket float64
}

// WatchReport is the outcome of CompareWatchMemory.
type WatchReport struct {
	Options        WatchOptions // defaults filled in
	Ours, Baseline []WatchSide  // one per round
	// OursMedian and BaselineMedian are the medians of PerSocket; Ratio is
	// BaselineMedian / OursMedian (above 1: ours holds a socket in less).
	OursMedian, BaselineMedian, Ratio float64
}

// BuildWatchmem builds cmd/watchmem into dir and returns its path.
// moduleDir is any directory inside the edgerelay module.
func BuildWatchmem(ctx context.Context, moduleDir, dir string) (string, error) {
	bin := filepath.Join(dir, "watchmem")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "edgerelay/bench/mailboxbench/cmd/watchmem")
	cmd.Dir = moduleDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mailboxbench: go build watchmem: %w\n%s", err, out)
	}
	return bin, nil
}

// CompareWatchMemory measures what an idle watch socket costs our relay
// and the baseline. For each, a watchmem server process starts; the
// benchmark claims the mailboxes over HTTP and reads the server's memory,
// opens Sockets watch sockets from this process (raw TCP: an upgrade
// request, the 101, then silence), waits until the server holds them all,
// and reads its memory again. Each socket's share is the difference
// divided by the sockets.
//
// Everything runs on 127.0.0.1 and is bounded: the server exits when this
// side closes its standard input, or by itself after ten minutes.
func CompareWatchMemory(ctx context.Context, o WatchOptions) (WatchReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return WatchReport{}, err
	}
	if err := raiseFileLimit(); err != nil {
		return WatchReport{}, err
	}
	if limit, err := fileLimit(); err != nil || limit < uint64(o.Sockets)+256 {
		return WatchReport{}, fmt.Errorf("mailboxbench: %d sockets need as many open files; the limit is %d (%v)", o.Sockets, limit, err)
	}
	impls := [2]string{"ours", "baseline"}
	runs, err := abtest.Alternate(o.Rounds, 0, func(side, round int) (WatchSide, error) {
		s, err := measureWatch(ctx, impls[side], round, o)
		if err != nil {
			return s, fmt.Errorf("mailboxbench: watch memory, %s, round %d: %w", impls[side], round, err)
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "round %d watch sockets %-8s %d sockets: RSS %.1f → %.1f MiB, %.0f B per socket (stacks %.0f, heap %.0f), %.2f goroutines per socket\n",
				round, impls[side], o.Sockets, mib(s.Before.RSS), mib(s.After.RSS), s.PerSocket, s.StackPerSocket, s.HeapPerSocket, s.GoroutinesPerSocket)
		}
		return s, nil
	})
	if err != nil {
		return WatchReport{}, err
	}
	rep := WatchReport{Options: o, Ours: runs[0], Baseline: runs[1]}
	rep.OursMedian, rep.BaselineMedian = medianPerSocket(runs[0]), medianPerSocket(runs[1])
	rep.Ratio = rep.BaselineMedian / rep.OursMedian
	return rep, nil
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func medianPerSocket(sides []WatchSide) float64 {
	v := make([]float64, len(sides))
	for i, s := range sides {
		v[i] = s.PerSocket
	}
	return abtest.Median(v)
}

// watchServer is a running watchmem process.
type watchServer struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
	addr   string
}

func startWatchServer(ctx context.Context, bin, impl string) (*watchServer, error) {
	s := &watchServer{cmd: exec.CommandContext(ctx, bin, "-impl", impl)}
	s.cmd.Stderr = &s.stderr
	var err error
	if s.in, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s.out = bufio.NewScanner(stdout)
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	if !s.out.Scan() {
		return nil, errors.Join(s.stop(), errors.New("server said nothing"))
	}
	addr, ok := strings.CutPrefix(s.out.Text(), "ready ")
	if !ok {
		return nil, errors.Join(s.stop(), fmt.Errorf("server said %q", s.out.Text()))
	}
	s.addr = addr
	return s, nil
}

// ask sends one command and decodes the JSON answer into v.
func (s *watchServer) ask(cmd string, v any) error {
	if _, err := fmt.Fprintln(s.in, cmd); err != nil {
		return err
	}
	if !s.out.Scan() {
		return fmt.Errorf("no answer to %q: %v; stderr: %s", cmd, s.out.Err(), s.stderr.String())
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(s.out.Bytes(), v)
}

// stop closes the server's standard input, which ends it, and waits.
func (s *watchServer) stop() error {
	_ = s.in.Close()
	if err := s.cmd.Wait(); err != nil {
		return fmt.Errorf("%w; stderr: %s", err, s.stderr.String())
	}
	return nil
}

func measureWatch(ctx context.Context, impl string, round int, o WatchOptions) (side WatchSide, err error) {
	srv, err := startWatchServer(ctx, o.Binary, impl)
	if err != nil {
		return side, err
	}
	var conns []net.Conn
	defer func() {
		// Reset rather than close: no TIME_WAIT is left behind to eat
		// the ephemeral ports of the next round.
		for _, c := range conns {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
		err = errors.Join(err, srv.stop())
	}()

	perMailbox := 2 * o.PerDirection
	mailboxes := (o.Sockets + perMailbox - 1) / perMailbox
	if err := claimAll(srv.addr, mailboxes); err != nil {
		return side, err
	}
	if err := srv.ask("stats", &side.Before); err != nil {
		return side, err
	}
	conns, err = openWatches(ctx, srv.addr, o)
	if err != nil {
		return side, err
	}
	// The server counts a socket once its handler has registered it,
	// a moment after the 101 reached us.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n WatchStats
		if err := srv.ask("count", &n); err != nil {
			return side, err
		}
		if n.Sockets == o.Sockets {
			break
		}
		if time.Now().After(deadline) {
			return side, fmt.Errorf("the server holds %d sockets of %d", n.Sockets, o.Sockets)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := srv.ask("stats", &side.After); err != nil {
		return side, err
	}
	if o.ProfileDir != "" {
		path := filepath.Join(o.ProfileDir, fmt.Sprintf("watchmem-%s-%d.pprof", impl, round))
		if err := srv.ask("profile "+path, nil); err != nil {
			return side, err
		}
	}
	n := float64(o.Sockets)
	side.PerSocket = (float64(side.After.RSS) - float64(side.Before.RSS)) / n
	side.StackPerSocket = (float64(side.After.StackInuse) - float64(side.Before.StackInuse)) / n
	side.HeapPerSocket = (float64(side.After.HeapInuse) - float64(side.Before.HeapInuse)) / n
	side.GoroutinesPerSocket = float64(side.After.Goroutines-side.Before.Goroutines) / n
	return side, nil
}

// claimAll claims mailboxes 0..n-1 over HTTP, many at a time so that
// their synced writes share syncs.
func claimAll(addr string, n int) error {
	client := newClient(addr, 32)
	defer client.CloseIdleConnections()
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var req fasthttp.Request
			var resp fasthttp.Response
			req.SetRequestURI("http://" + addr + mailboxPath(i))
			req.Header.SetMethod(fasthttp.MethodPut)
			req.Header.Set("Authorization", "Bearer "+token)
			if err := client.DoTimeout(&req, &resp, 10*time.Second); err != nil {
				errs[i] = err
			} else if resp.StatusCode() != fasthttp.StatusCreated {
				errs[i] = fmt.Errorf("claim %d: %d %s", i, resp.StatusCode(), resp.Body())
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// openWatches opens o.Sockets watch sockets, PerDirection on each
// direction of mailboxes 0, 1, …, a few dozen handshakes at a time.
func openWatches(ctx context.Context, addr string, o WatchOptions) ([]net.Conn, error) {
	conns := make([]net.Conn, o.Sockets)
	errs := make([]error, o.Sockets)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range o.Sockets {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			dir := [2]string{"p2c", "c2p"}[(i/o.PerDirection)%2]
			mailbox := i / (2 * o.PerDirection)
			conns[i], errs[i] = dialWatch(addr, mailboxPath(mailbox)+"/"+dir+"/watch")
		}()
	}
	wg.Wait()
	var open []net.Conn
	for _, c := range conns {
		if c != nil {
			open = append(open, c)
		}
	}
	return open, errors.Join(errs...)
}

// dialWatch opens one watch socket the way a client does (the bearer in
// Authorization, subprotocol zerobyte.v1) and reads the 101. It never
// reads again: an idle reader of an empty mailbox is sent nothing until
// the first ping, 30 s later.
func dialWatch(addr, path string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13" +
		"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: zerobyte.v1" +
		"\r\nAuthorization: Bearer " + token + "\r\n\r\n"
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	// An empty mailbox's watch is sent nothing after the 101, so the
	// answer is all there is to read.
	var buf [512]byte
	var resp []byte
	for !bytes.Contains(resp, []byte("\r\n\r\n")) {
		if len(resp) >= len(buf) {
			return nil, errors.Join(fmt.Errorf("%s: answer too long: %.200q", path, resp), c.Close())
		}
		n, err := c.Read(buf[len(resp):])
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%s: %w after %q", path, err, resp), c.Close())
		}
		resp = buf[:len(resp)+n]
	}
	if !bytes.HasPrefix(resp, []byte("HTTP/1.1 101 ")) {
		return nil, errors.Join(fmt.Errorf("%s: %.200q", path, resp), c.Close())
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}
