package serverproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// IdleCost is what idle sockets cost a server process: its memory before
// they were opened and with all of them open, and the growth per socket.
type IdleCost struct {
	Sockets       int
	Before, After Mem
	// PerSocket is the growth of the resident set divided by the
	// sockets, in bytes; Stack and Heap split it by the runtime's
	// accounts (the rest is the runtime's own metadata and what it has
	// not given back).
	PerSocket, StackPerSocket, HeapPerSocket float64
	// GoroutinesPerSocket is the goroutines each socket keeps.
	GoroutinesPerSocket float64
}

// MeasureIdle measures what n idle sockets cost the server p: it reads
// p's memory, opens the sockets with open, waits until the server says
// (its "count" command, which answers how many sockets it holds) that it
// holds n more than before, reads the memory again and, when heapProfile
// is set, has the server write a heap profile there. The sockets are
// reset (no TIME_WAIT left to eat the next server's ephemeral ports)
// before it returns.
func MeasureIdle(ctx context.Context, p *Proc, n int, open func(context.Context) ([]net.Conn, error), heapProfile string) (c IdleCost, err error) {
	c.Sockets = n
	held := func() (int, error) {
		ans, err := p.Ask(ctx, "count", askTimeout)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(ans)
	}
	base, err := held()
	if err != nil {
		return c, err
	}
	if c.Before, err = p.Mem(ctx); err != nil {
		return c, err
	}
	conns, err := open(ctx)
	defer func() {
		for _, conn := range conns {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = conn.Close()
		}
	}()
	if err != nil {
		return c, err
	}
	// The server counts a socket once its handler has registered it, a
	// moment after the 101 reached this side.
	deadline := time.Now().Add(30 * time.Second)
	for {
		h, err := held()
		if err != nil {
			return c, err
		}
		if h-base == n {
			break
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("serverproc: %s holds %d sockets of %d", p.Name, h-base, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.After, err = p.Mem(ctx); err != nil {
		return c, err
	}
	if heapProfile != "" {
		if _, err := p.Ask(ctx, "heap-profile "+heapProfile, askTimeout); err != nil {
			return c, err
		}
	}
	f := float64(n)
	c.PerSocket = (float64(c.After.RSS) - float64(c.Before.RSS)) / f
	c.StackPerSocket = (float64(c.After.StackInuse) - float64(c.Before.StackInuse)) / f
	c.HeapPerSocket = (float64(c.After.HeapInuse) - float64(c.Before.HeapInuse)) / f
	c.GoroutinesPerSocket = float64(c.After.Goroutines-c.Before.Goroutines) / f
	return c, nil
}

// OpenAll opens n sockets with dial, a few dozen handshakes at a time,
// and returns those that opened with every error.
func OpenAll(ctx context.Context, n int, dial func(i int) (net.Conn, error)) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			conns[i], errs[i] = dial(i)
		}()
	}
	wg.Wait()
	var open []net.Conn
	for _, c := range conns {
		if c != nil {
			open = append(open, c)
		}
	}
	return open, errors.Join(errs...)
}

// DialUpgrade opens one WebSocket the way a client does, by hand: a GET
// of path on addr with the upgrade headers and the extra header lines
// given ("Name: value"), then the 101. It reads nothing more: an idle
// socket of the servers measured is sent nothing after its 101 until the
// first ping.
func DialUpgrade(addr, path string, header ...string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13" +
		"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
	for _, h := range header {
		req += "\r\n" + h
	}
	req += "\r\n\r\n"
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	// Nothing follows the answer, so the answer is all there is to read.
	var buf [512]byte
	var resp []byte
	for !bytes.Contains(resp, []byte("\r\n\r\n")) {
		if len(resp) >= len(buf) {
			return nil, errors.Join(fmt.Errorf("%s: answer too long: %.200q", path, resp), c.Close())
		}
		n, err := c.Read(buf[len(resp):])
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%s: %w after %q", path, err, resp), c.Close())
		}
		resp = buf[:len(resp)+n]
	}
	if !bytes.HasPrefix(resp, []byte("HTTP/1.1 101 ")) {
		return nil, errors.Join(fmt.Errorf("%s: %.200q", path, resp), c.Close())
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}
