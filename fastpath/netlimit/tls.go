package netlimit

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"time"

	"edgerelay/fastpath/tlsrec"
)

// TLS is l serving TLS with cfg, as tls.NewListener(l, cfg) would, except
// that keep-alive connections parked between requests (ParkKeepAlive)
// keep their TLS: Accept hands back the very connection the server had,
// its TLS state and all, and the server goes on reading its next request
// (through tls.NewListener a parked connection would be shaken hands
// with again, so none is parked there).
func (l *Listener) TLS(cfg *tls.Config) net.Listener {
	return &tlsListener{Listener: l, cfg: cfg}
}

type tlsListener struct {
	*Listener
	cfg *tls.Config
}

// Accept wraps a new connection in TLS; a parked keep-alive one comes
// back wrapped already. With a set (SetParker), a new connection is
// shaken hands with here and comes back once its first request byte has
// arrived (greet).
func (l *tlsListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		switch c := c.(type) {
		case *tlsConn:
			return c, nil
		case *conn:
			t := &tlsConn{Conn: tlsrec.Wrap(tls.Server(c, l.cfg)), c: c}
			if p := l.parking; p != nil {
				go p.greet(t)
				continue
			}
			return t, nil
		}
		return tls.Server(c, l.cfg), nil
	}
}

// greet shakes hands with a new TLS connection, on a goroutine of its own
// (a slow client must not hold the accept path), within what is left of
// its wait for a first byte, then parks it until its first request byte
// with no buffer and only its secrets (tlsrec's takeover). A handshake
// that does not end within the wait is counted as ReasonSilent, like a
// connection that sent nothing; one that fails is closed (crypto/tls has
// sent its alert). One whose request came with the handshake's end
// (crypto/tls holds it, so epoll would not tell of it), and one that is
// not TLS 1.3 (its state stays crypto/tls's), are handed over at once.
func (p *parking) greet(t *tlsConn) {
	c := t.c
	by := c.firstReadBy.Load()
	// On the connection below: the server's first deadline is still to
	// be cut to the wait (conn.SetReadDeadline).
	_ = c.Conn.SetDeadline(unixTime(by))
	err := t.Conn.Handshake()
	if derr := c.Conn.SetDeadline(time.Time{}); err == nil {
		err = derr
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			p.l.refuse(ReasonSilent)
		}
		_ = c.closeNow()
		return
	}
	t.Conn.Idle()
	w := &waiter{c: c, outer: t, p: p, list: &p.greeted, deadline: by}
	if !t.Conn.TakenOver() {
		w.state.Store(ready)
		p.queue(w)
		return
	}
	p.park(w)
}

// tlsConn is TLS over one of the Listener's connections, which the
// Listener can park between requests (keepalive.go) with its TLS: a
// tlsrec.Conn, crypto/tls's until it first parks, then keeping only its
// secrets while it waits (docs/parking.md). Everything else is the
// tlsrec.Conn's: Handshake and ConnectionState (a server finds its TLS
// through them), NetConn (the connection below).
type tlsConn struct {
	*tlsrec.Conn
	c *conn
}

// Read is the TLS connection's, except for the first read of the next
// request of a keep-alive connection (conn.readNext).
func (t *tlsConn) Read(b []byte) (int, error) {
	if t.c.idle.Load() {
		return t.c.readNext(b, t.Conn)
	}
	return t.Conn.Read(b)
}

// Close closes the TLS connection (a close_notify, then the connection
// below), or parks it when its server let it go to be parked.
func (t *tlsConn) Close() error {
	if t.c.handoff.Load() != served {
		return t.c.handOver(t)
	}
	return t.Conn.Close()
}

// TLSRecords is the connection's record layer, for a WebSocket served on
// it after an upgrade (tlsrec.Wrap).
func (t *tlsConn) TLSRecords() *tlsrec.Conn { return t.Conn }
