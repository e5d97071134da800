package netlimit

import (
	"net"
	"sync/atomic"
	"testing"
)

// AfterClose runs each registered function once, after the first Close,
// and at once when registered on a closed connection.
func TestAfterCloseRunsOnceAfterTheFirstClose(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(raw, Limits{}, nil)
	defer ln.Close()
	// The client's descriptor must be closed when the test ends: the
	// descriptor-exhaustion tests that follow count every free one.
	clientDone := make(chan struct{})
	defer func() { <-clientDone }()
	go func() {
		defer close(clientDone)
		if c, err := net.Dial("tcp", raw.Addr().String()); err == nil {
			defer c.Close()
			var b [1]byte
			_, _ = c.Read(b[:])
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	c.(*conn).AfterClose(func() { runs.Add(1) })
	c.(*conn).AfterClose(func() { runs.Add(10) })
	if runs.Load() != 0 {
		t.Fatal("ran before the close")
	}
	_ = c.Close()
	_ = c.Close()
	if got := runs.Load(); got != 11 {
		t.Fatalf("runs %d after two closes, expected each function once (11)", got)
	}
	c.(*conn).AfterClose(func() { runs.Add(100) })
	if got := runs.Load(); got != 111 {
		t.Fatalf("runs %d, expected a function registered after the close to run at once", got)
	}
}
