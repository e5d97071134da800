package ws_test

// Benchmarks of the two hot functions over loopback TCP with a raw peer,
// each beside the same shape served by fasthttp/websocket's own server Conn
// (FastHTTPUpgrader), the baseline, in the same run:
//
//	go test -run '^$' -bench . -benchtime 2s ./fastpath/ws/
//
// ReadMessage: the raw client writes pre-built masked text frames (several
// per write, identical for both servers); the benchmark goroutine reads
// them. The baseline uses its ReadMessage, which returns a fresh slice.
//
// WriteText: the benchmark goroutine queues text messages; the raw client
// reads and discards them. Ours is asynchronous, so the producer stays at
// most a few hundred KiB ahead of what the client has read (the same
// window applies to the baseline, whose WriteMessage writes synchronously),
// and the clock stops only when the client has read everything.
//
// Allocations are the process's: the writer goroutine and the client count.

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/ws"
)

var benchSizes = []struct {
	name string
	n    int
}{{"256B", 256}, {"16KiB", 16 << 10}}

// messageConn is the part of a server connection a benchmark drives.
type messageConn interface {
	read() ([]byte, error)
	writeText(p []byte) error
}

type oursConn struct{ c *ws.Conn }

func (o oursConn) read() ([]byte, error) {
	_, p, err := o.c.ReadMessage()
	return p, err
}
func (o oursConn) writeText(p []byte) error { return o.c.WriteText(p) }

type gorillaConn struct{ c *websocket.Conn }

func (g gorillaConn) read() ([]byte, error) {
	_, p, err := g.c.ReadMessage()
	return p, err
}
func (g gorillaConn) writeText(p []byte) error { return g.c.WriteMessage(websocket.TextMessage, p) }

// connect starts a server of either implementation and returns its Conn
// and a raw client connected to it.
func connect(b *testing.B, impl string) (messageConn, *rawClient) {
	// Pings as in the service (channel's default interval); they decide
	// when an idle socket gives back big queue buffers.
	opts := ws.Options{MaxMessage: 1 << 20, MaxQueue: 4 << 20, PingInterval: 25 * time.Second}
	if impl == "ws" {
		ts := startServer(b, opts, nil)
		rc := dialRaw(b, ts.addr, 0)
		return oursConn{ts.accept(b)}, rc
	}
	addr, conns := startGorillaServer(b)
	rc := dialRaw(b, addr, 0)
	select {
	case c := <-conns:
		c.SetReadLimit(int64(opts.MaxMessage))
		return gorillaConn{c}, rc
	case <-time.After(waitTimeout):
		b.Fatal("baseline server upgraded nothing")
		return nil, nil
	}
}

// startGorillaServer serves fasthttp/websocket's server Conn with the same
// buffer sizes as ours and hands each Conn to the benchmark.
func startGorillaServer(b *testing.B) (string, chan *websocket.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	conns := make(chan *websocket.Conn, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	up := websocket.FastHTTPUpgrader{
		ReadBufferSize:  4 << 10,
		WriteBufferSize: 4 << 10,
		CheckOrigin:     func(*fasthttp.RequestCtx) bool { return true },
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		wg.Add(1)
		err := up.Upgrade(ctx, func(c *websocket.Conn) {
			defer wg.Done()
			conns <- c
			<-stop
		})
		if err != nil {
			wg.Done()
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() {
		close(stop)
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), conns
}

func BenchmarkReadMessage(b *testing.B) {
	for _, size := range benchSizes {
		for _, impl := range []string{"ws", "fasthttp-websocket"} {
			b.Run("impl="+impl+"/size="+size.name, func(b *testing.B) { benchRead(b, impl, size.n) })
		}
	}
}

func benchRead(b *testing.B, impl string, size int) {
	c, rc := connect(b, impl)
	f := frame(fin|ws.OpText, pattern(size, 0))
	perWrite := max(1, (64<<10)/len(f))
	batch := make([]byte, 0, perWrite*len(f))
	for range perWrite {
		batch = append(batch, f...)
	}
	sent := make(chan error, 1)
	run := func(n int) {
		go func() {
			for left := n; left > 0; {
				k := min(left, perWrite)
				if _, err := rc.nc.Write(batch[:k*len(f)]); err != nil {
					sent <- err
					return
				}
				left -= k
			}
			sent <- nil
		}()
		for i := range n {
			p, err := c.read()
			if err != nil {
				b.Fatalf("message %d: %v", i, err)
			}
			if len(p) != size {
				b.Fatalf("message %d has %d bytes, expected %d", i, len(p), size)
			}
		}
		if err := <-sent; err != nil {
			b.Fatal(err)
		}
	}

	run(2 * perWrite) // warm up: buffers grow to their working size
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
}

func BenchmarkWriteText(b *testing.B) {
	for _, size := range benchSizes {
		for _, impl := range []string{"ws", "fasthttp-websocket"} {
			b.Run("impl="+impl+"/size="+size.name, func(b *testing.B) { benchWrite(b, impl, size.n) })
		}
	}
}

func benchWrite(b *testing.B, impl string, size int) {
	c, rc := connect(b, impl)
	payload := pattern(size, 0)
	frameLen := 2 + len(payload)
	if size > 125 {
		frameLen += 2
	}
	// The producer may be `window` batches of about 256 KiB ahead of the
	// client: well inside MaxQueue, large enough to keep the writer busy.
	const window = 4
	perBatch := max(1, (256<<10)/frameLen)
	warmup := 2 * window * perBatch
	credits := make(chan struct{}, (max(b.N, warmup)+perBatch-1)/perBatch+1)
	buf := make([]byte, perBatch*frameLen)
	received := make(chan error, 1)
	run := func(n int) {
		go func() {
			for left := n; left > 0; {
				k := min(left, perBatch)
				if _, err := fullRead(rc, buf[:k*frameLen]); err != nil {
					received <- err
					return
				}
				left -= k
				credits <- struct{}{}
			}
			received <- nil
		}()
		for i := range n {
			if i%perBatch == 0 && i >= window*perBatch {
				<-credits
			}
			if err := c.writeText(payload); err != nil {
				b.Fatalf("message %d: %v", i, err)
			}
		}
		if err := <-received; err != nil {
			b.Fatal(err)
		}
		for len(credits) > 0 { // credits this run did not spend
			<-credits
		}
	}

	run(warmup) // warm up: the queue buffers grow to their working size
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	if string(buf[frameLen-len(payload):frameLen]) != string(payload) {
		b.Fatal("the client read something else than was written")
	}
}
