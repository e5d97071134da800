package ws

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"edgerelay/fastpath/park"
	"edgerelay/fastpath/tlsrec"
)

// Options bound one connection. Zero values take the defaults noted.
type Options struct {
	// MaxMessage is the largest data message accepted, in bytes; a larger
	// one closes the socket with 1009. Default 64 KiB.
	MaxMessage int
	// MaxQueue is the most bytes waiting to be written before the socket
	// is dropped as too slow. Default 2 MiB.
	MaxQueue int
	// OverflowCode is the close code sent when MaxQueue is exceeded.
	// Default 1008 (policy violation); the mailbox watch uses 1013.
	OverflowCode int
	// PingInterval is how often the server pings; a socket that has not
	// answered one ping with a pong by the next is dropped. 0 turns pings off.
	// An idle socket also gives back queue buffers above 64 KiB at the
	// next tick (without pings, as soon as its queue is empty).
	PingInterval time.Duration
	// SilenceTimeout, when set, replaces the pong rule: a socket from which
	// no frame at all (data, ping, pong) arrives for this long is closed
	// with 1001. Pings still go out every PingInterval so that a live peer
	// has something to answer.
	SilenceTimeout time.Duration
	// Detach serves the socket on a goroutine of its own over the raw
	// connection and returns fasthttp's buffers at once. Only for servers
	// with KeepHijackedConns set: otherwise fasthttp closes the
	// connection as soon as the hijack handler returns.
	Detach bool
	// ReadBufferSize sizes the buffered reader. Default 4 KiB; at least
	// minReadBuffer (a control frame's payload is read in place).
	ReadBufferSize int
	// CloseTimeout bounds how long a closing socket may take to flush its
	// queue and the close frame, and then to wait for the peer's close
	// (see linger in conn.go). Default 5 s.
	CloseTimeout time.Duration
	// Parker, with Detach, parks the idle sockets that Serve reads, so
	// that they hold no goroutine (see park.go). nil: Serve reads on one
	// goroutine until the socket ends.
	Parker *Parker
	// ParkAfter is how long a socket that received a message waits for
	// the next on its goroutine before it parks. Default DefaultParkAfter.
	ParkAfter time.Duration
	// InlineMessages says that Serve's onMessage never blocks (no wait
	// for room, no round trip): a parked plain socket's small messages
	// (up to 8 bytes of payload, like the mailbox watch's text ping) are
	// then handed to it on the parker's goroutine, as pings and pongs
	// are answered there (see wakeInline), instead of on a goroutine
	// started for them.
	InlineMessages bool
}

// Settings are Options with their defaults filled in, made once per kind
// of socket (NewSettings) and shared by every Conn of that kind: a Conn
// keeps a pointer, where a copy of the Options would take an idle
// socket's Conn into the next size class. Not to be changed once in use.
type Settings struct{ Options }

// NewSettings fills in o's defaults.
func NewSettings(o Options) *Settings {
	o.setDefaults()
	return &Settings{o}
}

func (o *Options) setDefaults() {
	if o.MaxMessage <= 0 {
		o.MaxMessage = 64 << 10
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = 2 << 20
	}
	if o.OverflowCode == 0 {
		o.OverflowCode = ClosePolicyViolation
	}
	if o.ReadBufferSize <= 0 {
		o.ReadBufferSize = 4 << 10
	}
	o.ReadBufferSize = max(o.ReadBufferSize, minReadBuffer)
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 5 * time.Second
	}
	if o.ParkAfter <= 0 {
		o.ParkAfter = DefaultParkAfter
	}
}

// Errors returned by Conn.
var (
	// ErrClosed: the connection is closing or closed; nothing more is queued.
	ErrClosed = errors.New("ws: connection closed")
	// ErrQueueFull: the send queue would exceed MaxQueue; the socket is
	// being dropped.
	ErrQueueFull = errors.New("ws: send queue full")
)

// CloseError reports the close code that ended a read, whether the peer
// sent it or the server chose it because of what the peer sent.
type CloseError struct {
	Code   int
	Reason string
	// ByPeer is true when the peer sent the close frame.
	ByPeer bool
}

func (e *CloseError) Error() string {
	who := "server"
	if e.ByPeer {
		who = "peer"
	}
	return fmt.Sprintf("ws: closed by %s with %d %s", who, e.Code, e.Reason)
}

