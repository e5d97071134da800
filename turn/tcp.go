package turn

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Stream limits. A TURN-over-TCP client holds one connection per
// allocation; the caps below keep a client from holding sockets (and
// goroutines) it has no allocation for.
const (
	// defaultStreamIdleTimeout closes a connection that has no allocation
	// and has not sent a whole frame for this long (coturn waits 60 s as
	// well); Config.StreamIdleTimeout overrides it.
	defaultStreamIdleTimeout = 60 * time.Second
	// defaultHandshakeTimeout bounds a TLS handshake;
	// Config.HandshakeTimeout overrides it.
	defaultHandshakeTimeout = 10 * time.Second
	// streamBuffer is a connection's first read buffer: room for a few
	// full-size media frames.
	streamBuffer = 8 << 10
)

var errBadFrame = errors.New("turn: stream carries neither STUN nor ChannelData")

// streamListener is a TCP (or TLS) listener as pion sees it. It refuses
// connections past the caps and, while the server drains, stops handing
// out connections without returning an error: pion closes every
// allocation of a listener whose Accept fails, and a drain must let them
// run.
type streamListener struct {
	net.Listener
	srv *Server
	tls *tls.Config
}

// Accept implements net.Listener for pion's accept loop.
func (l *streamListener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.srv.draining.Load() {
				<-l.srv.closing // hold pion's accept loop until Shutdown closes everything
				return nil, net.ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			// Out of file descriptors and the like: pion would give up on
			// the listener for good, so wait and try again.
			l.srv.log.Warn("turn: accept failed", "err", err)
			time.Sleep(delay)
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		sc, ok := l.srv.streams.admit(c, l.srv)
		if !ok {
			l.srv.metrics.streamRefused()
			_ = c.Close()
			continue
		}
		if l.tls != nil {
			sc.Conn = tls.Server(c, l.tls)
			sc.handshake = true
		} else {
			sc.batchUp()
		}
		return sc, nil
	}
}

// streamConn is one client's TCP or TLS connection as pion sees it. pion
// wraps it in its STUNConn framer; our Read hands that framer whole frames
// only after relaying ChannelData and screening requests itself, so the
// same fast path and gate serve streams and datagrams.
type streamConn struct {
	net.Conn
	srv *Server
	t   tuple

	handshake bool // TLS handshake not done yet

	buf  []byte // frames read but not handed on: buf[r:w]
	r, w int
	rest []byte // the part of a frame pion's buffer had no room for
	// ups queues the ChannelData in buf[:r] for the peers until the next
	// read moves buf (Linux, TCP; see streamup_linux.go).
	ups streamUps

	allocated atomic.Bool // an allocation is bound to this connection
	idleArmed bool        // a read deadline is set
	// frameTimed: the deadline set was armed for the frame now coming in;
	// cleared each time a whole frame is handed on.
	frameTimed bool
	closeOnce  sync.Once
}

// Read implements net.Conn for pion's framer.
func (c *streamConn) Read(p []byte) (int, error) {
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		return n, nil
	}
	if c.handshake {
		if err := c.doHandshake(); err != nil {
			return 0, err
		}
	}
	for {
		frame, err := c.next()
		if err != nil {
			c.flushUp()
			return 0, err
		}
		if isChannelData(frame) {
			c.relayChannelData(frame)
			continue
		}
		if c.relaySendIndication(frame) {
			continue
		}
		c.flushUp() // the data that came before goes before what this message does
		if c.srv.screen(c.t, frame, func(b []byte) { _, _ = c.Conn.Write(b) }) {
			continue
		}
		n := copy(p, frame)
		c.rest = frame[n:]
		return n, nil
	}
}

func (c *streamConn) doHandshake() error {
	tc := c.Conn.(*tls.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), c.srv.cfg.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("turn: TLS handshake with %s: %w", c.t.client, err)
	}
	c.handshake = false
	return nil
}

