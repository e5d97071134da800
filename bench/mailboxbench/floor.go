package mailboxbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"
)

// floorAnswer is what the floor server writes for every request: the
// header block our relay writes for a HEAD of a direction, byte for byte
// in size, so that the socket carries the same traffic.
var floorAnswer = []byte("HTTP/1.1 200 OK\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\nContent-Length: 0\r\n" +
	"X-Relay-First: 1\r\nX-Relay-Last: 100\r\nX-Relay-Count: 100\r\n\r\n")

// floorServer is the least any HTTP/1.1 server in Go can do per request
// over a keep-alive connection: it reads until the blank line that ends
// the request's header (no parsing, no routing, no store) and writes a
// canned answer, flushing once no further request is buffered. Its CPU
// per request is the kernel's loopback TCP and Go's netpoller, the cost
// every server pays; it bounds how far any server can get ahead of the
// net/http baseline on the same load.
type floorServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startFloor(listen string) (*floorServer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("mailboxbench: floor server: %w", err)
	}
	f := &floorServer{ln: ln, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

func (f *floorServer) addr() string { return f.ln.Addr().String() }

func (f *floorServer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(c)
	}
}

func (f *floorServer) serve(c net.Conn) {
	defer f.wg.Done()
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
	}()
	br, bw := bufio.NewReaderSize(c, 4096), bufio.NewWriterSize(c, 4096)
	for {
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
		}
		if _, err := bw.Write(floorAnswer); err != nil {
			return
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

func (f *floorServer) close() error {
	err := f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// floor measures the floor server under the HEAD rows' load (the same
// connections and requests), Rounds rounds with the first dropped.
func (b *pinnedBench) floor(ctx context.Context) (side PinnedSide, err error) {
	o := b.o
	p, err := b.start(ctx, "floor", filepath.Join(b.dataDir, "floor"))
	if err != nil {
		return side, err
	}
	defer func() { err = errors.Join(err, p.Stop()) }()
	ro := ReadOptions{Rounds: o.Rounds, Conns: o.Conns, Mailboxes: o.Mailboxes, Stored: o.Stored, EnvelopeSize: o.EnvelopeSize}
	var conns []*rawClient
	defer func() {
		for _, c := range conns {
			err = errors.Join(err, c.close())
		}
	}()
	for range o.Conns {
		c, err := dialRaw(p.Ready)
		if err != nil {
			return side, err
		}
		conns = append(conns, c)
	}
	var runs []PinnedRun
	for round := range o.Rounds {
		r, err := measure(ctx, p, func() (uint64, time.Duration, error) {
			return countedLoad(ctx, o.RoundTime, o.Conns, func(w int) func() error {
				return readOp(conns[w], p.Ready, kindHead, w, ro)
			})
		})
		if err != nil {
			return side, fmt.Errorf("mailboxbench: pinned HTTP floor, round %d: %w", round, err)
		}
		pinnedProgress(o.Progress, round, fmt.Sprintf("%-19s %-10s", kindNames[kindHead], "floor"), r, "requests")
		if round > 0 {
			runs = append(runs, r)
		}
	}
	return summarizePinned("floor", runs), nil
}
