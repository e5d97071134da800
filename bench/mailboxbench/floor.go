package mailboxbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// floorAnswer is what the floor server writes for every request: the
// header block our relay writes for a HEAD of a direction, byte for byte
// in size, so that the socket carries the same traffic.
var floorAnswer = []byte("HTTP/1.1 200 OK\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\nContent-Length: 0\r\n" +
	"X-Relay-First: 1\r\nX-Relay-Last: 100\r\nX-Relay-Count: 100\r\n\r\n")

// floorCreated is the PUT floor's answer, the size of our relay's 201.
var floorCreated = []byte("HTTP/1.1 201 Created\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\nContent-Length: 0\r\n\r\n")

// floorServer is the least any HTTP/1.1 server in Go can do per request
// over a keep-alive connection: it reads until the blank line that ends
// the request's header (no parsing, no routing, no store) and writes a
// canned answer, flushing once no further request is buffered. Its CPU
// per request is the kernel's loopback TCP and Go's netpoller, the cost
// every server pays; it bounds how far any server can get ahead of the
// net/http baseline on the same load.
//
// With a store (the PUT floor) it also reads the body that
// Content-Length announces and commits it as raw Pebble does in the PUT
// baseline (rawCommit: one Set, pebble.Sync, each connection a writer of
// its own) before answering 201: an HTTP exchange plus a synced commit,
// the least any HTTP server can do per synced write.
type floorServer struct {
	ln    net.Listener
	raw   *pebble.DB // nil: the HEAD floor
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// next is each connection's last sequence, by connection number.
	next []uint64
}

func startFloor(listen string, raw *pebble.DB) (*floorServer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("mailboxbench: floor server: %w", err)
	}
	f := &floorServer{ln: ln, raw: raw, conns: map[net.Conn]struct{}{}}
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
		f.next = append(f.next, 0)
		w := len(f.next) - 1
		f.mu.Unlock()
		var commit func([]byte) error
		if f.raw != nil {
			commit = rawCommit(f.raw, w, &f.next[w])
		}
		f.wg.Add(1)
		go f.serve(c, commit)
	}
}

func (f *floorServer) serve(c net.Conn, commit func([]byte) error) {
	defer f.wg.Done()
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
	}()
	br, bw := bufio.NewReaderSize(c, 4096), bufio.NewWriterSize(c, 4096)
	answer := floorAnswer
	if commit != nil {
		answer = floorCreated
	}
	var body []byte
	for {
		n := 0
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if commit != nil && len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
				if n, err = strconv.Atoi(string(bytes.TrimSpace(line[len(contentLength):]))); err != nil || n < 0 || n > 1<<20 {
					return
				}
			}
		}
		if commit != nil {
			body = slices.Grow(body[:0], n)[:n]
			if _, err := io.ReadFull(br, body); err != nil {
				return
			}
			if err := commit(body); err != nil {
				return
			}
		}
		if _, err := bw.Write(answer); err != nil {
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

// floors measures the floor server under the HEAD loads of the read
// figures (the same connections and requests, one at a time and
// pipelined), Rounds rounds each with the first dropped.
func (b *pinnedBench) floors(ctx context.Context) (sides map[int]PinnedSide, err error) {
	o := b.o
	p, err := b.start(ctx, "floor", filepath.Join(b.dataDir, "floor"))
	if err != nil {
		return nil, err
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
			return nil, err
		}
		conns = append(conns, c)
	}
	sides = map[int]PinnedSide{}
	for _, l := range b.readLoads() {
		if l.kind != kindHead {
			continue
		}
		var runs []PinnedRun
		for round := range o.Rounds {
			r, err := measure(ctx, p, func() (uint64, time.Duration, error) {
				return pipelinedLoad(ctx, o.RoundTime, o.Conns, l.depth, func(w int) func() error {
					return readOp(conns[w], p.Ready, l.kind, w, l.depth, ro)
				})
			})
			if err != nil {
				return nil, fmt.Errorf("mailboxbench: pinned HTTP floor, %s, round %d: %w", l.name(), round, err)
			}
			pinnedProgress(o.Progress, round, fmt.Sprintf("%-30s %-10s", l.name(), "floor"), r, "requests")
			if round > 0 {
				runs = append(runs, r)
			}
		}
		sides[l.depth] = summarizePinned("floor", runs)
	}
	return sides, nil
}
