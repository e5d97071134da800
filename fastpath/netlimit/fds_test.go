//go:build linux

package netlimit

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
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
	if inOwnProcess(t) {
		return
	}
	logs := &syncBuffer{}
	var calls atomic.Int64
	h := listen(t, Limits{}, func(l *Listener) {
		l.inner = &countingListener{TCPListener: l.inner.(*net.TCPListener), calls: &calls}
		l.SetLog(slog.New(slog.NewJSONHandler(logs, nil)))
	})
	if !h.l.fds.holding() {
		t.Fatal("no spare descriptor held")
	}
	const attempts = 20
	clients := newRawClients(t, attempts+1)
	fill := exhaustFDs(t)
	h.serve()
	for i, client := range clients[:attempts] {
		begin := time.Now()
		client.connect(h.l.Addr())
		client.expectRefused(h)
		// The shedding closes it at once; a server that left it in the
		// backlog or retried with a sleep would take a second or more.
		if took := time.Since(begin); took > time.Second {
			t.Fatalf("attempt %d: refused after %v", i, took)
		}
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
	final := clients[attempts]
	final.connect(h.l.Addr())
	h.expectAccepted(final.conn())
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
	if inOwnProcess(t) {
		return
	}
	var inner *countingListener
	h := listen(t, Limits{}, func(l *Listener) {
		inner = &countingListener{TCPListener: l.inner.(*net.TCPListener), calls: new(atomic.Int64)}
		l.inner = inner
		l.raw = nil
	})
	client := newRawClients(t, 1)[0]
	fill := exhaustFDs(t)
	h.serve()
	client.connect(h.l.Addr())
	// The failures are timed from the first: Accept may have begun failing
	// before the client connected (accept(2) needs a descriptor even with
	// the queue empty).
	const retries = 5
	deadline := time.Now().Add(wait)
	for len(inner.failed()) < retries {
		if time.Now().After(deadline) {
			t.Fatalf("Accept stopped retrying after %d failures", len(inner.failed()))
		}
		time.Sleep(time.Millisecond)
	}
	// Pauses of 5, 10, 20 and 40 ms come between the first five failures.
	failed := inner.failed()
	if took := failed[retries-1].Sub(failed[0]); took < 75*time.Millisecond {
		t.Fatalf("%d failed accepts within %v: no back-off", retries, took)
	}
	fill.free(len(fill.fds))
	h.expectAccepted(client.conn())
	if got := h.counts.snapshot()[ReasonFDs]; got != 0 {
		t.Fatalf("%d connections refused, want the waiting one served", got)
	}
}

// TestCloseWhileOutOfFDs: closing the listener ends an Accept that is
// waiting out the exhaustion, and gives the spare descriptor back.
func TestCloseWhileOutOfFDs(t *testing.T) {
	if inOwnProcess(t) {
		return
	}
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

// TestSheddingServesOnceDescriptorsAreFree: a connection that the shedding
// takes off the queue when descriptors are free again is served, not shed
// (here the shedding starts after the process recovered, as when
// descriptors free up while it runs), and the reserve is held after.
func TestSheddingServesOnceDescriptorsAreFree(t *testing.T) {
	if inOwnProcess(t) {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counts := &recorder{}
	l := New(ln, Limits{}, counts)
	t.Cleanup(func() { l.Close() })
	client := newRawClients(t, 1)[0]
	fill := exhaustFDs(t)
	client.connect(l.Addr())
	fill.free(len(fill.fds))

	// A shedding that shed the connection would go on to wait for the
	// next one: closing the listener ends that wait.
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := l.shedPending()
		done <- result{c, err}
	}()
	var served net.Conn
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		served = r.c
	case <-time.After(wait):
		l.Close()
		<-done
	}
	if served == nil {
		t.Fatalf("connection shed with descriptors free (refusals %v)", counts.snapshot())
	}
	defer served.Close()
	if got := counts.snapshot()[ReasonFDs]; got != 0 {
		t.Fatalf("%d refusals counted for a served connection", got)
	}
	if !l.fds.holding() {
		t.Fatal("reserve not held after serving")
	}
	conn := client.conn()
	if served.RemoteAddr().String() != conn.LocalAddr().String() {
		t.Fatalf("served %v, the client is %v", served.RemoteAddr(), conn.LocalAddr())
	}
	served.SetDeadline(time.Now().Add(wait))
	if _, err := served.Write([]byte("k")); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		t.Fatalf("served connection does not work: %v", err)
	}
}

