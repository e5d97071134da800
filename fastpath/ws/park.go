package ws

import (
	"errors"
	"time"

	"unicode/utf8"

	"edgerelay/fastpath/park"
	"edgerelay/fastpath/tlsrec"
)

// Parking idle sockets. Most sockets of a relay are idle: a device's watch,
// a computer's control socket, a phone's channel wait for minutes between
// frames. A goroutine blocked in a read holds its stack (several KiB) the
// whole time; a million idle sockets would hold gigabytes. With a Parker
// (Options.Parker, Linux), a socket served by Conn.Serve gives its reading
// goroutine back when it has nothing to read: its read buffer returns to a
// pool and the socket waits in the parker's epoll set. Readability, a
// close or a timer (ping, silence) wakes it onto a fresh goroutine, which
// reads what came and parks again. Writes never need the reader: the
// writer goroutine runs only while something is queued, and pings come
// from a timer. What an idle socket keeps is the Conn itself, its timer and
// the kernel's buffers.
//
// When a socket parks: at once when nothing has come since it last woke
// but control frames (a pong answering the server's ping), else after
// ParkAfter without input, and only at a message boundary (a fragmented
// message in progress holds its goroutine) with nothing buffered.

// A Parker holds parked sockets: a park.Set (one epoll set and its
// goroutine) shared by every service.
type Parker = park.Set

// NewParker starts a Parker; ErrParkUnsupported where this build has none.
func NewParker() (*Parker, error) { return park.New() }

// ErrParkUnsupported: this build cannot park sockets (not Linux, or built
// with the nopark tag); serve them without a Parker.
var ErrParkUnsupported = park.ErrUnsupported

// DefaultParkAfter is how long a socket that received data waits on its
// goroutine for more before it parks.
const DefaultParkAfter = time.Second

// The reading states of a served socket.
const (
	stateReading int32 = iota // a goroutine reads (or is about to)
	stateParked               // no goroutine: the parker or a close wakes it
	stateEnded                // reading is over
)

// errIdle: nothing came for the park's wait; the stream is at a message
// boundary with nothing buffered.
var errIdle = errors.New("ws: idle")

// Serve hands the socket's reading to the Conn: onMessage gets each text
// or binary message (the payload aliases a buffer reused once it returns)
// and returns false once it has closed the socket itself; onEnd runs once,
// when reading has ended, with why (what ReadMessage would have returned:
// the peer's *CloseError, the server's for a protocol error, or the
// connection's error; nil when onMessage returned false), before the Conn
// finishes. Call it at most once, as the last
// thing the function given to Upgrade does.
//
// With Options.Parker and Detach, Serve returns as soon as the socket is
// idle, and the socket lives on without a goroutine: onMessage and onEnd
// then run on goroutines of their own. Otherwise Serve returns once the
// socket has ended. onMessage may block (a bounded queue waiting for
// room): that holds this socket's reading only.
func (c *Conn) Serve(onMessage func(op int, payload []byte) bool, onEnd func(error)) {
	// Under readMu: a close before Serve (another goroutine's) may have
	// the writer's linger reading already.
	c.readMu.Lock()
	c.serving, c.readSinceWake = true, true
	c.onMessage, c.onEnd = onMessage, onEnd
	if c.opts.Detach && c.opts.Parker != nil && c.tcp != nil && !c.shut.Load() {
		if rc, err := c.tcp.SyscallConn(); err == nil {
			c.parkable = c.park.Register(c.opts.Parker, rc, c.wakeFromSet)
		}
	}
	c.readMu.Unlock()
	c.readLoop()
}

// errParked: the socket parked; its reading goroutine returns.
var errParked = errors.New("ws: parked")

// readLoop reads messages into onMessage until the socket parks or ends.
func (c *Conn) readLoop() {
	for {
		op, p, err := c.next()
		if err == errParked {
			return
		}
		if err != nil || !c.onMessage(op, p) {
			c.endServe(err)
			return
		}
	}
}

// endServe ends a served socket's reading: why (err) goes to onEnd, and
// the Conn finishes.
func (c *Conn) endServe(err error) {
	c.parkState.Store(stateEnded)
	c.onEnd(err)
	c.finish()
}

