//go:build linux

package netlimit

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestOutOfFDsRefusesPromptlyAndRecovers runs the listener with every
// descriptor of the process taken: each connection must be closed at once
// and counted (not left in the backlog, not returned as an error that stops
// the server), Accept must not spin, the log must get one warning however
// many are refused, and once descriptors are free again connections are
// served.
func TestOutOfFDsRefusesPromptlyAndRecovers(t *testing.T) {
	logs := &syncBuffer{}
	var calls atomic.Int64
	h := start(t, Limits{}, func(l *Listener) {
		l.inner = &countingListener{TCPListener: l.inner.(*net.TCPListener), calls: &calls}
		l.SetLog(slog.New(slog.NewJSONHandler(logs, nil)))
	})
	if !h.l.fds.holding() {
		t.Fatal("no spare descriptor held")
	}
	fill := exhaustFDs(t)

	const attempts = 20
	for i := range attempts {
		// One descriptor for the client's socket; the server then has none
		// for its side of the connection.
		fill.free(1)
		begin := time.Now()
		client := h.dial("127.0.0.1")
		h.expectRefused(client)
		// The shedding closes it at once; a server that left it in the
		// backlog or retried with a sleep would take a second or more.
		if took := time.Since(begin); took > time.Second {
			t.Fatalf("attempt %d: refused after %v", i, took)
		}
		client.Close()
		fill.take(1)
	}
	if got := h.counts.snapshot()[ReasonFDs]; got != attempts {
		t.Fatalf("refusals counted as %q: %d, want %d", ReasonFDs, got, attempts)
	}
	// One accept that failed for each refused connection (plus the first):
	// between connections Accept waits on the socket instead of retrying.
	if n := calls.Load(); n > attempts+2 {
		t.Fatalf("inner Accept called %d times for %d refused connections: the listener spins", n, attempts)
	}
	if n := strings.Count(logs.String(), `"level":"WARN"`); n != 1 {
		t.Fatalf("%d warnings for %d refused connections, want 1:\n%s", n, attempts, logs.String())
	}

	fill.free(len(fill.fds))
	h.expectAccepted(h.dial("127.0.0.1"))
	if !strings.Contains(logs.String(), "file descriptors available again") {
		t.Fatalf("recovery not logged:\n%s", logs.String())
	}
	if !h.l.fds.holding() {
		t.Fatal("spare descriptor not taken back")
	}
}

// TestOutOfFDsWithoutSheddingBacksOff: when connections cannot be shed
// (here: the listener has no raw socket to shed through), Accept retries with
// a growing pause instead of spinning or giving up, and serves the
// connection once a descriptor is free.
func TestOutOfFDsWithoutSheddingBacksOff(t *testing.T) {
	var calls atomic.Int64
	h := start(t, Limits{}, func(l *Listener) {
		l.inner = &countingListener{TCPListener: l.inner.(*net.TCPListener), calls: &calls}
		l.raw = nil
	})
	fill := exhaustFDs(t)
	fill.free(1)
	begin := time.Now()
	client := h.dial("127.0.0.1")
	const retries = 5
	deadline := time.Now().Add(wait)
	for calls.Load() < retries {
		if time.Now().After(deadline) {
			t.Fatalf("Accept stopped retrying after %d calls", calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	// Pauses of 5, 10, 20 and 40 ms come between the first five calls.
	if took := time.Since(begin); took < 75*time.Millisecond {
		t.Fatalf("%d accept attempts within %v: no back-off", retries, took)
	}
	fill.free(len(fill.fds))
	h.expectAccepted(client)
	if got := h.counts.snapshot()[ReasonFDs]; got != 0 {
		t.Fatalf("%d connections refused, want the waiting one served", got)
	}
}

// TestCloseWhileOutOfFDs: closing the listener ends an Accept that is
// waiting out the exhaustion, and gives the spare descriptor back.
func TestCloseWhileOutOfFDs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, Limits{}, nil)
	fill := exhaustFDs(t)
	fill.free(1)
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	returned := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if c != nil {
			c.Close()
		}
		returned <- err
	}()
	// The refusal shows that Accept is inside the exhaustion handling.
	_ = client.SetReadDeadline(time.Now().Add(wait))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("client: %v, want EOF", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-returned:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(wait):
		t.Fatal("Accept still waiting after Close")
	}
	if l.fds.holding() {
		t.Fatal("spare descriptor kept after Close")
	}
}

// fdFiller holds descriptors so that the process has none left.
type fdFiller struct {
	t   *testing.T
	fds []int
}

// exhaustFDs lowers this process's soft open-files limit to a little above
// what it uses (so that filling it is quick; restored at cleanup) and opens
// /dev/null until no descriptor is left.
func exhaustFDs(t *testing.T) *fdFiller {
	t.Helper()
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	lowered := orig
	lowered.Cur = min(orig.Cur, uint64(len(entries)+64))
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	f := &fdFiller{t: t}
	t.Cleanup(func() {
		f.free(len(f.fds))
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			t.Errorf("restore open-files limit: %v", err)
		}
	})
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if errors.Is(err, syscall.EMFILE) {
			return f
		}
		if err != nil {
			t.Fatal(err)
		}
		f.fds = append(f.fds, fd)
	}
}

// free closes n of the held descriptors.
func (f *fdFiller) free(n int) {
	for range n {
		last := len(f.fds) - 1
		_ = syscall.Close(f.fds[last])
		f.fds = f.fds[:last]
	}
}

// take opens n descriptors again.
func (f *fdFiller) take(n int) {
	f.t.Helper()
	for range n {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			f.t.Fatalf("retake a descriptor: %v", err)
		}
		f.fds = append(f.fds, fd)
	}
}

// countingListener counts the calls to Accept; embedding keeps the
// TCPListener's SyscallConn.
type countingListener struct {
	*net.TCPListener
	calls *atomic.Int64
}

func (c *countingListener) Accept() (net.Conn, error) {
	c.calls.Add(1)
	return c.TCPListener.Accept()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKernelMemoryShortageIsWaitedOut: ENOBUFS and ENOMEM from accept
// would stop fasthttp's Serve (and the relay); the listener backs off,
// warns once, and serves the connection that comes once memory is back.
func TestKernelMemoryShortageIsWaitedOut(t *testing.T) {
	var logs syncBuffer
	h := start(t, Limits{}, func(l *Listener) {
		l.inner = &failingListener{TCPListener: l.inner.(*net.TCPListener),
			errs: []error{syscall.ENOBUFS, syscall.ENOMEM, syscall.ENOBUFS}}
		l.SetLog(slog.New(slog.NewTextHandler(&logs, nil)))
	})
	begin := time.Now()
	h.expectAccepted(h.dial("127.0.0.1"))
	// Pauses of 5, 10 and 20 ms come between the four calls.
	if took := time.Since(begin); took < 35*time.Millisecond {
		t.Fatalf("three failed accepts and a served one within %v: no back-off", took)
	}
	if n := strings.Count(logs.String(), "lack of kernel memory"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	for reason, n := range h.counts.snapshot() {
		if n != 0 {
			t.Fatalf("%d refusals counted as %q: nothing was refused", n, reason)
		}
	}
}

// failingListener fails its first Accepts with errs, then accepts.
type failingListener struct {
	*net.TCPListener
	mu   sync.Mutex
	errs []error
}

func (f *failingListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", err)}
	}
	f.mu.Unlock()
	return f.TCPListener.Accept()
}