// Conn is one server-side WebSocket. Exactly one goroutine reads (the one
// Upgrade hands the Conn to); any goroutine may queue messages; one writer
// goroutine owned by the Conn writes them.
type Conn struct {
	// The fields are ordered so that the struct packs without holes: an
	// idle socket keeps it, and its size class counts a million times.
	nc     net.Conn
	br     *bufio.Reader
	opts   *Settings
	remote net.Addr     // kept: nc must not be touched once serve has returned
	tcp    *net.TCPConn // the socket under nc's wrappers, nil if none (see linger)

	// Read side: used by the goroutine in ReadMessage, and by the writer's
	// linger once the handler no longer reads; readMu is held by either.
	readMu    sync.Mutex
	msg       []byte // reassembly buffer, reused for every message
	inputEnd  error  // why the input ended, once inputDone: every later ReadMessage returns it
	lastInput int64  // unix ns: when the drain last found input

	// Serving (Serve) and parking (park.go). onMessage, onEnd, serving
	// and parkable are set once by Serve.
	onMessage func(op int, payload []byte) bool
	onEnd     func(error)
	park      park.Reg
	silenceBy atomic.Int64 // unix ns: when a silent socket is closed (SilenceTimeout)

	// The Group the socket is in, and its neighbours in the Group's list;
	// under that Group's mu.
	group                *Group
	groupPrev, groupNext *Conn

	// Write side. pending collects framed bytes; the writer swaps it with
	// writing and flushes writing in one system call, so a burst of small
	// frames costs one write.
	mu       sync.Mutex
	pending  []byte
	spare    []byte // the writer's buffer between its runs
	inFlight int    // bytes of writing not yet written
	// timer is the socket's one timer (see fire): the ping tick, or the
	// silence's deadline of a parked socket when that comes first;
	// pingAt (unix ns) is when the next ping is due. Under mu.
	timer  *time.Timer
	pingAt int64
	// writeFn and readFn are c.writeLoop and c.readLoop, made once: a go
	// statement on a method call would allocate its closure each time.
	writeFn, readFn func()
	// now writes without waiting (see writeNow); nil where the connection
	// cannot (TLS, or not one of netlimit's). idleSince (unix ns, under
	// mu) is when the writer's role was last given up.
	now       sysConn
	idleSince int64
	// carry is a write at once that the socket did not take all of, from
	// carryFrom on: the writer goroutine finishes it before anything else
	// (a frame is never cut, not even by a close that drops the backlog).
	// Its rest counts in inFlight. Under mu.
	carry     []byte
	carryFrom int
	// drained is closed (and forgotten) after each write and when the
	// socket starts closing, waking every WaitQueued; made by the first
	// waiter, so that a socket nobody waits on allocates nothing per write.
	drained chan struct{}
	// done is closed when the writer has finished (writerDone); made by
	// the first Done, so that an idle socket keeps no channel. Under mu.
	done      chan struct{}
	closeBy   atomic.Int64 // unix ns: the close's deadline, CloseTimeout after Close
	sentAllAt atomic.Int64 // unix ns: when sentAll was set
	closeOnce sync.Once
	parkState atomic.Int32
	woke      atomic.Bool // the parker woke the socket: next resets gotData and readSinceWake
	shut      atomic.Bool // the socket is being torn down
	pongSeen  atomic.Bool
	// quitting: Close was called; what the peer sends from now on is read
	// only to find its close, and dropped (see linger). sentAll: the
	// writer has handed the close frame to the kernel.
	quitting, sentAll atomic.Bool
	closeCode         int32 // under mu
	hdr               [14]byte

	// Under readMu. misaligned: a read ended inside a frame, so what
	// follows cannot be parsed as frames (the drain discards it raw);
	// inputDone: the drain has ended (the peer's close, its EOF, or a
	// bound), nothing is left to read. gotData: a data message came
	// since the socket last woke. readSinceWake: a frame header came
	// since the parker last woke the socket; true from the start
	// (nothing woke it).
	misaligned, inputDone, serving, parkable, gotData, readSinceWake bool

	// Under mu. writerOn: a writer goroutine runs (it runs only while
	// something is queued, and for the close); writerDone: the last one
	// has finished. wroteData: a data message was queued since the last
	// ping tick. timerPing: the timer is set for the next ping (else for
	// the silence's deadline).
	closing, writerOn, writerDone, wroteData, timerPing bool
}

func newConn(nc net.Conn, opts *Settings) *Conn {
	// A TLS socket that may park sheds crypto/tls's buffers and keys
	// while parked: the record layer becomes tlsrec's at the first park.
	if opts.Parker != nil {
		if rc := tlsrec.Wrap(nc); rc != nil {
			nc = rc
		}
	}
	c := &Conn{
		nc:     nc,
		opts:   opts,
		remote: nc.RemoteAddr(),
		tcp:    tcpConnOf(nc),
		now:    sysConnOf(nc),
	}
	// With a parker the read buffer comes from its pool (where it goes
	// when the socket parks): a burst of upgrades reuses a few buffers
	// instead of leaving one per socket to the collector.
	if opts.Parker != nil {
		c.br = opts.Parker.GetReader(opts.ReadBufferSize, nc)
	} else {
		c.br = bufio.NewReaderSize(nc, opts.ReadBufferSize)
	}
	c.pongSeen.Store(true)
	c.writeFn, c.readFn = c.writeLoop, c.readLoop
	if opts.PingInterval > 0 {
		c.mu.Lock() // fire reads the timer under mu
		c.pingAt = time.Now().Add(opts.PingInterval).UnixNano()
		c.timerPing = true
		c.timer = time.AfterFunc(opts.PingInterval, c.fire)
		c.mu.Unlock()
	}
	return c
}

// RemoteAddr is the peer's address. It stays valid after the connection
// ended (the hijacked net.Conn does not: fasthttp reuses it).
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// ReadMessage returns the next text or binary message. The payload aliases
// a buffer reused by the next call. Pings are answered and pongs recorded
// here, so the reader must keep reading for the socket to stay alive. On a
// protocol violation the Conn queues the matching close frame and returns a
// *CloseError with ByPeer false; when the peer closes, the close is echoed
// and a *CloseError with ByPeer true is returned.
//
// Once the socket is closing (Close, from any goroutine), no more messages
// are returned: ReadMessage reads on only to find the peer's close (see
// linger) and returns when the close ends.
func (c *Conn) ReadMessage() (op int, payload []byte, err error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.inputDone {
		return 0, nil, c.inputEnd
	}
	if c.shut.Load() {
		// Torn down: nc may belong to someone else once serve returned.
		return 0, nil, ErrClosed
	}
	op, payload, err = c.readMessage(false)
	if err == errQuitting {
		err = c.drainInput()
	}
	return op, payload, err
}