// next returns the next whole frame: a STUN message (20-byte header plus
// its length) or ChannelData (4-byte header plus its length, padded to 4).
// The frame stays valid until the next call, and the frames before it too
// unless the call reads: what is queued for the peers is sent first.
func (c *streamConn) next() ([]byte, error) {
	for {
		if avail := c.w - c.r; avail >= 4 {
			b := c.buf[c.r:c.w]
			length := int(binary.BigEndian.Uint16(b[2:4]))
			var size int
			switch b[0] & 0xC0 {
			case 0x00:
				size = 20 + length
			case 0x40:
				size = (4 + length + 3) &^ 3
			default:
				return nil, errBadFrame
			}
			if avail >= size {
				c.r += size
				c.frameTimed = false
				return b[:size], nil
			}
			if size > len(c.buf) {
				// Most frames fit the first buffer; grow for the rare big
				// one instead of giving every connection 64 KiB.
				grown := make([]byte, size)
				c.w = copy(grown, b)
				c.r = 0
				c.buf = grown
			}
		}
		c.flushUp() // the read moves buf, where the queued payloads are
		if err := c.fill(); err != nil {
			return nil, err
		}
	}
}

// fill reads more bytes, moving a partial frame to the front of the
// buffer first. A connection without an allocation gets an idle deadline,
// armed when it starts waiting for a frame and not moved while the frame
// comes in parts, so that a client trickling a byte at a time cannot hold
// the connection; one with an allocation lives as long as the
// allocation's client keeps it open.
func (c *streamConn) fill() error {
	if c.r > 0 {
		c.w = copy(c.buf, c.buf[c.r:c.w])
		c.r = 0
	}
	if c.allocated.Load() {
		if c.idleArmed {
			_ = c.Conn.SetReadDeadline(time.Time{})
			c.idleArmed = false
		}
	} else if !c.frameTimed {
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.srv.cfg.StreamIdleTimeout))
		c.idleArmed, c.frameTimed = true, true
	}
	n, err := c.Conn.Read(c.buf[c.w:])
	c.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// Close forgets the connection and closes it.
func (c *streamConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() { c.srv.streams.forget(c) })
	return err
}

// streamSet keeps the open stream connections: to find a client's
// connection when pion reports its allocation, to cap connections per
// client IP and in total, and to close them all on shutdown.
type streamSet struct {
	maxTotal, maxPerIP int

	mu    sync.Mutex
	conns map[tuple]*streamConn
	perIP map[netip.Addr]int
}

func newStreamSet(maxTotal, maxPerIP int) *streamSet {
	return &streamSet{maxTotal: maxTotal, maxPerIP: maxPerIP,
		conns: make(map[tuple]*streamConn), perIP: make(map[netip.Addr]int)}
}

func (s *streamSet) admit(c net.Conn, srv *Server) (*streamConn, bool) {
	t := tuple{stream: true, client: addrPort(c.RemoteAddr()), server: addrPort(c.LocalAddr())}
	s.mu.Lock()
	defer s.mu.Unlock()
	ip := t.client.Addr()
	if len(s.conns) >= s.maxTotal || s.perIP[ip] >= s.maxPerIP {
		return nil, false
	}
	sc := &streamConn{Conn: c, srv: srv, t: t, buf: make([]byte, streamBuffer)}
	s.conns[t] = sc
	s.perIP[ip]++
	return sc, true
}

func (s *streamSet) forget(c *streamConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns[c.t] != c {
		return
	}
	delete(s.conns, c.t)
	ip := c.t.client.Addr()
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
}

func (s *streamSet) get(t tuple) *streamConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[t]
}

// closeAll closes every connection (shutdown).
func (s *streamSet) closeAll() {
	s.mu.Lock()
	all := make([]*streamConn, 0, len(s.conns))
	for _, c := range s.conns {
		all = append(all, c)
	}
	s.mu.Unlock()
	for _, c := range all {
		_ = c.Close()
	}
}
