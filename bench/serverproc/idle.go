package serverproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"edgerelay/bench/abtest"
)

// IdleCost is what idle sockets cost a server process: its memory before
// they were opened and with all of them open, and the growth per socket.
type IdleCost struct {
	Sockets       int
	Before, After Mem
	// PerSocket is the growth of the resident set divided by the
	// sockets, in bytes; Stack and Heap split it by the runtime's
	// accounts (the rest is the runtime's own metadata and what it has
	// not given back).
	PerSocket, StackPerSocket, HeapPerSocket float64
	// GoroutinesPerSocket is the goroutines each socket keeps.
	GoroutinesPerSocket float64
}

// MeasureIdle measures what n idle sockets cost the server p: it reads
// p's memory, opens the sockets with open, waits until the server says
// (its "count" command, which answers how many sockets it holds) that it
// holds n more than before, reads the memory again and, when heapProfile
// is set, has the server write a heap profile there. The sockets are
// reset (no TIME_WAIT left to eat the next server's ephemeral ports)
// before it returns.
func MeasureIdle(ctx context.Context, p *Proc, n int, open func(context.Context) ([]net.Conn, error), heapProfile string) (c IdleCost, err error) {
	c.Sockets = n
	base, err := p.Count(ctx)
	if err != nil {
		return c, err
	}
	if c.Before, err = p.Mem(ctx); err != nil {
		return c, err
	}
	conns, err := open(ctx)
	defer func() {
		for _, conn := range conns {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = conn.Close()
		}
	}()
	if err != nil {
		return c, err
	}
	if err := p.WaitCount(ctx, base+n); err != nil {
		return c, err
	}
	if c.After, err = p.Mem(ctx); err != nil {
		return c, err
	}
	if heapProfile != "" {
		if _, err := p.Ask(ctx, "heap-profile "+heapProfile, askTimeout); err != nil {
			return c, err
		}
	}
	f := float64(n)
	c.PerSocket = (float64(c.After.RSS) - float64(c.Before.RSS)) / f
	c.StackPerSocket = (float64(c.After.StackInuse) - float64(c.Before.StackInuse)) / f
	c.HeapPerSocket = (float64(c.After.HeapInuse) - float64(c.Before.HeapInuse)) / f
	c.GoroutinesPerSocket = float64(c.After.Goroutines-c.Before.Goroutines) / f
	return c, nil
}

// Count asks the server how many sockets it holds (its "count" command).
func (p *Proc) Count(ctx context.Context) (int, error) { return p.AskInt(ctx, "count") }

// WaitCount waits (30 s at most) until the server holds n sockets. A
// server counts a socket once its handler has registered it, a moment
// after the 101 reached the client.
func (p *Proc) WaitCount(ctx context.Context, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		held, err := p.Count(ctx)
		if err != nil {
			return err
		}
		if held == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("serverproc: %s holds %d sockets, want %d", p.Name, held, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// OpenAll opens n sockets with dial, a few dozen handshakes at a time,
// and returns those that opened with every error.
func OpenAll(ctx context.Context, n int, dial func(i int) (net.Conn, error)) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	err := ForEach(ctx, n, 32, func(i int) (err error) {
		conns[i], err = dial(i)
		return err
	})
	var open []net.Conn
	for _, c := range conns {
		if c != nil {
			open = append(open, c)
		}
	}
	return open, err
}

// ForEach calls f(0), …, f(n-1), parallel calls at a time, and returns
// their errors joined; once ctx ends it starts no more (and says so).
// Many at a time, sockets open faster, and a store's synced commits share
// their syncs.
func ForEach(ctx context.Context, n, parallel int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(parallel, 1)) // with no room, no call would start
	for i := range n {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// LoopbackSource is socket i's local address when a benchmark's sockets
// come from aliases loopback addresses, 127.0.0.2 onwards, round robin:
// each address has its own ephemeral ports (about 28,000), and a
// listener's per-IP limit counts each apart.
func LoopbackSource(i, aliases int) *net.TCPAddr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%aliases))}
}

// DialUpgrade opens one WebSocket the way a client does, by hand: a GET
// of path on addr with the upgrade headers and the extra header lines
// given ("Name: value"), then the 101. It reads nothing more: an idle
// socket of the servers measured is sent nothing after its 101 until the
// first ping.
func DialUpgrade(addr, path string, header ...string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, UpgradeRequest(addr, path, header...)); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	// Nothing follows the answer, so the answer is all there is to read.
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