// errQuitting ends readMessage at a frame boundary once the socket is
// closing, so that ReadMessage turns to draining.
var errQuitting = errors.New("ws: closing")

// readMessage reads the next message; with mayPark, errIdle when nothing
// came for the park's wait (see readHeader).
func (c *Conn) readMessage(mayPark bool) (op int, payload []byte, err error) {
	// A buffer grown by one huge message (an agent client may send up to
	// 16 MiB) is not kept for the socket's life; messages up to
	// maxKeptMessage (every channel and mailbox frame) reuse it forever.
	if cap(c.msg) > maxKeptMessage {
		c.msg = nil
	}
	c.msg = c.msg[:0]
	msgOp := -1
	for {
		if msgOp < 0 && c.quitting.Load() {
			return 0, nil, errQuitting
		}
		fin, frameOp, n, err := c.readHeader(mayPark && msgOp < 0)
		if err != nil {
			return 0, nil, err
		}
		if frameOp >= OpClose {
			if err := c.readControl(frameOp, fin, n); err != nil {
				return 0, nil, err
			}
			continue
		}
		switch {
		case frameOp == OpContinuation && msgOp < 0:
			return 0, nil, c.fail(CloseProtocolError, "continuation without a message")
		case frameOp != OpContinuation && msgOp >= 0:
			return 0, nil, c.fail(CloseProtocolError, "new message inside a fragmented one")
		case frameOp != OpContinuation && frameOp != OpText && frameOp != OpBinary:
			return 0, nil, c.fail(CloseProtocolError, "unknown opcode")
		}
		if frameOp != OpContinuation {
			msgOp = frameOp
		}
		// Written so that it cannot overflow: len(c.msg) <= MaxMessage.
		if n > uint64(c.opts.MaxMessage-len(c.msg)) {
			return 0, nil, c.fail(CloseTooBig, "message too big")
		}
		start := len(c.msg)
		c.msg = grow(c.msg, int(n))
		if err := c.readFull(c.msg[start:]); err != nil {
			return 0, nil, fmt.Errorf("ws: read payload: %w", err)
		}
		maskBytes(c.hdr[:4], c.msg[start:])
		if !fin {
			continue
		}
		if c.quitting.Load() {
			// Closed while it arrived: dropped, like everything after
			// the close (a phone's frame must not reach a computer
			// that is gone).
			return 0, nil, errQuitting
		}
		if msgOp == OpText && !utf8.Valid(c.msg) {
			return 0, nil, c.fail(CloseInvalidPayload, "text is not UTF-8")
		}
		c.gotData = true
		return msgOp, c.msg, nil
	}
}

// readHeader reads one frame header and leaves its mask key in c.hdr[:4].
//
// Its first two bytes are peeked, not read: a wait for the next frame that
// the linger cuts short (a deadline) leaves the stream at a frame boundary.
//
// With mayPark (a served socket that may park, between messages), a wait
// with nothing buffered is bounded by the park's: none when nothing but
// control frames came since the socket woke (the deadline is already past:
// only what is buffered, in bufio or under TLS, is read), ParkAfter
// otherwise. It ends with errIdle, nothing consumed.
func (c *Conn) readHeader(mayPark bool) (fin bool, op int, n uint64, err error) {
	var silenceBy time.Time // zero: no silence rule, or closing
	if c.opts.SilenceTimeout > 0 && !c.quitting.Load() {
		silenceBy = time.Now().Add(c.opts.SilenceTimeout)
		c.silenceBy.Store(silenceBy.UnixNano())
	}
	idle := mayPark && c.br.Buffered() == 0 && !c.quitting.Load()
	if !silenceBy.IsZero() || idle {
		by := silenceBy
		if idle {
			// Past: only what is buffered is read. Not for the first
			// frame after a wake: the parker saw the kernel's input,
			// which a past deadline would never read (an EOF would wake
			// the socket again and again).
			wait := time.Unix(1, 0)
			if c.gotData || !c.readSinceWake {
				wait = time.Now().Add(c.opts.ParkAfter)
			}
			if by.IsZero() || wait.Before(by) {
				by = wait
			}
		}
		if err := c.setReadDeadline(by); err != nil {
			return false, 0, 0, err
		}
	}
	p, err := c.br.Peek(2)
	for idle && err != nil && isTimeout(err) && !c.quitting.Load() && !c.shut.Load() {
		if !silenceBy.IsZero() && !time.Now().Before(silenceBy) {
			break // silent: closed below, as without parking
		}
		if c.br.Buffered() == 0 {
			return false, 0, 0, errIdle
		}
		// Part of a header came: it is waited for like any frame.
		idle = false
		if err := c.setReadDeadline(silenceBy); err != nil {
			return false, 0, 0, err
		}
		p, err = c.br.Peek(2)
	}
	if err == nil {
		c.readSinceWake = true
	}
	if idle && err == nil {
		// The frame that starts here has the silence's deadline, or
		// none; a close meanwhile bounds it by the close's (readFull).
		by := silenceBy
		if c.quitting.Load() {
			by = time.Unix(0, c.closeBy.Load())
		}
		_ = c.nc.SetReadDeadline(by)
	}
	if err != nil {
		if c.quitting.Load() && isTimeout(err) && !c.shut.Load() {
			return false, 0, 0, errQuitting // nothing consumed: drain from here
		}
		c.noteTimeout(err)
		return false, 0, 0, fmt.Errorf("ws: read header: %w", err)
	}
	h := c.hdr[4:6]
	copy(h, p)
	_, _ = c.br.Discard(2)
	fin, op = h[0]&0x80 != 0, int(h[0]&0x0f)
	if h[0]&0x70 != 0 {
		return false, 0, 0, c.fail(CloseProtocolError, "reserved bits set")
	}
	if h[1]&0x80 == 0 {
		return false, 0, 0, c.fail(CloseProtocolError, "client frame not masked")
	}
	n = uint64(h[1] & 0x7f)
	switch n {
	case 126:
		if err := c.readFull(c.hdr[6:8]); err != nil {
			return false, 0, 0, fmt.Errorf("ws: read length: %w", err)
		}
		n = uint64(binary.BigEndian.Uint16(c.hdr[6:8]))
	case 127:
		if err := c.readFull(c.hdr[6:14]); err != nil {
			return false, 0, 0, fmt.Errorf("ws: read length: %w", err)
		}
		n = binary.BigEndian.Uint64(c.hdr[6:14])
		if n>>63 != 0 {
			// RFC 6455 5.2: the most significant bit MUST be 0.
			return false, 0, 0, c.fail(CloseProtocolError, "length has its high bit set")
		}
	}
	if err := c.readFull(c.hdr[:4]); err != nil {
		return false, 0, 0, fmt.Errorf("ws: read mask: %w", err)
	}
	return fin, op, n, nil
}

