// Package sendq is a send queue bounded in bytes with exactly one writer
// goroutine, for a connection that is not a WebSocket (the agent relay's
// instance link): any goroutine queues bytes, the writer flushes everything
// queued in one write.
//
// It follows the design of ws.Conn's queue (see fastpath/ws): producers
// only copy into the pending buffer, so a peer that reads slowly never
// stalls the goroutine that forwards to it; the writer swaps the pending
// buffer with the one it has just written, so a burst of small frames
// costs one system call and, once both buffers have grown, no allocation.
//
// Two kinds of producers share one queue and get different answers when it
// is full. Put is for cargo: it waits for room, so a flood from one sender
// slows that sender down (its own socket stops being read) instead of
// growing memory. TryPut is for the relay's own small frames (answers,
// probes): they may use a reserve above the bound so that cargo filling
// the queue cannot crowd them out, and when even the reserve is full the
// peer has stopped reading and the caller drops it.
package sendq

import (
	"errors"
	"io"
	"sync"
	"time"
)

// Errors returned by Queue.
var (
	// ErrClosed: the queue is closing or closed; nothing more is queued.
	ErrClosed = errors.New("sendq: queue closed")
	// ErrFull: TryPut found no room within the bound and the reserve.
	ErrFull = errors.New("sendq: queue full")
	// ErrTooBig: a Put of more bytes than the bound can ever hold.
	ErrTooBig = errors.New("sendq: message larger than the queue bound")
)

// Conn is what the writer writes to: a net.Conn does.
type Conn interface {
	io.Writer
	SetWriteDeadline(t time.Time) error
}

// Options bound one queue. Zero values take the defaults noted.
type Options struct {
	// MaxBytes bounds the bytes queued by Put (waiting and in flight).
	// Default 1 MiB.
	MaxBytes int
	// Reserve is how far above MaxBytes TryPut may go. Default 64 KiB.
	Reserve int
	// WriteTimeout bounds one write; a write that takes longer ends the
	// queue with the timeout as its error. 0: unbounded.
	WriteTimeout time.Duration
	// IdleBuffer is the largest buffer the queue keeps once it has been
	// idle for IdleAfter; a bigger one (grown for a burst or a big
	// message) is given back at the next write after such a pause.
	// Default 64 KiB.
	IdleBuffer int
	// IdleAfter is the pause after which big buffers are given back.
	// Default 1 s. A busy queue keeps them, so that steady traffic does
	// not reallocate them write after write.
	IdleAfter time.Duration
}

func (o *Options) setDefaults() {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 20
	}
	if o.Reserve <= 0 {
		o.Reserve = 64 << 10
	}
	if o.IdleBuffer <= 0 {
		o.IdleBuffer = 64 << 10
	}
	if o.IdleAfter <= 0 {
		o.IdleAfter = time.Second
	}
}

// Queue is one connection's send queue and its writer goroutine.
type Queue struct {
	w    Conn
	opts Options

	mu       sync.Mutex
	pending  []byte
	inFlight int // bytes being written by the writer
	closing  bool
	aborted  bool
	held     bool  // Hold: the writer leaves pending alone until Release
	err      error // the write error that ended the queue
	// room is closed (and forgotten) after every write and when the queue
	// ends, waking every Put waiting for room; it is made by the first
	// waiter, so that a queue nobody waits on allocates nothing per write.
	room chan struct{}

	wake chan struct{}
	done chan struct{} // closed when the writer has returned
}

// New starts the writer of a queue that writes to w.
func New(w Conn, opts Options) *Queue {
	opts.setDefaults()
	q := &Queue{w: w, opts: opts, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.writeLoop()
	return q
}

// Put queues p, followed by a line feed when lf is set, as one unit: the
// writer never writes part of it next to part of another. It copies p, so
// the caller may reuse it at once. When the queue has no room it waits
// until the writer has made some, the queue ends (ErrClosed) or cancel is
// closed (ErrClosed too; cancel may be nil).
func (q *Queue) Put(p []byte, lf bool, cancel <-chan struct{}) error {
	n := len(p)
	if lf {
		n++
	}
	if n > q.opts.MaxBytes {
		return ErrTooBig
	}
	for {
		q.mu.Lock()
		if q.closing {
			q.mu.Unlock()
			return ErrClosed
		}
		if len(q.pending)+q.inFlight+n <= q.opts.MaxBytes {
			q.appendLocked(p, lf)
			q.mu.Unlock()
			q.signal()
			return nil
		}
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-q.done:
			return ErrClosed
		case <-cancel:
			return ErrClosed
		}
	}
}

