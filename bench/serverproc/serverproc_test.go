package serverproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestMain makes the test binary a server process when asked to: the
// tests start it as a child, as the benchmarks start their servers.
func TestMain(m *testing.M) {
	if os.Getenv("SERVERPROC_CHILD") == "1" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child serves WebSocket upgrades that it then holds idle, counting them,
// and a "burn" command that allocates.
func child() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var held atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
		held.Add(1)
		buf := make([]byte, 64<<10) // what each socket costs, to be measured
		_, _ = c.Read(buf)
		held.Add(-1)
		_ = c.Close()
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	var sink [][]byte
	return Serve(ServeOptions{Ready: ln.Addr().String(), MaxLife: time.Minute, Commands: Commands{
		"count": func(string) (string, error) { return strconv.FormatInt(held.Load(), 10), nil },
		"burn": func(arg string) (string, error) {
			n, err := strconv.Atoi(arg)
			for range n {
				sink = append(sink, make([]byte, 1024))
			}
			return "burnt", err
		},
	}}, os.Stdin, os.Stdout)
}

func startChild(t *testing.T) *Proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	env := append(os.Environ(), "SERVERPROC_CHILD=1")
	p, err := Start(ctx, "child", -1, env, os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func TestCommands(t *testing.T) {
	p := startChild(t)
	ctx := context.Background()
	if _, _, err := net.SplitHostPort(p.Ready); err != nil {
		t.Fatalf("ready %q: %v", p.Ready, err)
	}
	if ans, err := p.Ask(ctx, "burn 3", time.Second*10); err != nil || ans != "burnt" {
		t.Fatalf("burn: %q %v", ans, err)
	}
	u, err := p.Measure(ctx, func() error {
		_, err := p.Ask(ctx, "burn 1000", 10*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A thousand slices and the answers' own few allocations.
	if u.Mallocs < 1000 || u.Mallocs > 1200 || u.CPU < 0 {
		t.Errorf("usage over 1,000 allocations: %+v", u)
	}
}

// A command the server does not know ends it, with the reason.
func TestUnknownCommand(t *testing.T) {
	env := append(os.Environ(), "SERVERPROC_CHILD=1")
	p, err := Start(context.Background(), "child", -1, env, os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Ask(context.Background(), "nonsense", 10*time.Second); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("an unknown command: %v", err)
	}
	if err := p.Stop(); err == nil {
		t.Error("the server's failure is not reported")
	}
}

func TestMeasureIdle(t *testing.T) {
	p := startChild(t)
	const n = 50
	c, err := MeasureIdle(context.Background(), p, n, func(ctx context.Context) ([]net.Conn, error) {
		return OpenAll(ctx, n, func(int) (net.Conn, error) { return DialUpgrade(p.Ready, "/", "Authorization: Bearer x") })
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	// Each socket holds a goroutine and a 64 KiB buffer on its stack or
	// heap.
	if c.Sockets != n || c.GoroutinesPerSocket < 0.9 || c.GoroutinesPerSocket > 1.5 || c.StackPerSocket+c.HeapPerSocket < 60<<10 {
		t.Errorf("%+v", c)
	}
}

func TestStartReportsAFailedServer(t *testing.T) {
	_, err := Start(context.Background(), "false", -1, nil, "false")
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("a server that exits at once: %v", err)
	}
}

// EnsureFiles passes at the limit and fails one socket past it.
func TestEnsureFiles(t *testing.T) {
	limit, err := RaiseFileLimit()
	if err != nil {
		t.Fatal(err)
	}
	if limit > 1<<40 {
		t.Skipf("open files unlimited (%d): no edge to test", limit)
	}
	const headroom = 256
	at := int(limit) - headroom
	if err := EnsureFiles(at, headroom); err != nil {
		t.Errorf("%d sockets and %d besides under a limit of %d: %v", at, headroom, limit, err)
	}
	if err := EnsureFiles(at+1, headroom); err == nil || !strings.Contains(err.Error(), "need as many open files") {
		t.Errorf("one socket past the limit of %d: %v", limit, err)
	}
}

func TestForEach(t *testing.T) {
	const n, parallel = 200, 3
	var inFlight, most, calls atomic.Int64
	boom := errors.New("boom")
	err := ForEach(context.Background(), n, parallel, func(i int) error {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		calls.Add(1)
		if i == 7 || i == n-1 {
			return fmt.Errorf("call %d: %w", i, boom)
		}
		return nil
	})
	if calls.Load() != n || most.Load() > parallel {
		t.Errorf("%d calls, %d at once at most, want %d and at most %d", calls.Load(), most.Load(), n, parallel)
	}
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "call 7") || !strings.Contains(err.Error(), fmt.Sprintf("call %d", n-1)) {
		t.Errorf("errors %v, want both failures", err)
	}
}

// Once the context has ended, ForEach starts nothing more.
func TestForEachStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	err := ForEach(ctx, 10, 2, func(int) error { called = true; return nil })
	if called || !errors.Is(err, context.Canceled) {
		t.Errorf("called %v, error %v after the context ended", called, err)
	}
}

func TestLoopbackSource(t *testing.T) {
	for _, c := range []struct {
		i, aliases int
		want       string
	}{{0, 64, "127.0.0.2"}, {63, 64, "127.0.0.65"}, {64, 64, "127.0.0.2"}, {5, 1, "127.0.0.2"}} {
		if got := LoopbackSource(c.i, c.aliases).IP.String(); got != c.want {
			t.Errorf("socket %d of %d aliases from %s, want %s", c.i, c.aliases, got, c.want)
		}
	}
}

// An answer that is not what AskInt or AskJSON decodes is an error that
// names the command and the answer.
func TestAskDecodes(t *testing.T) {
	p := startChild(t)
	ctx := context.Background()
	if n, err := p.AskInt(ctx, "count"); n != 0 || err != nil {
		t.Errorf("count: %d %v", n, err)
	}
	var m Mem
	if err := p.AskJSON(ctx, "mem", &m); err != nil || m.RSS == 0 {
		t.Errorf("mem: %+v %v", m, err)
	}
	if _, err := p.AskInt(ctx, "burn 1"); err == nil || !strings.Contains(err.Error(), `burn 1 answered "burnt"`) {
		t.Errorf("a word for a number: %v", err)
	}
	if err := p.AskJSON(ctx, "burn 1", &m); err == nil || !strings.Contains(err.Error(), `burn 1 answered "burnt"`) {
		t.Errorf("a word for JSON: %v", err)
	}
}