// setReadDeadline sets the read deadline for the wait for a header (the
// zero time: none). A teardown that set a past deadline just before must
// not be undone by the new one (see shutdownSocket), nor the wake of the
// linger (see linger): ErrClosed and errQuitting tell the reader.
func (c *Conn) setReadDeadline(by time.Time) error {
	_ = c.nc.SetReadDeadline(by)
	if c.shut.Load() {
		return ErrClosed
	}
	if c.quitting.Load() {
		return errQuitting
	}
	return nil
}

// readFull fills p from the socket. The silence deadline set in readHeader
// covers the whole frame: a peer that goes quiet in the middle of one is
// as silent as one that sends nothing, and is closed with 1001 too (not
// with the 1000 that finish would choose once the reader returns).
//
// Once closing, a deadline inside a frame (the wake of the linger, or the
// drain's polling) is moved to the close's deadline and the read goes on:
// the stream must stay aligned to find the peer's close.
func (c *Conn) readFull(p []byte) error {
	n, err := io.ReadFull(c.br, p)
	for c.readsOn(err) {
		var m int
		m, err = io.ReadFull(c.br, p[n:])
		n += m
	}
	if err != nil {
		c.misaligned = true
		c.noteTimeout(err)
	}
	return err
}

// peekFull is readFull for a control frame's payload: it is left in the
// read buffer (at most 125 bytes, which every buffer holds: see
// minReadBuffer) instead of being copied into a field of the Conn, and
// stays valid until the next read.
func (c *Conn) peekFull(n int) ([]byte, error) {
	p, err := c.br.Peek(n)
	for c.readsOn(err) {
		p, err = c.br.Peek(n)
	}
	if err != nil {
		c.misaligned = true
		c.noteTimeout(err)
		return nil, err
	}
	_, _ = c.br.Discard(n) // buffered: nothing is read, p stays as it is
	return p, nil
}

// readsOn reports whether a read inside a frame that ended with err goes
// on: a deadline met once closing, before the close's own, which it
// then sets.
func (c *Conn) readsOn(err error) bool {
	if err == nil || !c.quitting.Load() || !isTimeout(err) || c.shut.Load() {
		return false
	}
	by := time.Unix(0, c.closeBy.Load())
	if !time.Now().Before(by) {
		return false
	}
	_ = c.nc.SetReadDeadline(by)
	return true
}

// noteTimeout closes a silent socket with 1001 when err is the silence
// deadline.
func (c *Conn) noteTimeout(err error) {
	if c.opts.SilenceTimeout > 0 && isTimeout(err) && !c.shut.Load() {
		c.Close(CloseGoingAway, "silent too long")
	}
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error // declared here: it escapes, and must cost nothing per frame
	return errors.As(err, &ne) && ne.Timeout()
}

// readControl handles a ping, pong or close frame of length n.
func (c *Conn) readControl(op int, fin bool, n uint64) error {
	if !fin || n > 125 {
		return c.fail(CloseProtocolError, "bad control frame")
	}
	p, err := c.peekFull(int(n))
	if err != nil {
		return fmt.Errorf("ws: read control: %w", err)
	}
	maskBytes(c.hdr[:4], p)
	switch op {
	case OpPing:
		// A pong that does not fit the queue means the peer is not
		// reading; the overflow already drops the socket. Bounded like
		// data: a peer that sends pings and never reads must not grow
		// the queue without limit.
		_ = c.queueFrame(OpPong, p, true)
	case OpPong:
		c.pongSeen.Store(true)
	case OpClose:
		code, reason := CloseNoStatus, ""
		if n >= 2 {
			code, reason = int(binary.BigEndian.Uint16(p)), string(p[2:])
		}
		if n == 1 || (n >= 2 && !validReceivedCode(code)) {
			return c.fail(CloseProtocolError, "bad close code")
		}
		if !utf8.ValidString(reason) {
			return c.fail(CloseInvalidPayload, "close reason is not UTF-8")
		}
		echo := code
		if code == CloseNoStatus {
			echo = CloseNormal
		}
		c.Close(echo, "")
		ce := &CloseError{Code: code, Reason: reason, ByPeer: true}
		c.inputDone, c.inputEnd = true, ce // nothing follows the peer's close
		return ce
	default:
		return c.fail(CloseProtocolError, "unknown control opcode")
	}
	return nil
}

