package server

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// TestWriteBufferBatchesPipelinedAnswers pipelines 16 GETs whose answers
// carry 1 KiB each and counts the data segments the client's socket
// received: on loopback each write of the server is one segment (the MSS
// is near 64 KiB), so the count is the server's writes. fasthttp's 4 KiB
// buffer needs five or more; 16 KiB, two.
func TestWriteBufferBatchesPipelinedAnswers(t *testing.T) {
	body := bytes.Repeat([]byte("e"), 1024)
	handler := func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body) }
	writes := func(bufferSize int) uint32 {
		l := start(t, Service{Name: "test", Handler: handler, WriteBufferSize: bufferSize}, nil)
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		segsIn := func() uint32 {
			var info *unix.TCPInfo
			var serr error
			if err := raw.Control(func(fd uintptr) { info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || serr != nil {
				t.Fatal(err, serr)
			}
			return info.Data_segs_in
		}
		before := segsIn()
		if _, err := io.WriteString(c, strings.Repeat("GET /e HTTP/1.1\r\nHost: x\r\n\r\n", 16)); err != nil {
			t.Fatal(err)
		}
		// Read until the 16th answer's body has arrived.
		var got []byte
		buf := make([]byte, 64<<10)
		for bytes.Count(got, body) < 16 {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("after %d bytes: %v", len(got), err)
			}
			got = append(got, buf[:n]...)
		}
		return segsIn() - before
	}
	if n := writes(16 << 10); n > 2 {
		t.Errorf("16 KiB buffer: 16 answers came in %d writes, want at most 2", n)
	}
	if n := writes(0); n < 5 {
		t.Errorf("default buffer: 16 answers came in %d writes; the baseline this test compares with is gone", n)
	}
}
