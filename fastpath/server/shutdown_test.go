package server

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestShutdownStopsKeptAliveConnectionsWhileTheDrainWaits holds the
// service's drain open (a WebSocket that never finishes closing) and checks
// that a kept-alive connection is closed meanwhile, its next request
// unanswered: it must not be served as new work for as long as the drain
// waits. (Closing the listener ends fasthttp's idle keep-alive connections.)
func TestShutdownStopsKeptAliveConnectionsWhileTheDrainWaits(t *testing.T) {
	release := make(chan struct{})
	draining := make(chan struct{})
	var once sync.Once // the test's cleanup shuts down once more
	l := start(t, Service{Name: "t", MaxHeaderBytes: 4096, Drain: func(ctx context.Context) error {
		once.Do(func() { close(draining) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}, nil)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	req := "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	shut := make(chan error, 1)
	go func() { shut <- l.Shutdown(context.Background()) }()
	<-draining
	_, _ = c.Write([]byte(req))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("a kept-alive connection was served (%d) while the drain waited", resp.StatusCode)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the kept-alive connection was left open while the drain waited")
	}
	close(release)
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
}