func validReceivedCode(code int) bool {
	switch {
	case code >= 3000 && code <= 4999:
		return true
	case code < 1000 || code >= 1016:
		return false
	}
	// 1004 is reserved; 1005, 1006 and 1015 must never be on the wire.
	return code != 1004 && code != 1005 && code != 1006 && code != 1015
}

// fail closes the socket with code because of what the peer sent.
func (c *Conn) fail(code int, reason string) error {
	c.misaligned = true // a frame refused part-way: its rest is unread
	c.Close(code, reason)
	return &CloseError{Code: code, Reason: reason}
}

// WriteText queues payload as one text message. It copies payload, so the
// caller may reuse it at once. ErrQueueFull means the socket is now being
// dropped with the overflow code.
func (c *Conn) WriteText(payload []byte) error { return c.queueFrame(OpText, payload, true) }

// WriteBinary queues payload as one binary message, like WriteText.
func (c *Conn) WriteBinary(payload []byte) error { return c.queueFrame(OpBinary, payload, true) }

// WaitQueued blocks until fewer than below bytes wait to be written, so
// that a producer with a large backlog to send (a watch replay) can pace
// itself instead of overflowing the queue. ErrClosed once the socket is
// closing or closed (without waiting for a stuck write to end); ctx's
// error when ctx ends first. Any number of goroutines may wait.
func (c *Conn) WaitQueued(ctx context.Context, below int) error {
	for {
		c.mu.Lock()
		queued, closing := len(c.pending)+c.inFlight, c.closing
		var drained chan struct{}
		if !closing && queued >= below {
			if c.drained == nil {
				c.drained = make(chan struct{})
			}
			drained = c.drained
		}
		c.mu.Unlock()
		if closing {
			return ErrClosed
		}
		if queued < below {
			return nil
		}
		select {
		case <-drained:
		case <-c.Done():
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// wakeWaitersLocked wakes every WaitQueued; c.mu is held.
func (c *Conn) wakeWaitersLocked() {
	if c.drained != nil {
		close(c.drained)
		c.drained = nil
	}
}

// Queued is the number of bytes waiting to be written.
func (c *Conn) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) + c.inFlight
}

func (c *Conn) queueFrame(op int, payload []byte, bounded bool) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	if bounded && len(c.pending)+c.inFlight+len(payload)+10 > c.opts.MaxQueue {
		c.mu.Unlock()
		c.close(c.opts.OverflowCode, "send queue full", true)
		return ErrQueueFull
	}
	c.pending = appendFrame(c.pending, op, payload)
	if op < OpClose {
		c.wroteData = true
	}
	start := c.startWriterLocked()
	c.mu.Unlock()
	if start {
		c.startWriter()
	}
	return nil
}

// startWriterLocked reports whether the caller must start a writer: none
// runs and the last has not finished. c.mu is held.
func (c *Conn) startWriterLocked() bool {
	if c.writerOn || c.writerDone {
		return false
	}
	c.writerOn = true
	return true
}

// kick starts a writer unless one runs.
func (c *Conn) kick() {
	c.mu.Lock()
	start := c.startWriterLocked()
	c.mu.Unlock()
	if start {
		c.startWriter()
	}
}

// startWriter runs the writer's role, which the caller has taken
// (startWriterLocked): on this goroutine where it can (writeNow), else on
// a goroutine of its own.
func (c *Conn) startWriter() {
	if c.now != nil && c.writeNow() {
		return
	}
	go c.writeFn()
}

// writeAtOnceAfter is how long a socket's writer must have been idle for
// a frame to be written at once by the goroutine that queued it. A socket
// that a stream of frames keeps busy leaves them to its writer goroutine,
// which gathers what queued while it was starting or writing into one
// write; a socket woken after a pause (a delivery to a watch, a ping's
// pong) has nothing to gather, and starting a goroutine for it costs
// more than the write: the wake of an idle P's thread, a context switch,
// and the frame moving to another core.
const writeAtOnceAfter = time.Millisecond

// writeAtOnceMax is the most a write at once takes: what a fresh TCP
// socket's send buffer holds whole (Linux's default, 16 KiB). Bigger
// queues go to the writer goroutine, whose write a slow peer may hold.
const writeAtOnceMax = 16 << 10

// sysConn writes what a socket's buffer takes now and reads what it
// holds now, never waiting: netlimit's connections (plain TCP).
type sysConn interface {
	TryWrite(b []byte) (int, error)
	TryRead(b []byte, peek bool) (int, error)
}

// sysConnOf is nc's sysConn, also under fasthttp's hijacked conn (whose
// reads and writes go straight to the connection below), or nil: TLS
// cannot leave a record half written, nor be read but whole records.
func sysConnOf(nc net.Conn) sysConn {
	if u, ok := nc.(interface{ UnsafeConn() net.Conn }); ok {
		nc = u.UnsafeConn()
	}
	t, _ := nc.(sysConn)
	return t
}