// TryPut queues p (and a line feed when lf is set) if it fits within the
// bound plus the reserve, and returns ErrFull, queueing nothing, if not.
func (q *Queue) TryPut(p []byte, lf bool) error {
	n := len(p)
	if lf {
		n++
	}
	q.mu.Lock()
	if q.closing {
		q.mu.Unlock()
		return ErrClosed
	}
	if len(q.pending)+q.inFlight+n > q.opts.MaxBytes+q.opts.Reserve {
		q.mu.Unlock()
		return ErrFull
	}
	q.appendLocked(p, lf)
	q.mu.Unlock()
	q.signal()
	return nil
}

func (q *Queue) appendLocked(p []byte, lf bool) {
	q.pending = append(q.pending, p...)
	if lf {
		q.pending = append(q.pending, '\n')
	}
}

// Queued is the number of bytes queued and not yet written.
func (q *Queue) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) + q.inFlight
}

// Close stops accepting bytes; the writer writes what is queued and then
// returns. Safe to call any number of times, from any goroutine.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closing = true
	q.wakeRoomLocked()
	q.mu.Unlock()
	q.signal()
}

// Hold keeps the writer from writing what is queued from now on until
// Release: bytes queued meanwhile wait, in order, within the same bounds.
// For a first frame that must not reach the peer before something else
// has happened, while frames queued behind it keep their place. Close and
// Abort end a hold.
func (q *Queue) Hold() {
	q.mu.Lock()
	q.held = true
	q.mu.Unlock()
}

// Release ends a Hold: the writer writes what waited.
func (q *Queue) Release() {
	q.mu.Lock()
	q.held = false
	q.mu.Unlock()
	q.signal()
}

// Abort stops accepting bytes and drops what is queued; the writer returns
// after the write in progress, if any (bound it with a deadline on the
// connection).
func (q *Queue) Abort() {
	q.mu.Lock()
	q.closing, q.aborted = true, true
	q.pending = q.pending[:0]
	q.wakeRoomLocked()
	q.mu.Unlock()
	q.signal()
}

// Done is closed when the writer has returned.
func (q *Queue) Done() <-chan struct{} { return q.done }

// Err is the write error that ended the queue, once Done is closed; nil
// when it ended by Close or Abort.
func (q *Queue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

func (q *Queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *Queue) wakeRoomLocked() {
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
}

func (q *Queue) writeLoop() {
	defer close(q.done)
	var writing []byte
	lastWrite := time.Now()
	for range q.wake {
		// After a pause, a big spare buffer goes back, and the other one
		// after the next pause: an idle link (heartbeats still wake it)
		// soon holds little, a busy one regrows nothing.
		if cap(writing) > q.opts.IdleBuffer && time.Since(lastWrite) > q.opts.IdleAfter {
			writing = nil
		}
		for {
			q.mu.Lock()
			if q.aborted {
				q.mu.Unlock()
				return
			}
			if q.held && !q.closing {
				q.mu.Unlock()
				break // Release wakes the writer
			}
			writing, q.pending = q.pending, writing[:0]
			q.inFlight = len(writing)
			closing := q.closing
			q.mu.Unlock()
			if len(writing) == 0 {
				if closing {
					return
				}
				break
			}
			now := time.Now()
			if q.opts.WriteTimeout > 0 {
				_ = q.w.SetWriteDeadline(now.Add(q.opts.WriteTimeout))
			}
			_, err := q.w.Write(writing)
			lastWrite = now
			q.mu.Lock()
			q.inFlight = 0
			q.wakeRoomLocked()
			if err != nil {
				q.err = err
				q.closing, q.aborted = true, true
				q.pending = q.pending[:0]
				q.mu.Unlock()
				return
			}
			q.mu.Unlock()
		}
	}
}