// next is ReadMessage for Serve: errParked once the socket has parked.
func (c *Conn) next() (op int, payload []byte, err error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		if c.inputDone {
			return 0, nil, c.inputEnd
		}
		if c.shut.Load() {
			return 0, nil, ErrClosed
		}
		c.acquireReader()
		if c.woke.Swap(false) {
			c.gotData, c.readSinceWake = false, false
		}
		op, payload, err = c.readMessage(c.parkable)
		switch err {
		case errQuitting:
			err = c.drainInput()
		case errIdle:
			if c.parkNow() {
				return 0, nil, errParked
			}
			continue // closed meanwhile: read on to the close
		}
		return op, payload, err
	}
}

// acquireReader gives a parked socket its read buffer back; readMu is
// held.
func (c *Conn) acquireReader() {
	if c.br == nil {
		c.br = c.opts.Parker.GetReader(c.opts.ReadBufferSize, c.nc)
	}
}

// maxParkedMessage is the largest message buffer a parked socket keeps
// (a watch's "ping"); bigger ones are dropped and regrown on the next
// message after a wake.
const maxParkedMessage = 256

// parkNow parks the socket (readMu held, nothing buffered): its buffers go
// back and it waits in the parker's set. False when it cannot park (it is
// closing, or the set refused it): the caller reads on.
func (c *Conn) parkNow() bool {
	c.opts.Parker.PutReader(c.br)
	c.br = nil
	if rc, ok := c.nc.(*tlsrec.Conn); ok {
		rc.Idle() // its record buffer and keys go too
	}
	if cap(c.msg) > maxParkedMessage {
		c.msg = nil
	}
	return c.repark()
}

// repark waits in the parker's set again (readMu held, nothing buffered,
// no read buffer); false when it cannot (see parkNow).
func (c *Conn) repark() bool {
	c.parkState.Store(stateParked)
	// A close sets quitting (or shut) and then wakes a parked reader: one
	// of the two sees the other, and exactly one wins the swap back.
	c.opts.Parker.NoteParked(1)
	if c.quitting.Load() || c.shut.Load() || !c.armSilence() || c.park.Arm() != nil {
		if c.parkState.CompareAndSwap(stateParked, stateReading) {
			c.opts.Parker.NoteParked(-1)
			return false
		}
		return true // a close took it over (and counted it out)
	}
	return true
}

// writerIdle is the writer's end with nothing queued: a TLS socket whose
// reader is parked gives back its write keys too (a delivery to a parked
// watch would otherwise keep them until the socket next parks).
func (c *Conn) writerIdle() {
	if c.parkState.Load() != stateParked {
		return
	}
	if rc, ok := c.nc.(*tlsrec.Conn); ok {
		rc.IdleWrite()
	}
}

// armSilence sets the socket's timer (see fire) for the silence's
// deadline, should that come before the next ping, so that a socket that
// stays parked past it is closed with 1001 at that instant; false when it
// has passed.
func (c *Conn) armSilence() bool {
	if c.opts.SilenceTimeout <= 0 {
		return true
	}
	now := time.Now().UnixNano()
	if c.silenceBy.Load() <= now {
		return false
	}
	c.mu.Lock()
	if !c.closing {
		c.scheduleLocked(now)
	}
	c.mu.Unlock()
	return true
}

// wake puts a parked socket's reading back on a goroutine: a close (or
// the parker's event, see wakeFromSet). Any other state ignores it.
func (c *Conn) wake() {
	if c.parkState.CompareAndSwap(stateParked, stateReading) {
		c.opts.Parker.NoteParked(-1)
		c.readOn()
	}
}

// readOn starts the reading goroutine of a socket taken out of the set.
func (c *Conn) readOn() {
	c.woke.Store(true)
	go c.readFn()
}

// wakeFromSet is the parker's event: a socket whose input is nothing but
// whole pings and pongs is served where the event came (wakeInline),
// within the harvest's budget for that (park.Set.TakeInline), anything
// else by its reading goroutine.
func (c *Conn) wakeFromSet() {
	if !c.parkState.CompareAndSwap(stateParked, stateReading) {
		return
	}
	c.opts.Parker.NoteParked(-1)
	if !c.opts.Parker.TakeInline() || !c.wakeInline() {
		c.readOn()
	}
}