// writeNow is the writer's role run on the goroutine that queued a frame,
// for a socket whose writer has been idle for writeAtOnceAfter: what is
// queued (at most writeAtOnceMax) goes to the kernel at once, without
// waiting for room. True when all of it went and the role is given up;
// false leaves the role to a writer goroutine (not idle long enough, too
// much queued, closing, the socket's buffer full, more queued meanwhile,
// or a failed write, which that goroutine meets again and ends the
// socket on).
func (c *Conn) writeNow() bool {
	c.mu.Lock()
	if c.closing || len(c.pending) == 0 || len(c.pending) > writeAtOnceMax || c.shut.Load() ||
		time.Now().UnixNano()-c.idleSince < int64(writeAtOnceAfter) {
		c.mu.Unlock()
		return false
	}
	writing, _ := c.takeQueuedLocked() // no carry: the role was free
	c.mu.Unlock()
	n, err := c.now.TryWrite(writing)
	c.mu.Lock()
	if err != nil || n < len(writing) {
		c.carry, c.carryFrom = writing, n
		c.inFlight = len(writing) - n
		c.mu.Unlock()
		return false
	}
	c.wroteLocked(writing)
	if len(c.pending) > 0 || c.closing {
		// More to write, or a close (which leaves its sequence to the
		// writer that holds the role) came meanwhile.
		c.mu.Unlock()
		return false
	}
	c.writerOn = false
	c.idleSince = time.Now().UnixNano()
	c.mu.Unlock()
	c.writerIdle()
	return true
}

// takeQueuedLocked hands the writer what it writes next, writing[from:]:
// the rest of a write at once (carry), else the queue, whose buffer the
// spare replaces. c.mu is held.
func (c *Conn) takeQueuedLocked() (writing []byte, from int) {
	if c.carry != nil {
		writing, from = c.carry, c.carryFrom
		c.carry = nil
		return writing, from // inFlight counts its rest already
	}
	writing = c.spare
	c.spare = nil
	writing, c.pending = c.pending, writing[:0]
	c.inFlight = len(writing)
	return writing, 0
}

// wroteLocked ends the write of writing: waiters wake, and its buffer
// becomes the spare. c.mu is held.
func (c *Conn) wroteLocked(writing []byte) {
	c.inFlight = 0
	c.wakeWaitersLocked()
	// Without pings, big buffers go back as soon as the queue is empty
	// (with pings, at the tick, so that bursts do not regrow them each
	// time). Never while more is queued: a socket under steady load would
	// grow a new buffer for every write.
	if c.opts.PingInterval == 0 && len(c.pending) == 0 {
		if cap(c.pending) > maxIdleBuffer {
			c.pending = nil
		}
		if cap(writing) > maxIdleBuffer {
			writing = nil
		}
	}
	c.spare = writing[:0]
}

// Close queues a close frame with code and reason after what is already
// queued (or instead of it, when the queue overflowed) and ends the
// connection once it is written or CloseTimeout passes. It is safe to call
// from any goroutine, any number of times; the first code wins.
func (c *Conn) Close(code int, reason string) { c.close(code, reason, false) }

// close is Close; dropBacklog discards what is queued and not yet being
// written. Only the overflow sets it: a socket dropped for being slow does
// not get its backlog, only the close frame after whatever write is in
// progress. (Deciding this by comparing code with OverflowCode would drop
// the backlog of an ordinary Close that happens to use the same code.)
func (c *Conn) close(code int, reason string, dropBacklog bool) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		if dropBacklog {
			c.pending = c.pending[:0]
		}
		c.closing, c.closeCode = true, int32(code)
		by := time.Now().Add(c.opts.CloseTimeout)
		c.closeBy.Store(by.UnixNano())
		c.quitting.Store(true)
		var body [125]byte
		binary.BigEndian.PutUint16(body[:2], uint16(code))
		m := copy(body[2:], reason)
		if m < len(reason) {
			// Cut on a rune boundary: the peer fails a close frame whose
			// reason is not valid UTF-8.
			for m > 0 && !utf8.RuneStart(reason[m]) {
				m--
			}
		}
		c.pending = appendFrame(c.pending, OpClose, body[:2+m])
		c.wakeWaitersLocked()
		c.mu.Unlock()
		// Bound everything that follows: a peer that stopped reading
		// cannot hold the writer (and so the socket) past the deadline.
		_ = c.nc.SetWriteDeadline(by)
		c.kick()
		c.wake() // a parked reader reads on to find the peer's close
	})
}

// Abort ends the connection at once without a close frame, for a peer that
// stopped answering pings.
func (c *Conn) Abort() {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing, c.closeCode = true, 0
		c.pending = c.pending[:0]
		c.wakeWaitersLocked()
		c.mu.Unlock()
		c.shutdownSocket()
		c.kick()
		c.wake() // a parked reader ends
	})
}

// CloseCode is the code the server closed with, 0 while open or when the
// connection was aborted.
func (c *Conn) CloseCode() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.closeCode)
}

// Done is closed when the writer has finished and the socket is closed.
func (c *Conn) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.writerDone {
			close(c.done)
		}
	}
	return c.done
}

// finish runs when the reading goroutine returns: the socket is closing
// (1000 unless a code was chosen before) and the hijack handler waits for
// the writer so the close frame is not cut off.
func (c *Conn) finish() {
	c.Close(CloseNormal, "")
	<-c.Done()
}

