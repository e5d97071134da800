package netlimit

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"edgerelay/fastpath/park"
)

// Parking connections until their first byte.
//
// An HTTP server gives every accepted connection a goroutine, a request
// context and a read buffer the size of the largest header (fasthttp: 8
// KiB and more) before it knows whether the client will ever send a
// byte. A flood of connections that send nothing therefore costs far
// more per socket than an idle WebSocket parked in a park.Set.
//
// With SetParker, the Listener keeps an admitted connection to itself
// until its first byte (or its EOF or reset) has arrived: the connection
// is registered in the set and armed once, and it waits there with no
// goroutine and no buffer, only the kernel's socket, the runtime's
// descriptor and a small struct. When the set wakes it, the
// wake function queues it (a mutex and a non-blocking send: it never
// blocks the set's goroutine) and Accept hands it to the server.
//
// To keep Accept's caller free of the wait, one goroutine per Listener
// (not per connection) runs the accepting that Accept does without a
// set: limits, refusals and running out of descriptors all work as
// before, and a connection that waits holds its place in every count
// (MaxConns, per IP) from accept to Close. Errors of the inner listener
// reach Accept's caller as they are, one per Accept call, as without a
// set.
//
// A connection that sends nothing within the wait is closed and counted
// as ReasonSilent. Every connection waits as long, so the waiting list,
// kept in accept order, is in the order of the waits' ends: one timer per
// list, set for the oldest, expires them (a timer per connection would
// cost as much again as the rest of its state, and a stopped one stays in
// the runtime's heap, holding the connection, until its time). One that
// sends its first byte in time gets the rest of the wait, not a fresh
// one, for its first read deadline (see conn.SetReadDeadline): the header
// timeout runs from the accept, as it does without a set.
//
// Keep-alive connections between requests (ParkKeepAlive, keepalive.go)
// wait the same way, in a second list of their own: their waits end at
// the server's idle deadline, and one that passes is closed without
// being counted (the server would have closed it then too).
//
// A TLS connection's first byte is its ClientHello, and the request comes
// only after the handshake: when the Listener runs the TLS (tls.go), it
// shakes hands itself, off the accept path, and parks the connection
// again until the request's first byte, in a third list whose waits end
// where the first one's did (the header timeout runs from the accept).

// waiter states: exactly one of wake, sweep and Close moves a waiter out
// of waiting, and that one disposes of it.
const (
	waiting int32 = iota
	ready         // woken (or could not be parked): Accept hands it over
	expired       // the wait passed: closed (and counted, for a new one) by sweep
	shut          // the listener closed while it waited
)

// parking is a Listener's state under SetParker.
type parking struct {
	l    *Listener
	set  *park.Set
	wait time.Duration
	// linger: how long a keep-alive connection waits for its next request
	// on the server's goroutine before it is parked (ParkKeepAlive); 0:
	// keep-alive connections are not parked.
	linger time.Duration

	mu      sync.Mutex
	closed  bool      // Close ran: nothing is queued or listed any more
	started bool      // the accept goroutine runs (or ran)
	fresh   waitList  // new connections waiting for their first byte
	greeted waitList  // new TLS connections, shaken hands with, waiting for their first request byte (tls.go)
	idle    waitList  // keep-alive connections waiting for their next request
	ready   []*waiter // woken, not yet handed to Accept's caller

	readySig chan struct{} // capacity 1: something was queued
	errs     chan error    // the accept goroutine's errors, one per Accept
	done     chan struct{} // closed by Close
	stopped  chan struct{} // closed when the accept goroutine returns
}

// waitList is one kind of waiting connections, in the order their waits
// end (intrusive list), with the timer that expires them.
type waitList struct {
	first, last *waiter
	n           int
	// reason counts an expired connection as a refusal ("" : not counted).
	reason string
	// expiry runs sweep at the end of the oldest wait; nil until the
	// first connection waits. armed: it is set.
	expiry *time.Timer
	armed  bool
}

// waiter is one connection waiting for a byte.
type waiter struct {
	c *conn
	// outer is what Accept hands over: c, or the TLS above it of a
	// keep-alive connection parked with its TLS state (tls.go).
	outer      net.Conn
	p          *parking
	list       *waitList
	reg        park.Reg
	deadline   int64 // end of the wait (Unix ns); 0 without one
	state      atomic.Int32
	prev, next *waiter // in its list while waiting
}

