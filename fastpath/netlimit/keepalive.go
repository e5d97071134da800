package netlimit

import (
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// Parking keep-alive connections between requests.
//
// Between two requests of a keep-alive connection an HTTP server keeps a
// goroutine blocked in a read, with its stack, a request context and a
// read buffer (fasthttp: 16 KiB or so a connection), for as long as the
// client thinks: a flood of idle keep-alive connections costs several
// times what a parked WebSocket does.
//
// With ParkKeepAlive, the server tells the Listener when a connection is
// between two requests (MarkIdle, from its connection-state hook). The
// first read of the next request then waits for at most the linger; when
// nothing has come by then, it returns errParked with nothing read, and
// the server, taking that for a keep-alive connection that ended (as it
// takes any read that ends with nothing at a request boundary), lets its
// goroutine, context and buffers go and closes the connection. That Close
// parks it instead: it waits in the set like a new connection until the
// next request's first byte, and Accept hands it to the server again,
// which serves it as a new connection with the byte waiting. Its place
// in the counts is kept throughout, and no limit, token or refusal
// applies twice.
//
// The server must read nothing else while the connection is marked idle:
// fasthttp marks a connection idle after each answer and active at the
// first byte of the next request, and reads between the two only the
// request's first byte, into an empty buffer (a pipelined request already
// buffered is read without a read on the connection).
//
// TLS connections are parked the same way when the Listener runs their
// TLS (Listener.TLS, tls.go): the server is then handed a connection of
// the Listener's above TLS, and one parked between requests keeps its
// TLS state (what crypto/tls holds for an established connection) and
// is handed back as it was. One wrapped by a TLS layer of someone else's
// is never marked: that layer's state is out of the Listener's reach.
//
// A parked keep-alive connection's wait ends at the read deadline the
// server set for the idle time; one that passes is closed, not counted
// (the server would have closed it then as well).

// handoff states of a connection.
const (
	served      int32 = iota // the server has it
	parkAtClose              // its next request did not come in the linger: Close parks it
	parkedIdle               // the Listener has it, waiting for the next request
)

// errParked is the read error that makes the server let a keep-alive
// connection go. It is a timeout (a net.Error), so that whoever sees it
// takes the read for one that simply got nothing.
var errParked error = parkedError{}

type parkedError struct{}

func (parkedError) Error() string {
	return "netlimit: keep-alive connection parked until its next request"
}
func (parkedError) Timeout() bool   { return true }
func (parkedError) Temporary() bool { return true }

// ParkKeepAlive parks keep-alive connections between requests (see
// above): one the server marks idle (MarkIdle) and whose next request
// does not begin within linger waits in the set until it does. It needs
// SetParker first; linger <= 0 turns it off. Call it before the first
// Accept.
func (l *Listener) ParkKeepAlive(linger time.Duration) {
	if l.parking != nil {
		l.parking.linger = max(linger, 0)
	}
}

// MarkIdle tells c's Listener that the server is between two requests on
// c (idle true: it has answered one; false: the next one has begun, or
// the connection was hijacked). Its end must not be told: a server
// reports it after the Close that parked the connection, when it may be
// served again already. A connection that is not one of a Listener
// parking keep-alive connections is left as it is.
func MarkIdle(c net.Conn, idle bool) {
	var lc *conn
	switch c := c.(type) {
	case *conn:
		lc = c
	case *tlsConn:
		lc = c.c
	default:
		return
	}
	if lc.l.parking == nil || lc.l.parking.linger == 0 {
		return
	}
	lc.idle.Store(idle)
}

// Read reads from the connection; the first read of the next request of
// a connection marked idle waits at most the linger and then hands the
// connection back to be parked (errParked).
func (c *conn) Read(b []byte) (int, error) {
	if c.idle.Load() {
		return c.readNext(b, nil)
	}
	return c.sysRead(b)
}

// readNext is the first read of the next request on an idle keep-alive
// connection, through r: the TLS above it (a read that times out leaves
// crypto/tls's state as it was: it takes a timeout for a temporary
// error), or, when nil, the connection itself.
func (c *conn) readNext(b []byte, r io.Reader) (int, error) {
	c.idle.Store(false) // one read only: the next is the server's own
	by := c.readBy.Load()
	until := c.l.now().Add(c.l.parking.linger)
	if by != 0 && by <= until.UnixNano() {
		return c.readVia(r, b) // the idle time ends first: no parking for so short a wait
	}
	if err := c.Conn.SetReadDeadline(until); err != nil {
		return 0, err
	}
	n, err := c.readVia(r, b)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		c.handoff.Store(parkAtClose)
		return 0, errParked
	}
	// The request began: the server's deadline again.
	if derr := c.Conn.SetReadDeadline(unixTime(by)); derr != nil && err == nil {
		err = derr
	}
	return n, err
}

// readVia reads through r, or the connection itself when r is nil.
func (c *conn) readVia(r io.Reader, b []byte) (int, error) {
	if r == nil {
		return c.sysRead(b)
	}
	return r.Read(b)
}

// handOver is Close on a connection its server let go to be parked: the
// first Close parks it, and any other while it waits does nothing (the
// Listener has it). outer is what the server was handed (c, or the TLS
// above it), to be handed back.
func (c *conn) handOver(outer net.Conn) error {
	if c.handoff.CompareAndSwap(parkAtClose, parkedIdle) {
		if rec, ok := outer.(interface{ Idle() }); ok {
			rec.Idle() // TLS: the record layer's buffers and keys go while it waits
		}
		p := c.l.parking
		p.park(&waiter{c: c, outer: outer, p: p, list: &p.idle, deadline: c.readBy.Load()})
	}
	return nil
}

// resumed readies a parked keep-alive connection to be served again, as a
// new connection of the server whose first byte is waiting.
func (c *conn) resumed() {
	c.handoff.Store(served)
	c.readBy.Store(0)
	_ = c.Conn.SetReadDeadline(time.Time{}) // the linger's, long past
}

// noteReadBy remembers the read deadline the server set: the end of the
// idle time when the connection is parked between requests.
func (c *conn) noteReadBy(t time.Time) {
	if t.IsZero() {
		c.readBy.Store(0)
		return
	}
	c.readBy.Store(t.UnixNano())
}

// unixTime is ns as a deadline: the zero time for 0.
func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