// The linger. Write returns once the kernel has the bytes, not the peer:
// on loopback the whole 2 MiB queue fits the send buffer at once. Closing
// a socket whose input holds unread bytes (a busy peer's frames in
// flight) makes the kernel answer with a reset and throw away what it has
// not sent yet, the last frames and the close frame with them (seen: busy
// phones never got their 1001). So once the close frame is written, the
// write side is shut (the peer reads EOF after the close frame) and the
// input is read and dropped until the peer's close frame or its EOF; only
// then is the socket closed, and nothing is left unsent. A peer that does
// not answer holds the socket no longer than CloseTimeout after Close, and
// no longer than drainQuiet once its kernel has acknowledged every byte
// (it has the close frame; data it has not read survives a reset) and it
// has sent nothing. A handler still in ReadMessage does the reading
// itself; once it is out, the writer reads, holding readMu.
const (
	drainPoll     = 50 * time.Millisecond  // how often a quiet drain checks the peer's acknowledgements
	drainQuiet    = 250 * time.Millisecond // silence of a peer that has everything, after which it is not waited for
	maxDrainBytes = 4 << 20                // bytes dropped before a flooding peer is cut off
)

// errDrainEnded: the drain stopped at one of its bounds.
var errDrainEnded = errors.New("ws: closed without the peer's close")

// linger is the writer's end of a close whose frame is written.
func (c *Conn) linger() {
	if c.shut.Load() {
		return // aborted: nothing to deliver
	}
	c.sentAllAt.Store(time.Now().UnixNano())
	c.sentAll.Store(true)
	if c.tcp != nil {
		_ = c.tcp.CloseWrite()
	}
	// Wake a reader waiting for the next frame without a deadline (or
	// under the silence's), so that it polls; one inside a frame reads on
	// (readFull).
	_ = c.nc.SetReadDeadline(time.Now())
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if !c.inputDone {
		c.acquireReader() // parked: the drain needs a buffer
	}
	_ = c.drainInput()
	c.shutdownSocket() // under readMu: no ReadMessage starts on a closed nc
}

// drainInput reads and drops what the peer sends after the close until its
// close frame, its EOF or a bound (see linger); readMu is held. It returns
// the peer's *CloseError when that came, else why the drain ended. It
// runs once: later calls return the same.
func (c *Conn) drainInput() error {
	if c.inputDone {
		return c.inputEnd
	}
	err := c.dropFrames()
	c.inputDone, c.inputEnd = true, err
	return err
}

func (c *Conn) dropFrames() error {
	left := maxDrainBytes
	for {
		if err := c.awaitInput(); err != nil {
			return err
		}
		if c.misaligned {
			k := min(c.br.Buffered(), left)
			if k == 0 {
				return errDrainEnded
			}
			_, _ = c.br.Discard(k)
			left -= k
			continue
		}
		fin, op, n, err := c.readHeader(false)
		switch {
		case err == errQuitting:
			continue // a wake-up before the header: nothing was consumed
		case err != nil:
			return err
		case op >= OpClose:
			if err := c.readControl(op, fin, n); err != nil {
				return err // the peer's close, or a broken control frame
			}
			continue
		case n > uint64(left):
			return errDrainEnded
		}
		left -= int(n)
		if err := c.skip(int(n)); err != nil {
			return err
		}
	}
}

// skip drops n payload bytes, reading on past a wake-up like readFull.
func (c *Conn) skip(n int) error {
	for n > 0 {
		k, err := c.br.Discard(n)
		n -= k
		if err == nil {
			return nil
		}
		by := time.Unix(0, c.closeBy.Load())
		if !isTimeout(err) || !time.Now().Before(by) {
			c.misaligned = true
			return err
		}
		_ = c.nc.SetReadDeadline(by)
	}
	return nil
}

// awaitInput waits until the peer has sent something, every drainPoll
// checking whether the drain has reached a bound: the close's deadline,
// or a peer that has everything written and keeps quiet.
func (c *Conn) awaitInput() error {
	by := time.Unix(0, c.closeBy.Load())
	for c.br.Buffered() == 0 {
		now := time.Now()
		if !now.Before(by) {
			return errDrainEnded
		}
		if c.sentAll.Load() {
			since := max(c.sentAllAt.Load(), c.lastInput)
			if now.UnixNano()-since >= int64(drainQuiet) && c.peerHasAll() {
				return errDrainEnded
			}
		}
		next := now.Add(drainPoll)
		if by.Before(next) {
			next = by
		}
		_ = c.nc.SetReadDeadline(next)
		if _, err := c.br.Peek(1); err != nil && !isTimeout(err) {
			return err // EOF: the peer is done
		}
	}
	c.lastInput = time.Now().UnixNano()
	_ = c.nc.SetReadDeadline(by) // the frame that starts here may take until then
	return nil
}

// peerHasAll reports whether the peer's kernel has acknowledged every
// byte written; true where that cannot be known.
func (c *Conn) peerHasAll() bool {
	if c.tcp == nil {
		return true
	}
	n, ok := unacked(c.tcp)
	return !ok || n == 0
}