// SetParker makes Accept hand over a connection only once its first byte
// (or its end) has arrived; until then it waits in set, without a
// goroutine or a buffer. A connection that sends nothing within wait (the
// service's header timeout; 0: no limit) is closed and counted as
// ReasonSilent. With a nil set (park.New fails where epoll is missing, or
// in the nopark build) the Listener behaves as without the call. Call it
// before the first Accept.
func (l *Listener) SetParker(set *park.Set, wait time.Duration) {
	if set == nil {
		l.parking = nil
		return
	}
	l.parking = &parking{
		l: l, set: set, wait: max(wait, 0),
		fresh:    waitList{reason: ReasonSilent},
		greeted:  waitList{reason: ReasonSilent},
		readySig: make(chan struct{}, 1),
		errs:     make(chan error),
		done:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
}

// Waiting is the number of connections parked until a byte arrives: new
// ones waiting for their first, keep-alive ones for their next request (0
// without a set), for a gauge. They are counted in Open too.
func (l *Listener) Waiting() int {
	p := l.parking
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fresh.n + p.greeted.n + p.idle.n
}

// accept is Accept with a set: the next connection that has sent
// something, or the inner listener's next error.
func (p *parking) accept() (net.Conn, error) {
	p.start()
	for {
		if w := p.pop(); w != nil {
			w.reg.Unregister() // before anyone can close the socket
			if w.list == &p.idle {
				w.c.resumed()
			}
			if w.outer != nil {
				return w.outer, nil
			}
			return w.c, nil
		}
		select {
		case <-p.readySig:
		case err := <-p.errs:
			return nil, err
		case <-p.done:
			return nil, p.closedErr()
		}
	}
}

// closedErr is what Accept returns once the Listener is closed: the error
// a closed TCP listener returns (fasthttp's accept loop recognises it by
// its text and ends quietly).
func (p *parking) closedErr() error {
	addr := p.l.inner.Addr()
	return &net.OpError{Op: "accept", Net: addr.Network(), Addr: addr, Err: net.ErrClosed}
}

// start runs the accept goroutine once, at the first Accept.
func (p *parking) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return
	}
	p.started = true
	go p.acceptLoop()
}

// acceptLoop accepts and parks connections until the listener closes. An
// error of the inner listener is handed to one Accept call before the
// next accept, as Accept itself would have returned it.
func (p *parking) acceptLoop() {
	defer close(p.stopped)
	for {
		c, err := p.l.acceptAdmitted()
		if err != nil {
			select {
			case p.errs <- err:
				continue
			case <-p.done:
				return
			}
		}
		w := &waiter{c: c, p: p, list: &p.fresh}
		if p.wait > 0 {
			// The first read deadline the server sets is cut to this too,
			// so that the header timeout runs from the accept (see
			// conn.SetReadDeadline).
			w.deadline = p.l.now().Add(p.wait).UnixNano()
			c.firstReadBy.Store(w.deadline)
		}
		p.park(w)
	}
}

// park registers w's connection in the set and arms its wait; a
// connection that cannot be parked is handed over at once.
func (p *parking) park(w *waiter) {
	sc, ok := w.c.Conn.(syscall.Conn)
	var rc syscall.RawConn
	if ok {
		rc, _ = sc.SyscallConn()
	}
	if rc == nil || !w.reg.Register(p.set, rc, w.wake) {
		w.state.Store(ready)
		p.queue(w)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		w.reg.Unregister()
		_ = w.c.closeNow()
		return
	}
	// Linked under mu, after Register: sweep finds it only through mu,
	// so it sees the registration complete.
	p.link(w)
	p.mu.Unlock()
	if err := w.reg.Arm(); err != nil {
		// Not parked (the epoll set refused it, or sweep already
		// unregistered it): serve it at once, if no one else took it.
		w.wake()
	}
}

// wake runs on the set's goroutine when the connection is readable or
// hung up: it queues the connection for Accept without blocking.
func (w *waiter) wake() {
	if !w.state.CompareAndSwap(waiting, ready) {
		return
	}
	p := w.p
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		// Close took the list before this wake queued it: dispose of it
		// here, off the set's goroutine (rare: only during a shutdown).
		go w.discard()
		return
	}
	p.unlink(w)
	p.mu.Unlock()
	p.queue(w)
}

