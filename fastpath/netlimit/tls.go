package netlimit

import (
	"crypto/tls"
	"net"

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
// back wrapped already.
func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	switch c := c.(type) {
	case *tlsConn:
		return c, nil
	case *conn:
		return &tlsConn{Conn: tlsrec.Wrap(tls.Server(c, l.cfg)), c: c}, nil
	}
	return tls.Server(c, l.cfg), nil
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
