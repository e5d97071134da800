package ws

import (
	"io"
	"net"
	"testing"
	"time"
	"unsafe"
)

// An idle socket gives back queue buffers bigger than maxIdleBuffer: at
// once without pings, at the next ping tick with them.
func TestIdleSocketReleasesBigBuffers(t *testing.T) {
	for _, ping := range []time.Duration{0, 20 * time.Millisecond} {
		server, client := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		c := newConn(server, NewSettings(Options{PingInterval: ping}))

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

// maskedFrame is a client frame (masked with a zero key, which leaves the
// payload as it is) carrying payload with opcode op.
func maskedFrame(op int, payload []byte) []byte {
	f := appendFrame(nil, op, payload)
	// Set the mask bit and insert a zero mask key after the length.
	hdr := 2
	switch f[1] {
	case 126:
		hdr = 4
	case 127:
		hdr = 10
	}
	f[1] |= 0x80
	out := append([]byte{}, f[:hdr]...)
	out = append(out, 0, 0, 0, 0)
	return append(out, f[hdr:]...)
}

// A read buffer grown past maxKeptMessage by one huge message is dropped
// at the next read; smaller ones are kept (no allocation per message).
func TestReadBufferShrinksAfterHugeMessage(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	c := newConn(server, NewSettings(Options{MaxMessage: 4 * maxKeptMessage}))
	defer func() { c.Close(CloseNormal, ""); <-c.Done() }()
	go func() { _, _ = io.Copy(io.Discard, client) }()
	go func() {
		for _, size := range []int{2 * maxKeptMessage, 10, maxKeptMessage / 2, 10} {
			if _, err := client.Write(maskedFrame(OpBinary, make([]byte, size))); err != nil {
				return
			}
		}
	}()
	want := []struct {
		size   int
		capMax int // the buffer's capacity after reading the message
	}{
		{2 * maxKeptMessage, 4 * maxKeptMessage},
		{10, maxKeptMessage}, // dropped, regrown small
		{maxKeptMessage / 2, maxKeptMessage},
	}
	for i, w := range want {
		_, msg, err := c.ReadMessage()
		if err != nil || len(msg) != w.size {
			t.Fatalf("message %d: %d bytes, %v", i, len(msg), err)
		}
		if cap(c.msg) > w.capMax {
			t.Fatalf("message %d: buffer capacity %d, want at most %d", i, cap(c.msg), w.capMax)
		}
	}
	keep := cap(c.msg)
	if _, msg, err := c.ReadMessage(); err != nil || len(msg) != 10 || cap(c.msg) != keep {
		t.Fatalf("a buffer of %d bytes was not kept: now %d (%v)", keep, cap(c.msg), err)
	}
}

// An idle socket keeps no Done channel: it is made on demand, and one
// first asked for after the writer has finished is closed already.
func TestDoneMadeAfterTheEnd(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	c := newConn(server, NewSettings(Options{}))
	c.mu.Lock()
	made := c.done != nil
	c.mu.Unlock()
	if made {
		t.Fatal("a new Conn holds a Done channel")
	}
	c.Abort() // no close frame: the writer ends at once
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		ended, made := c.writerDone, c.done != nil
		c.mu.Unlock()
		if made {
			t.Fatal("the writer's end made a Done channel nobody asked for")
		}
		if ended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer did not end")
		}
		time.Sleep(time.Millisecond)
	}
	done := c.Done()
	select {
	case <-done:
	default:
		t.Fatal("Done asked after the end is open")
	}
	if c.Done() != done {
		t.Fatal("Done changed channel")
	}
}

// An idle socket keeps its Conn, so its size class counts once per
// socket: the Conn stays within 512 bytes (it keeps its Settings by
// pointer for that).
func TestConnFitsItsSizeClass(t *testing.T) {
	if size := unsafe.Sizeof(Conn{}); size > 512 {
		t.Fatalf("a Conn takes %d bytes, past the 512-byte size class", size)
	}
}
