package netlimit

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"edgerelay/fastpath/alloctest"
)

// sysPair is an accepted connection and its client. On Linux the accepted
// one must do its reads and writes as raw syscalls (sysio_linux.go): the
// tests below would otherwise test net.Conn.
func sysPair(t *testing.T) (server *conn, client *net.TCPConn) {
	t.Helper()
	h := start(t, Limits{}, nil)
	cl := h.dial("127.0.0.1")
	s := h.expectAccepted(cl).(*conn)
	if runtime.GOOS == "linux" && s.rc == nil {
		t.Fatal("an accepted TCP connection has no raw connection: its reads and writes take net.Conn's path")
	}
	// expectAccepted's probe byte.
	if err := s.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	return s, cl.(*net.TCPConn)
}

// The raw path reads and writes what net.Conn would, and fails as it
// would: io.EOF unwrapped at the peer's end, *net.OpError "read"/"write"
// wrapping os.ErrDeadlineExceeded, net.ErrClosed or the errno, and a
// write cut by its deadline reports what it wrote.
func TestSysIOLikeNetConn(t *testing.T) {
	t.Run("big write waits for room and keeps order", func(t *testing.T) {
		s, cl := sysPair(t)
		want := make([]byte, 8<<20)
		for i := range want {
			want[i] = byte(i * 7 >> 3)
		}
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(io.LimitReader(cl, int64(len(want))))
			got <- b
		}()
		_ = s.SetWriteDeadline(time.Now().Add(wait))
		if n, err := s.Write(want); n != len(want) || err != nil {
			t.Fatalf("Write of %d bytes: %d, %v", len(want), n, err)
		}
		if b := <-got; !bytes.Equal(b, want) {
			t.Fatalf("the client read %d bytes, not what was written", len(b))
		}
	})

	t.Run("reads, then EOF", func(t *testing.T) {
		s, cl := sysPair(t)
		if _, err := cl.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		_ = s.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 16)
		if n, err := io.ReadFull(s, buf[:5]); n != 5 || err != nil || string(buf[:5]) != "hello" {
			t.Fatalf("Read: %q %v", buf[:n], err)
		}
		if n, err := s.Read(nil); n != 0 || err != nil {
			t.Fatalf("a zero-length Read: %d, %v; want 0, nil", n, err)
		}
		if err := cl.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if n, err := s.Read(buf); n != 0 || err != io.EOF {
			t.Fatalf("Read after the peer's FIN: %d, %v; want 0 and io.EOF itself", n, err)
		}
	})

	t.Run("read deadline", func(t *testing.T) {
		s, _ := sysPair(t)
		_ = s.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := s.Read(make([]byte, 8))
		var ne net.Error
		if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read past its deadline: %d, %v; want a timeout", n, err)
		}
		expectOp(t, err, "read", s)
	})

	t.Run("write deadline reports what was written", func(t *testing.T) {
		s, _ := sysPair(t) // the client never reads
		_ = s.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		big := make([]byte, 64<<20)
		n, err := s.Write(big)
		if n <= 0 || n >= len(big) || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write to a peer that does not read, past its deadline: %d of %d, %v; want some written and a timeout", n, len(big), err)
		}
		expectOp(t, err, "write", s)
	})

	t.Run("close during a read", func(t *testing.T) {
		s, _ := sysPair(t)
		errc := make(chan error, 1)
		go func() {
			_, err := s.Read(make([]byte, 8))
			errc <- err
		}()
		time.Sleep(10 * time.Millisecond) // likely waiting by now; if not, it must still end with ErrClosed
		_ = s.Close()
		select {
		case err := <-errc:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read on a connection closed meanwhile: %v; want net.ErrClosed", err)
			}
			expectOp(t, err, "read", s)
		case <-time.After(wait):
			t.Fatal("a Read waiting on a connection that was closed did not return")
		}
	})

	t.Run("write to a reset peer", func(t *testing.T) {
		s, cl := sysPair(t)
		if n, err := s.Write(nil); n != 0 || err != nil {
			t.Fatalf("a zero-length Write: %d, %v; want 0, nil", n, err)
		}
		_ = cl.SetLinger(0) // its close sends a reset
		_ = cl.Close()
		deadline := time.Now().Add(wait)
		for {
			_, err := s.Write([]byte("x"))
			if err != nil {
				if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("Write to a reset peer: %v; want ECONNRESET or EPIPE", err)
				}
				var se *os.SyscallError
				if !errors.As(err, &se) || se.Syscall != "write" {
					t.Fatalf("Write's errno is not wrapped as the write syscall's: %#v", err)
				}
				expectOp(t, err, "write", s)
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("writes to a reset peer keep succeeding")
			}
			time.Sleep(time.Millisecond) // the reset is on its way over loopback
		}
	})
}

