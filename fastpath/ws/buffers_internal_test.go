package ws

import (
	"io"
	"net"
	"testing"
	"time"
)

// An idle socket gives back queue buffers bigger than maxIdleBuffer: at
// once without pings, at the next ping tick with them.
func TestIdleSocketReleasesBigBuffers(t *testing.T) {
	for _, ping := range []time.Duration{0, 20 * time.Millisecond} {
		server, client := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		c := newConn(server, Options{PingInterval: ping})

		// Two big messages, the second queued once the writer has taken
		// the first: each grows its own buffer beyond maxIdleBuffer, and
		// when the writer takes the second, the first comes back as the
		// empty spare in pending.
		if err := c.WriteBinary(make([]byte, 4*maxIdleBuffer)); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !c.taken() {
			if time.Now().After(deadline) {
				t.Fatal("the writer did not take the first message")
			}
			time.Sleep(time.Millisecond)
		}
		if err := c.WriteBinary(make([]byte, 4*maxIdleBuffer)); err != nil {
			t.Fatal(err)
		}
		for {
			c.pongSeen.Store(true) // the pipe's far end answers no pings
			c.mu.Lock()
			idle, capacity := len(c.pending)+c.inFlight == 0, cap(c.pending)
			c.mu.Unlock()
			if idle && capacity <= maxIdleBuffer {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ping interval %v: pending keeps %d bytes of capacity while idle", ping, capacity)
			}
			time.Sleep(time.Millisecond)
		}
		c.Close(CloseNormal, "")
		<-c.Done()
		_ = client.Close()
	}
}

// taken reports whether the writer has taken what was queued.
func (c *Conn) taken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) == 0
}
