package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// With ReduceIdleMemory a keep-alive connection is still served request
// after request, pipelined ones included, bodies and all.
func TestReduceIdleMemoryKeepsKeepAlive(t *testing.T) {
	l := start(t, Service{Name: "t", MaxHeaderBytes: 4096, MaxBodyBytes: 1 << 16, HeaderTimeout: 5 * time.Second,
		IdleTimeout: 5 * time.Second, ReduceIdleMemory: true,
		Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBody(append([]byte("got:"), ctx.PostBody()...)) }}, nil)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	read := func(want string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("answer %d %q, want 200 %q", resp.StatusCode, body, want)
		}
	}
	post := func(body string) string {
		return "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	big := strings.Repeat("b", 20000)
	for _, body := range []string{"one", big, ""} {
		if _, err := io.WriteString(c, post(body)); err != nil {
			t.Fatal(err)
		}
		read("got:" + body)
	}
	// Pipelined: two requests in one write.
	if _, err := io.WriteString(c, post("a")+post("b")); err != nil {
		t.Fatal(err)
	}
	read("got:a")
	read("got:b")
}