// expectOp checks that err is a *net.OpError for op between c's ends.
func expectOp(t *testing.T, err error, op string, c net.Conn) {
	t.Helper()
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != op || oe.Net != "tcp" ||
		oe.Source.String() != c.LocalAddr().String() || oe.Addr.String() != c.RemoteAddr().String() {
		t.Fatalf("error %#v: want a *net.OpError %q, tcp, from %v to %v", err, op, c.LocalAddr(), c.RemoteAddr())
	}
}

// A read and a write on the raw path allocate nothing: their callbacks
// are made once per pooled op, not per call.
func TestSysIOAllocs(t *testing.T) {
	alloctest.SkipUnderRace(t)
	s, cl := sysPair(t)
	_ = s.SetDeadline(time.Now().Add(wait))
	_ = cl.SetDeadline(time.Now().Add(wait))
	msg, buf, back := []byte("ping"), make([]byte, 4), make([]byte, 4)
	count := alloctest.Measure(t, 10, 500, func() error {
		if _, err := cl.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			return err
		}
		if _, err := s.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(cl, back)
		return err
	})
	if count.PerRun != 0 {
		t.Fatalf("%v allocations per read and write round trip (%d mallocs in %d more), want 0", count.PerRun, count.Mallocs, count.Runs)
	}
}

// TryRead takes what is there without waiting, whatever the read
// deadline: a peek leaves it for the next read, nothing there is (0, nil),
// the peer's end io.EOF, a closed connection net.ErrClosed.
func TestTryRead(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("elsewhere TryRead finds nothing by design: the reader reads")
	}
	s, cl := sysPair(t)
	buf := make([]byte, 8)
	if n, err := s.TryRead(buf, true); n != 0 || err != nil {
		t.Fatalf("nothing sent yet: %d, %v; want 0, nil", n, err)
	}
	_ = s.SetReadDeadline(time.Unix(1, 0)) // passed: TryRead does not care
	if _, err := cl.Write([]byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	var n int
	var err error
	for n == 0 && err == nil && time.Now().Before(deadline) {
		n, err = s.TryRead(buf[:4], true)
	}
	if n != 4 || err != nil || string(buf[:4]) != "abcd" {
		t.Fatalf("peek: %d %q, %v; want abcd", n, buf[:n], err)
	}
	if n, err := s.TryRead(buf, false); n != 6 || err != nil || string(buf[:6]) != "abcdef" {
		t.Fatalf("read after the peek: %d %q, %v; want all of abcdef", n, buf[:n], err)
	}
	if n, err := s.TryRead(buf, false); n != 0 || err != nil {
		t.Fatalf("all read: %d, %v; want 0, nil", n, err)
	}
	_ = cl.CloseWrite()
	n, err = 0, nil
	for err == nil && time.Now().Before(deadline) {
		n, err = s.TryRead(buf, true)
	}
	if n != 0 || err != io.EOF {
		t.Fatalf("after the peer's end: %d, %v; want io.EOF", n, err)
	}
	_ = s.Close()
	if _, err := s.TryRead(buf, false); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed: %v, want net.ErrClosed", err)
	}
}

// A peek and a read through TryRead allocate nothing.
func TestTryReadAllocs(t *testing.T) {
	alloctest.SkipUnderRace(t)
	if runtime.GOOS != "linux" {
		t.Skip("elsewhere TryRead finds nothing by design")
	}
	s, cl := sysPair(t)
	_ = cl.SetDeadline(time.Now().Add(wait))
	msg, buf := []byte("ping"), make([]byte, 4)
	count := alloctest.Measure(t, 10, 500, func() error {
		if _, err := cl.Write(msg); err != nil {
			return err
		}
		for n := 0; n < len(msg); {
			var err error
			if n, err = s.TryRead(buf, true); err != nil {
				return err
			}
		}
		_, err := s.TryRead(buf, false)
		return err
	})
	if count.PerRun != 0 {
		t.Fatalf("%v allocations per peek and read, want 0", count.PerRun)
	}
}
