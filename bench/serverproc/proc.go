package serverproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"edgerelay/bench/proccpu"
)

// Build builds the command pkg (an import path inside the edgerelay
// module) into dir and returns the program's path. moduleDir is any
// directory inside the module ("" for the working directory).
func Build(ctx context.Context, moduleDir, dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = moduleDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("serverproc: go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// Proc is one running server process.
type Proc struct {
	// Name says which server it is, in errors.
	Name string
	// Ready is what the server wrote after "ready " on its first line.
	Ready string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	done   chan struct{}
	err    error // cmd.Wait's, once done is closed
	stderr *lockedBuffer
}

// ReadyTimeout bounds a server's start-up, seeding included (6,400 synced
// envelopes on a slow disk).
const ReadyTimeout = 5 * time.Minute

// Start runs argv pinned to core cpu (unless cpu is negative; see
// proccpu.Command) with env (nil: this process's environment) and waits
// for its "ready" line.
func Start(ctx context.Context, name string, cpu int, env []string, argv ...string) (*Proc, error) {
	p := &Proc{Name: name, cmd: proccpu.Command(ctx, cpu, argv...), lines: make(chan string, 1),
		done: make(chan struct{}), stderr: &lockedBuffer{}}
	p.cmd.Stderr = p.stderr
	p.cmd.Env = env
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("serverproc: %s: %w", name, err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("serverproc: %s: %w", name, err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("serverproc: starting %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	line, err := p.read(ctx, ReadyTimeout)
	if err != nil {
		return nil, errors.Join(err, p.Stop())
	}
	ready, ok := strings.CutPrefix(line, "ready")
	if !ok {
		return nil, errors.Join(fmt.Errorf("serverproc: %s said %q, want ready", name, line), p.Stop())
	}
	p.Ready = strings.TrimSpace(ready)
	return p, nil
}

// Pid is the server's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// read waits for the process's next line.
func (p *Proc) read(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			return "", fmt.Errorf("serverproc: %s exited (%v): %s", p.Name, p.err, bytes.TrimSpace(p.stderr.Bytes()))
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("serverproc: %s: no answer within %v", p.Name, timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Ask sends one command and returns its answer's text (what followed
// "ok"); an answer that is not "ok" is an error.
func (p *Proc) Ask(ctx context.Context, cmd string, timeout time.Duration) (string, error) {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return "", fmt.Errorf("serverproc: %s: %w", p.Name, err)
	}
	ans, err := p.read(ctx, timeout)
	if err != nil {
		return "", err
	}
	text, ok := strings.CutPrefix(ans, "ok")
	if !ok || (text != "" && text[0] != ' ') {
		return "", fmt.Errorf("serverproc: %s answered %q to %q", p.Name, ans, cmd)
	}
	return strings.TrimSpace(text), nil
}

// askTimeout bounds the built-in commands: a collection of a large heap
// on a loaded core is the slowest of them.
const askTimeout = 30 * time.Second

// Usage is what a server process has used so far, or over a window.
type Usage struct {
	CPU     time.Duration // user plus system time
	Mallocs uint64        // heap objects allocated
}

// Usage asks the process what it has used so far.
func (p *Proc) Usage(ctx context.Context) (Usage, error) {
	ans, err := p.Ask(ctx, "usage", askTimeout)
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	var ns int64
	if _, err := fmt.Sscanf(ans, "%d %d", &u.Mallocs, &ns); err != nil {
		return Usage{}, fmt.Errorf("serverproc: %s: usage answered %q: %w", p.Name, ans, err)
	}
	u.CPU = time.Duration(ns)
	return u, nil
}

// Measure runs work with the process's usage read on either side of it,
// after a collection, so that one run's garbage is not collected on the
// next run's time, and returns what the process used meanwhile.
func (p *Proc) Measure(ctx context.Context, work func() error) (Usage, error) {
	if _, err := p.Ask(ctx, "gc", askTimeout); err != nil {
		return Usage{}, err
	}
	u0, err := p.Usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	if err := work(); err != nil {
		return Usage{}, err
	}
	u1, err := p.Usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	return Usage{CPU: u1.CPU - u0.CPU, Mallocs: u1.Mallocs - u0.Mallocs}, nil
}

// Mem asks the process for its memory (see ReadMem).
func (p *Proc) Mem(ctx context.Context) (Mem, error) {
	var m Mem
	err := p.AskJSON(ctx, "mem", &m)
	return m, err
}

// AskInt sends a command (one without an argument, of the built-in
// commands' bound) whose answer is a number, and returns the number.
func (p *Proc) AskInt(ctx context.Context, cmd string) (int, error) {
	ans, err := p.Ask(ctx, cmd, askTimeout)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(ans)
	if err != nil {
		return 0, fmt.Errorf("serverproc: %s: %s answered %q: %w", p.Name, cmd, ans, err)
	}
	return n, nil
}

// AskJSON sends a command like AskInt's whose answer is JSON, and decodes
// it into v.
func (p *Proc) AskJSON(ctx context.Context, cmd string, v any) error {
	ans, err := p.Ask(ctx, cmd, askTimeout)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(ans), v); err != nil {
		return fmt.Errorf("serverproc: %s: %s answered %q: %w", p.Name, cmd, ans, err)
	}
	return nil
}

// Stop ends the process: its standard input closed, which stops it (a
// relay drains its connections, a store closes), then a kill after 15 s.
func (p *Proc) Stop() error {
	_ = p.stdin.Close()
	kill := time.NewTimer(15 * time.Second)
	defer kill.Stop()
	lines := p.lines
	for killed := false; ; {
		select {
		case _, ok := <-lines: // unread lines, so that the reader reaches Wait
			if !ok {
				lines = nil
			}
			continue
		case <-p.done:
		case <-kill.C:
			if !killed {
				_ = p.cmd.Process.Kill()
				killed = true
			}
			continue
		}
		if killed {
			return fmt.Errorf("serverproc: %s did not exit within 15 s: killed", p.Name)
		}
		break
	}
	if p.err != nil {
		return fmt.Errorf("serverproc: %s: %w: %s", p.Name, p.err, bytes.TrimSpace(p.stderr.Bytes()))
	}
	return nil
}

// lockedBuffer is a child's standard error, kept (its first 64 KiB) for
// error messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.b.Bytes())
}

// Pinning is where a comparison's servers and load generator run.
type Pinning struct {
	// ServerCPU is the core to pass to Start: -1 when not pinned.
	ServerCPU int
	// Pinned says the servers and the load generator run on separate
	// cores; Warning says why not when they do not.
	Pinned  bool
	Warning string
	restore func()
}

// Pin pins this process (the load generator) to loadCPU with GOMAXPROCS
// 1 (proccpu.PinSelf) and hands back serverCPU for the servers, or, on a
// machine that cannot pin (one core, no taskset), leaves everything where
// it is and says so. Release puts the affinity back. Run nothing else in
// the process meanwhile.
func Pin(serverCPU, loadCPU int) (*Pinning, error) {
	if serverCPU == loadCPU || serverCPU < 0 || loadCPU < 0 {
		return nil, fmt.Errorf("serverproc: server core %d and load core %d: want two distinct cores", serverCPU, loadCPU)
	}
	if err := proccpu.CanPin(); err != nil {
		return &Pinning{ServerCPU: -1, Warning: "not pinned (" + err.Error() + "): servers and load generator share the machine"}, nil
	}
	restore, err := proccpu.PinSelf(loadCPU)
	if err != nil {
		return nil, err
	}
	return &Pinning{ServerCPU: serverCPU, Pinned: true, restore: restore}, nil
}

// Release undoes Pin.
func (p *Pinning) Release() {
	if p.restore != nil {
		p.restore()
		p.restore = nil
	}
}

// Warnings is Warning as a report's list: empty when pinned.
func (p *Pinning) Warnings() []string {
	if p.Warning == "" {
		return nil
	}
	return []string{p.Warning}
}

// Where says where the servers and the load generator ran, for a report.
func (p *Pinning) Where(loadCPU int) string {
	if !p.Pinned {
		return "server a process of its own, NOT pinned: " + p.Warning
	}
	return fmt.Sprintf("server a process of its own pinned to core %d, load generator pinned to core %d", p.ServerCPU, loadCPU)
}

// Names of the two sides of every comparison, in abtest's order.
var Sides = [2]string{"ours", "baseline"}

// Pair is a comparison's two servers, ours then the baseline.
type Pair [2]*Proc

// StartPair starts ours, then the baseline, with start (given each one's
// name); when the second fails, the first is stopped.
func StartPair(start func(name string) (*Proc, error)) (Pair, error) {
	var p Pair
	for side, name := range Sides {
		var err error
		if p[side], err = start(name); err != nil {
			return Pair{}, errors.Join(err, p.Stop())
		}
	}
	return p, nil
}

// Stop stops both servers (those that were started).
func (p Pair) Stop() error {
	var err error
	for _, s := range p {
		if s != nil {
			err = errors.Join(err, s.Stop())
		}
	}
	return err
}