// UpgradeRequest is a client's WebSocket upgrade, a GET of path on addr,
// with the extra header lines given ("Name: value"). The key is RFC
// 6455's sample: nothing here checks the answer's accept value.
func UpgradeRequest(addr, path string, header ...string) string {
	var req strings.Builder
	req.WriteString("GET " + path + " HTTP/1.1\r\nHost: " + addr +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13" +
		"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
	for _, h := range header {
		req.WriteString("\r\n" + h)
	}
	req.WriteString("\r\n\r\n")
	return req.String()
}

// IdleComparison is what idle sockets cost ours and the baseline, over
// rounds of fresh server processes.
type IdleComparison struct {
	Ours, Baseline []IdleCost // one per round
	// OursMedian and BaselineMedian are the medians of PerSocket; Ratio is
	// BaselineMedian / OursMedian (above 1: ours holds a socket in less).
	OursMedian, BaselineMedian, Ratio float64
}

// CompareIdle runs measure for ours (side 0) and the baseline (side 1),
// rounds times each, alternately (each round a fresh server, so none is a
// warm-up), and writes one line per server to progress (when not nil),
// what naming the sockets.
func CompareIdle(rounds int, what string, progress io.Writer, measure func(side, round int) (IdleCost, error)) (IdleComparison, error) {
	runs, err := abtest.Named(abtest.Naming{What: what, Sides: Sides, Progress: progress}, rounds, measure,
		func(side, round int, c IdleCost) string {
			return fmt.Sprintf("round %d %s %-8s %d: %s", round, what, Sides[side], c.Sockets, c.Summary())
		})
	if err != nil {
		return IdleComparison{}, err
	}
	c := IdleComparison{Ours: runs[0], Baseline: runs[1]}
	c.OursMedian, c.BaselineMedian = abtest.Medians(runs, func(c IdleCost) float64 { return c.PerSocket })
	c.Ratio = c.BaselineMedian / c.OursMedian
	return c, nil
}

// Summary is the cost in a few words, for a progress line: the resident
// set before and after, and the growth per socket.
func (c IdleCost) Summary() string {
	return fmt.Sprintf("RSS %.1f → %.1f MiB, %.0f B each (stacks %.0f, heap %.0f), %.2f goroutines each",
		float64(c.Before.RSS)/(1<<20), float64(c.After.RSS)/(1<<20), c.PerSocket, c.StackPerSocket, c.HeapPerSocket, c.GoroutinesPerSocket)
}

// Goroutines bounds the goroutines each socket of one side holds: a
// reader and a writer, say, give or take the servers' idle workers.
type Goroutines struct{ Lo, Hi float64 }

// Check says what is implausible about a comparison of one round per side
// with n sockets each, ours holding goroutines within ours and the
// baseline's within baseline: a socket that leaks or lost a goroutine, a
// growth too small or too large to be a measurement. For the benchmarks'
// own tests.
func (c IdleComparison) Check(n int, ours, baseline Goroutines) error {
	var errs []error
	bounds := [2]Goroutines{ours, baseline}
	for side, costs := range [2][]IdleCost{c.Ours, c.Baseline} {
		lo, hi := bounds[side].Lo, bounds[side].Hi
		if len(costs) != 1 {
			errs = append(errs, fmt.Errorf("%s: %d rounds, want 1", Sides[side], len(costs)))
			continue
		}
		s := costs[0]
		if s.Sockets != n || s.GoroutinesPerSocket < lo || s.GoroutinesPerSocket > hi {
			errs = append(errs, fmt.Errorf("%s: %d sockets, %v goroutines each, want %d and %v to %v", Sides[side], s.Sockets, s.GoroutinesPerSocket, n, lo, hi))
		}
		if s.PerSocket < 512 || s.PerSocket > 256<<10 {
			errs = append(errs, fmt.Errorf("%s: %.0f bytes per socket: not a plausible measurement", Sides[side], s.PerSocket))
		}
	}
	if c.Ratio != c.BaselineMedian/c.OursMedian {
		errs = append(errs, fmt.Errorf("ratio %v of %v and %v", c.Ratio, c.BaselineMedian, c.OursMedian))
	}
	return errors.Join(errs...)
}

// CheckProfiles says which of the two sides' heap profiles is missing or
// empty in dir: name(side) is each one's file name. For the benchmarks'
// own tests.
func CheckProfiles(dir string, name func(side string) string) error {
	var errs []error
	for _, side := range Sides {
		if fi, err := os.Stat(filepath.Join(dir, name(side))); err != nil || fi.Size() == 0 {
			errs = append(errs, fmt.Errorf("no heap profile of %s: %v", side, err))
		}
	}
	return errors.Join(errs...)
}