// tcpConnOf finds the TCP socket under nc's wrappers (fasthttp's hijacked
// conn, tls.Conn, netlimit's conn), or nil.
func tcpConnOf(nc net.Conn) *net.TCPConn {
	for range 5 {
		switch v := nc.(type) {
		case *net.TCPConn:
			return v
		case interface{ UnsafeConn() net.Conn }:
			nc = v.UnsafeConn()
		case interface{ NetConn() net.Conn }:
			nc = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// minReadBuffer is the smallest read buffer: one that holds a control
// frame's payload (125 bytes) once its header is read (see peekFull).
const minReadBuffer = 128

// maxKeptMessage is the largest read buffer a socket keeps between
// messages.
const maxKeptMessage = 1 << 20

// maxIdleBuffer is the largest queue buffer a socket keeps while idle.
const maxIdleBuffer = 64 << 10

// writeLoop writes what is queued and returns when the queue is empty (a
// later queueFrame starts another), or once the socket is closed: then it
// flushes the close frame, lingers (see linger) and finishes the Conn.
func (c *Conn) writeLoop() {
	for {
		c.mu.Lock()
		if len(c.pending) == 0 && c.carry == nil && !c.closing {
			c.writerOn = false
			c.idleSince = time.Now().UnixNano()
			c.mu.Unlock()
			c.writerIdle()
			return
		}
		writing, from := c.takeQueuedLocked()
		closing := c.closing
		c.mu.Unlock()
		if len(writing) > from {
			_, err := c.nc.Write(writing[from:])
			c.mu.Lock()
			if err != nil {
				// The socket is gone: waiters must see it closing, not a
				// queue that merely emptied (Abort below comes after
				// they wake).
				c.closing = true
			}
			c.wroteLocked(writing)
			c.mu.Unlock()
			if err != nil {
				c.Abort()
				c.endWriter()
				return
			}
		} else {
			c.mu.Lock()
			c.spare = writing
			c.mu.Unlock()
		}
		if closing {
			c.mu.Lock()
			more := len(c.pending) > 0 || c.carry != nil
			c.mu.Unlock()
			if !more {
				c.linger()
				c.endWriter()
				return
			}
		}
	}
}

// endWriter finishes the Conn once its last write is done.
func (c *Conn) endWriter() {
	c.shutdownSocket()
	c.mu.Lock()
	c.writerOn, c.writerDone = false, true
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.done != nil {
		close(c.done)
	}
	c.mu.Unlock()
}

// fire is the socket's timer. Set for the ping tick: a socket that did
// not answer the last ping is aborted (without SilenceTimeout), queue
// buffers of a socket that sent no data since the last tick go back, and
// the next ping is queued. Set for the silence's deadline: a socket still
// parked past it is closed with 1001 (one that woke meanwhile has its
// reader's deadline instead). Either way the timer is set again for what
// comes next.
func (c *Conn) fire() {
	now := time.Now().UnixNano()
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	if !c.timerPing {
		if c.parkState.Load() == stateParked && now >= c.silenceBy.Load() {
			c.mu.Unlock()
			c.Close(CloseGoingAway, "silent too long")
			return
		}
		c.scheduleLocked(now)
		c.mu.Unlock()
		return
	}
	if !c.pongSeen.Swap(false) && c.opts.SilenceTimeout == 0 {
		c.mu.Unlock()
		c.Abort()
		return
	}
	// Big buffers go back once per interval: an idle socket holds little
	// memory, a busy one regrows its spare at most once per interval. A
	// socket that queued no data for a whole interval keeps none.
	limit := maxIdleBuffer
	if !c.wroteData {
		limit = 0
	}
	c.wroteData = false
	if len(c.pending) == 0 && cap(c.pending) > limit {
		c.pending = nil
	}
	if cap(c.spare) > limit {
		c.spare = nil
	}
	c.pingAt = now + int64(c.opts.PingInterval)
	c.scheduleLocked(now)
	c.mu.Unlock()
	_ = c.queueFrame(OpPing, nil, false)
}

// scheduleLocked sets the timer for what comes first: the next ping, or
// the silence's deadline of a parked socket. c.mu is held. One timer
// instead of two: an idle mailbox socket keeps a single runtime timer.
func (c *Conn) scheduleLocked(now int64) {
	wait, ping := time.Duration(-1), false
	if c.opts.PingInterval > 0 {
		// Bounded by the interval: a wall clock set back does not hold
		// the next ping (the timer itself runs on the monotonic clock).
		wait, ping = min(max(time.Duration(c.pingAt-now), 0), c.opts.PingInterval), true
	}
	if c.opts.SilenceTimeout > 0 && c.parkState.Load() == stateParked {
		if left := max(time.Duration(c.silenceBy.Load()-now), 0); wait < 0 || left < wait {
			wait, ping = left, false
		}
	}
	if wait < 0 {
		return
	}
	c.timerPing = ping
	if c.timer == nil {
		c.timer = time.AfterFunc(wait, c.fire)
	} else {
		c.timer.Reset(wait)
	}
}

// shutdownSocket ends the TCP connection. A deadline in the past wakes the
// reading goroutine even when Close is deferred by the HTTP server (fasthttp
// closes a hijacked connection only after its handler returns).
func (c *Conn) shutdownSocket() {
	if c.shut.Swap(true) {
		return // torn down already, or being torn down by another goroutine
	}
	c.park.Unregister() // before the fd can go to another socket
	_ = c.nc.SetDeadline(time.Unix(1, 0))
	_ = c.nc.Close()
}

// appendFrame appends one unmasked server frame.
func appendFrame(dst []byte, op int, payload []byte) []byte {
	n := len(payload)
	switch {
	case n < 126:
		dst = append(dst, 0x80|byte(op), byte(n))
	case n <= 0xffff:
		dst = append(dst, 0x80|byte(op), 126, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0x80|byte(op), 127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	return append(dst, payload...)
}

// grow extends b by n bytes, reusing its capacity when it can.
func grow(b []byte, n int) []byte {
	if need := len(b) + n; need <= cap(b) {
		return b[:need]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// maskBytes XORs p with the 4-byte mask key, eight bytes at a time.
func maskBytes(key []byte, p []byte) {
	k := uint64(binary.LittleEndian.Uint32(key))
	k |= k << 32
	i := 0
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], binary.LittleEndian.Uint64(p[i:])^k)
	}
	for ; i < len(p); i++ {
		p[i] ^= key[i&3]
	}
}
