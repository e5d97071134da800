package turn

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/pion/stun/v3"

	"edgerelay/turn/turntest"
)

// pipeStream is a streamConn reading from one end of an in-memory pipe.
func pipeStream(t *testing.T, s *Server) (*streamConn, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	sc := &streamConn{Conn: a, srv: s, t: tuple{stream: true}, buf: make([]byte, streamBuffer)}
	sc.allocated.Store(true) // no idle deadline on the pipe
	return sc, b
}

// TestStreamFraming feeds STUN messages to the stream reader byte by
// byte and in one piece, including one larger than the first buffer, and
// expects each handed on whole; unknown ChannelData is dropped and a
// frame that is neither closes the connection.
func TestStreamFraming(t *testing.T) {
	s, _ := testServer(t, nil)
	sc, w := pipeStream(t, s)

	small := stun.MustBuild(stun.TransactionID, stun.BindingRequest)
	big := stun.MustBuild(stun.TransactionID, stun.BindingRequest, stun.NewSoftware(string(bytes.Repeat([]byte("s"), 700))))
	for range 20 { // grow past streamBuffer
		_ = stun.NewSoftware(string(bytes.Repeat([]byte("x"), 500))).AddTo(big)
	}
	if len(big.Raw) <= streamBuffer {
		t.Fatalf("big message %d bytes, want more than %d", len(big.Raw), streamBuffer)
	}
	chanData := make([]byte, 4+5+3) // channel 0x4000, 5 bytes, padded to 12
	binary.BigEndian.PutUint16(chanData[0:2], 0x4000)
	binary.BigEndian.PutUint16(chanData[2:4], 5)

	go func() {
		for _, b := range small.Raw { // one byte at a time
			_, _ = w.Write([]byte{b})
		}
		_, _ = w.Write(chanData) // no allocation: dropped
		_, _ = w.Write(big.Raw)
		_, _ = w.Write(small.Raw)
		_, _ = w.Write([]byte{0xC0, 0, 0, 0}) // neither STUN nor ChannelData
	}()
	read := func() []byte {
		// pion reads with a 1600-byte buffer; a bigger frame comes in parts.
		var got []byte
		buf := make([]byte, 1600)
		for {
			n, err := sc.Read(buf)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			got = append(got, buf[:n]...)
			if len(got) >= 20 && len(got) >= 20+int(binary.BigEndian.Uint16(got[2:4])) {
				return got
			}
		}
	}
	for i, want := range [][]byte{small.Raw, big.Raw, small.Raw} {
		if got := read(); !bytes.Equal(got, want) {
			t.Fatalf("frame %d: got %d bytes, want %d", i, len(got), len(want))
		}
	}
	_ = sc.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := sc.Read(make([]byte, 1600)); err != errBadFrame {
		t.Fatalf("Read of a bad frame: %v, want errBadFrame", err)
	}
}

// TestStreamClosedMidFrame ends the reader cleanly when the client goes
// away in the middle of a frame.
func TestStreamClosedMidFrame(t *testing.T) {
	s, _ := testServer(t, nil)
	sc, w := pipeStream(t, s)
	go func() {
		_, _ = w.Write([]byte{0x00, 0x01, 0x00, 0x10, 0x21}) // a STUN header, cut short
		_ = w.Close()
	}()
	if _, err := sc.Read(make([]byte, 1600)); err != io.EOF {
		t.Fatalf("Read after a cut frame: %v, want EOF", err)
	}
}

// TestStreamCaps refuses TCP connections past the per-IP cap.
func TestStreamCaps(t *testing.T) {
	s, _ := testServer(t, func(c *Config) { c.MaxPerIP = 1 }) // 2 connections per IP
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		defer c.Close()
	}
	// The third is closed by the server as soon as it is accepted.
	_ = conns[2].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := conns[2].Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("third connection from one IP: %v, want EOF", err)
	}
	waitFor(t, "the refusal to be counted", func() bool { return metricValue(s.metrics.streamRefusals) == 1 })
	// The first two still work: a STUN Binding over TCP.
	m := stun.MustBuild(stun.TransactionID, stun.BindingRequest)
	if _, err := conns[0].Write(m.Raw); err != nil {
		t.Fatal(err)
	}
	_ = conns[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	if n, err := conns[0].Read(buf); err != nil || !stun.IsMessage(buf[:n]) {
		t.Fatalf("Binding over TCP: %v", err)
	}
}