// rawClient is a client socket made before the process runs out of
// descriptors, so that connecting it takes none. The test and the listener
// share the process's descriptors: with these clients the test opens and
// closes none while the listener sheds, and the listener's juggling of its
// reserve is all that moves the count (a dial would race it for the one
// free descriptor).
type rawClient struct {
	t  *testing.T
	fd int // -1 once handed to conn
}

// newRawClients makes n unconnected blocking TCP sockets, closed at cleanup.
func newRawClients(t *testing.T, n int) []*rawClient {
	t.Helper()
	clients := make([]*rawClient, n)
	for i := range clients {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		c := &rawClient{t: t, fd: fd}
		t.Cleanup(func() {
			if c.fd >= 0 {
				_ = syscall.Close(c.fd)
			}
		})
		clients[i] = c
	}
	return clients
}

// connect connects to addr (a loopback TCP address): the handshake is done
// by the kernel, whatever the listener's state.
func (c *rawClient) connect(addr net.Addr) {
	c.t.Helper()
	a := addr.(*net.TCPAddr)
	sa := &syscall.SockaddrInet4{Port: a.Port}
	copy(sa.Addr[:], a.IP.To4())
	if err := syscall.Connect(c.fd, sa); err != nil {
		c.t.Fatalf("connect to %v: %v", addr, err)
	}
}

// expectRefused waits for the server to close the connection without a
// byte, and checks that Accept never returned it.
func (c *rawClient) expectRefused(h *harness) {
	c.t.Helper()
	tv := syscall.NsecToTimeval(wait.Nanoseconds())
	if err := syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		c.t.Fatal(err)
	}
	var n int
	var err error
	for {
		n, err = syscall.Read(c.fd, make([]byte, 1))
		if err != syscall.EINTR {
			break
		}
	}
	if n != 0 || err != nil {
		c.t.Fatalf("refused connection: read %d bytes, %v; want the end of the stream", n, err)
	}
	h.expectNoneAccepted()
}

// conn hands the socket over as a net.Conn (which takes a descriptor: call
// it once some are free).
func (c *rawClient) conn() net.Conn {
	c.t.Helper()
	f := os.NewFile(uintptr(c.fd), "client")
	c.fd = -1
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return conn
}

// ownProcessEnv names the test a child process of the test binary runs
// (inOwnProcess).
const ownProcessEnv = "NETLIMIT_TEST_OWN_PROCESS"

// inOwnProcess runs the calling test again in a child process of the test
// binary, alone, and reports true in the parent (which then returns; the
// child's failure is the test's); in the child it reports false and the
// test runs. Running out of descriptors is the whole process's state, so a
// test that exhausts them must be the only thing in its process: a
// descriptor that something left by an earlier test frees or takes while
// the test runs (a finalizer closing a dropped connection, a timer closing
// a parked one) changes what the listener may do, and a connection the
// test expects shed is served instead.
func inOwnProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv(ownProcessEnv) == t.Name() {
		return false
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), ownProcessEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a process of its own: %v\n%s", err, out)
	}
	switch {
	case bytes.Contains(out, []byte("--- SKIP: "+t.Name())):
		t.Skipf("skipped in a process of its own:\n%s", out)
	case !bytes.Contains(out, []byte("--- PASS: "+t.Name())):
		t.Fatalf("in a process of its own: the test did not run\n%s", out)
	}
	return true
}

// fdFiller holds descriptors so that the process has none left.
type fdFiller struct {
	t   *testing.T
	fds []int
}

// exhaustFDs must run while no other goroutine opens or closes descriptors
// (the listener's accept loop starts after it, see listen): a descriptor
// held for a moment elsewhere, such as the one accept(2) takes even when
// the queue is empty, would end the filling one short.
//
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

// countingListener counts the calls to Accept and notes when each failed;
// embedding keeps the TCPListener's SyscallConn.
type countingListener struct {
	*net.TCPListener
	calls *atomic.Int64

	mu       sync.Mutex
	failures []time.Time
}

func (c *countingListener) Accept() (net.Conn, error) {
	c.calls.Add(1)
	conn, err := c.TCPListener.Accept()
	if err != nil {
		c.mu.Lock()
		c.failures = append(c.failures, time.Now())
		c.mu.Unlock()
	}
	return conn, err
}

// failed returns when the calls that failed returned.
func (c *countingListener) failed() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.failures)
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