// wakeInline answers, on the parker's goroutine, what most wakes of an
// idle socket bring: the peer's pong to the server's ping, or its own
// ping. A wake on a goroutine of its own costs the go statement, the
// wake of another thread to run it, and the read buffer from the pool
// and back; measured, a parked socket's pong cost twice an unparked one's
// (README, parking). The input is peeked into the header buffer, without
// a read buffer; only when it starts with whole ping or pong frames that
// fit there (a ping or pong with up to 8 bytes of payload, or two empty
// ones: a browser's pong to the server's empty ping is 6 bytes) are
// those read, answered and the socket parked again. Nothing here waits:
// the pong is queued like any (written at once, see writeNow), so the
// parker's other sockets are not held up. With InlineMessages, one small
// message (whole, unfragmented, valid) after them goes to onMessage
// here too, which the service has promised never blocks. False, with
// nothing consumed, leaves the rest (other data, a close, the end of the
// input, a frame that breaks a rule, a bigger frame) to the reading
// goroutine; a frame after those handled wakes the socket again at once
// (its set is level-triggered).
func (c *Conn) wakeInline() bool {
	if c.now == nil || c.quitting.Load() || c.shut.Load() || !c.readMu.TryLock() {
		return false
	}
	defer c.readMu.Unlock()
	if c.br != nil || c.inputDone || c.misaligned {
		return false
	}
	in := c.hdr[:]
	n, err := c.now.TryRead(in, true)
	if err != nil {
		return false
	}
	end, data := 0, false
	for !data {
		size, op := wholeSmallFrame(in[end:n], c.opts.InlineMessages)
		if size == 0 || op < OpClose && size-6 > c.opts.MaxMessage {
			break // the reading goroutine's, which closes with 1009 for the latter
		}
		end += size
		data = op < OpClose
	}
	if end == 0 {
		return false
	}
	if m, err := c.now.TryRead(in[:end], false); err != nil || m != end {
		// What was peeked is gone: the stream cannot be followed.
		c.misaligned = true
		c.Abort()
		return false
	}
	if c.opts.SilenceTimeout > 0 {
		c.silenceBy.Store(time.Now().Add(c.opts.SilenceTimeout).UnixNano())
	}
	for at := 0; at < end; {
		f := in[at:end]
		size := 6 + int(f[1]&0x7f)
		p := f[6:size]
		maskBytes(f[2:6], p)
		at += size
		switch op := int(f[0] & 0x0f); op {
		case OpPing:
			// Bounded like any pong (see readControl).
			_ = c.queueFrame(OpPong, p, true)
		case OpPong:
			c.pongSeen.Store(true)
		default:
			if c.quitting.Load() {
				// Closed while it arrived (an overflowing pong): dropped,
				// as readMessage drops it.
				break
			}
			if !c.onMessage(op, p) {
				go c.endServe(nil) // finish waits for the writer
				return true
			}
		}
	}
	return c.repark()
}

// wholeSmallFrame is the size and opcode of the frame that b starts with,
// when b holds all of it, it keeps every rule (final, no reserved bits,
// masked, a payload of at most 125 bytes, text in UTF-8) and it is a ping
// or a pong, or with data a text or binary message; else size 0.
func wholeSmallFrame(b []byte, data bool) (size, op int) {
	if len(b) < 6 {
		return 0, 0
	}
	op = int(b[0] & 0x0f)
	allowed := op == OpPing || op == OpPong || data && (op == OpText || op == OpBinary)
	if b[0]&0xf0 != 0x80 || !allowed || b[1]&0x80 == 0 {
		return 0, 0
	}
	n := int(b[1] & 0x7f)
	if n > 125 || 6+n > len(b) {
		return 0, 0
	}
	if op == OpText && !validMaskedText(b[2:6], b[6:6+n]) {
		return 0, 0
	}
	return 6 + n, op
}

// validMaskedText reports whether p, masked with key, is UTF-8, without
// unmasking p in place.
func validMaskedText(key, p []byte) bool {
	var text [125]byte
	t := text[:len(p)]
	copy(t, p)
	maskBytes(key, t)
	return utf8.Valid(t)
}