// TestStreamSlowClientsCut: a TCP client that sends nothing, half a STUN
// header, or a frame one byte at a time (each byte well within the idle
// timeout) is cut once a whole frame has not come within
// StreamIdleTimeout, while a client that talks normally is served.
func TestStreamSlowClientsCut(t *testing.T) {
	const idle = 300 * time.Millisecond
	s, _ := testServer(t, func(c *Config) { c.StreamIdleTimeout = idle })
	binding := stun.MustBuild(stun.TransactionID, stun.BindingRequest).Raw
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	silent, half, trickle := dial(), dial(), dial()
	if _, err := half.Write(binding[:10]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	trickleDone := make(chan struct{})
	go func() {
		defer close(trickleDone)
		for i := range binding {
			if _, err := trickle.Write(binding[i : i+1]); err != nil {
				return // cut, as it should be
			}
			time.Sleep(idle / 3) // the pace of the trickle, not a wait for a condition
		}
	}()
	for name, c := range map[string]net.Conn{"silent": silent, "half a header": half, "trickle": trickle} {
		_ = c.SetReadDeadline(time.Now().Add(10 * idle))
		n, err := c.Read(make([]byte, 64))
		if err == nil || n > 0 {
			t.Fatalf("%s: read %d bytes, %v; want the connection closed", name, n, err)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: still open after %v (idle timeout %v)", name, time.Since(start), idle)
		}
	}
	// The whole trickled frame would take 20 × idle/3 ≈ 2 s; it was cut
	// within about one idle timeout of its first byte.
	if took := time.Since(start); took > 4*idle {
		t.Fatalf("slow clients cut only after %v (idle timeout %v)", took, idle)
	}
	<-trickleDone
	// A client that sends whole frames is answered.
	ok := dial()
	if _, err := ok.Write(binding); err != nil {
		t.Fatal(err)
	}
	_ = ok.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	if n, err := ok.Read(buf); err != nil || !stun.IsMessage(buf[:n]) {
		t.Fatalf("Binding over TCP beside the slow clients: %v", err)
	}
}

// TestStreamTLSHandshakeTimeout: a turns: client that connects and never
// sends its ClientHello is closed at HandshakeTimeout.
func TestStreamTLSHandshakeTimeout(t *testing.T) {
	const handshake = 300 * time.Millisecond
	cert := selfSigned(t)
	s, _ := testServer(t, func(c *Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		c.TLSListen = "127.0.0.1:0"
		c.HandshakeTimeout = handshake
	})
	c, err := net.Dial("tcp", s.TLSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * handshake))
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	switch {
	case err == nil || n > 0:
		t.Fatalf("read %d bytes, %v; want the connection closed", n, err)
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("still open after %v (handshake timeout %v)", time.Since(start), handshake)
	}
}

// TestStreamsOnRawSyscalls: TCP and TLS clients' connections are
// netlimit's (streamsListener), whose reads and writes are raw syscalls
// that never wake the runtime's monitor thread, under TLS too.
func TestStreamsOnRawSyscalls(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw syscalls are Linux's")
	}
	s, _ := testServer(t, func(c *Config) { withTLS(t, c) })
	for _, network := range []string{"tcp", "tls"} {
		turntest.MustAllocate(t, rawClient(t, s, network, network))
		s.streams.mu.Lock()
		var under []net.Conn
		for _, sc := range s.streams.conns {
			nc := sc.Conn
			if tc, ok := nc.(*tls.Conn); ok {
				nc = tc.NetConn()
			}
			under = append(under, nc)
		}
		s.streams.mu.Unlock()
		for _, nc := range under {
			if _, ok := nc.(interface{ TryWrite([]byte) (int, error) }); !ok {
				t.Fatalf("%s: a stream client's connection is a %T, not netlimit's", network, nc)
			}
		}
		if len(under) == 0 {
			t.Fatalf("%s: no stream connection", network)
		}
	}
}