// sweep runs on a list's expiry timer's goroutine at the end of its
// oldest wait: the connections whose wait has passed without a byte are
// closed (and counted with the list's reason), and the timer is set for
// the next.
func (p *parking) sweep(list *waitList) {
	var gone []*waiter
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	list.armed = false
	now := p.l.now().UnixNano()
	for w := list.first; w != nil && w.deadline <= now; {
		next := w.next
		// One being woken stays: its wake unlinks it in a moment.
		if w.state.CompareAndSwap(waiting, expired) {
			p.unlink(w)
			gone = append(gone, w)
		}
		w = next
	}
	p.schedule(list, now)
	p.mu.Unlock()
	for _, w := range gone {
		w.reg.Unregister()
		if list.reason != "" {
			p.l.refuse(list.reason)
		}
		_ = w.c.closeNow()
	}
}

// schedule sets list's expiry timer for the oldest wait that ends after
// now (those that ended are being woken). Called with mu held.
func (p *parking) schedule(list *waitList, now int64) {
	w := list.first
	for w != nil && w.deadline <= now {
		w = w.next
	}
	if w == nil {
		return // the next link schedules
	}
	list.armed = true
	d := time.Duration(w.deadline - now)
	if list.expiry == nil {
		list.expiry = time.AfterFunc(d, func() { p.sweep(list) })
		return
	}
	list.expiry.Reset(d)
}

// discard unregisters and closes a connection that will never be handed
// over (the listener closed).
func (w *waiter) discard() {
	w.reg.Unregister()
	_ = w.c.closeNow()
}

// queue hands w to Accept: appended under mu, signalled without blocking.
func (p *parking) queue(w *waiter) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		go w.discard()
		return
	}
	p.ready = append(p.ready, w)
	p.mu.Unlock()
	select {
	case p.readySig <- struct{}{}:
	default: // already signalled
	}
}

// pop takes the oldest queued connection, or nil. With more queued it
// signals again, for another Accept running at the same time.
func (p *parking) pop() *waiter {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		return nil
	}
	w := p.ready[0]
	p.ready[0] = nil
	p.ready = p.ready[1:]
	if len(p.ready) > 0 {
		select {
		case p.readySig <- struct{}{}:
		default:
		}
	}
	return w
}

// link adds w to the end of its list and, when the list's expiry timer is
// not set, sets it. A wait never ends before the one linked ahead of it
// (a keep-alive wait that would, by the scheduling between its deadline
// and its parking, is moved to that one's end), so that sweep finds the
// ended ones at the front. Called with mu held.
func (p *parking) link(w *waiter) {
	list := w.list
	if last := list.last; last != nil && w.deadline != 0 && w.deadline < last.deadline {
		w.deadline = last.deadline
	}
	w.prev = list.last
	if list.last != nil {
		list.last.next = w
	} else {
		list.first = w
	}
	list.last = w
	list.n++
	if w.deadline != 0 && !list.armed {
		p.schedule(list, p.l.now().UnixNano())
	}
}

// unlink takes w out of its list. Called with mu held.
func (p *parking) unlink(w *waiter) {
	list := w.list
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		list.first = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		list.last = w.prev
	}
	w.prev, w.next = nil, nil
	list.n--
}

// close ends the parking (the Listener is closing): every waiting and
// queued connection is closed, Accept returns the closed error, and the
// accept goroutine is waited for (the inner listener is closed already,
// so it is on its way out).
func (p *parking) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	var list []*waiter
	for _, l := range []*waitList{&p.fresh, &p.greeted, &p.idle} {
		for w := l.first; w != nil; w = w.next {
			list = append(list, w)
		}
		l.first, l.last, l.n = nil, nil, 0
		if l.expiry != nil {
			l.expiry.Stop()
		}
	}
	queued := p.ready
	p.ready = nil
	started := p.started
	p.mu.Unlock()
	close(p.done)
	for _, w := range list {
		if w.state.CompareAndSwap(waiting, shut) {
			w.discard()
		}
		// Otherwise a wake or the sweep won: it disposes of it.
	}
	for _, w := range queued {
		w.discard()
	}
	if started {
		<-p.stopped
	}
}
