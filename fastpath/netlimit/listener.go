// Package netlimit enforces the limits an operator expects on every listener:
// a cap on concurrent connections in total and per client IP, and an accept
// rate limit. It also rides out the process running out of file
// descriptors: such connections are closed at once and counted, and Accept
// never returns the error (see fds.go).
//
// It wraps the raw TCP listener, beneath TLS and HTTP, so that a refused
// connection costs only the accept: it is closed at once, before any
// handshake, read, write, upgrade or allocation by the layers above.
//
//	ln, _ := net.Listen("tcp", addr)
//	limited := netlimit.New(ln, limits, metrics.For("mailbox"))
//	server.Serve(tls.NewListener(limited, tlsConfig)) // TLS above the limit
package netlimit

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Reasons passed to Counters.Refused, and the values of the "reason" label.
const (
	ReasonTotal = "total"  // MaxConns connections were already open
	ReasonPerIP = "per_ip" // MaxConnsPerIP connections from this IP were already open
	ReasonRate  = "rate"   // the accept-rate bucket was empty
	ReasonFDs   = "fds"    // the process (or system) had no file descriptor left
	// ReasonSilent: a connection parked until its first byte (SetParker)
	// sent nothing within the wait and was closed. It was admitted, and
	// held its place until then; it is counted here with the refusals
	// because, like them, it was closed before the server saw it.
	ReasonSilent = "silent"
)

// Limits are one listener's limits. The zero value limits nothing; each
// field's zero means "no limit" on its own.
type Limits struct {
	// MaxConns caps the connections open at once through the listener,
	// counted from accept to Close.
	MaxConns int
	// MaxConnsPerIP caps the connections open at once from one client
	// address (IPv4 address, or full IPv6 address). Connections whose remote
	// address has no IP (in-memory pipes, Unix sockets) are not counted per
	// IP. Behind a proxy every client has the proxy's IP: leave it 0 there.
	MaxConnsPerIP int
	// AcceptRate is the sustained number of connections accepted per second,
	// refilling a token bucket of AcceptBurst tokens.
	AcceptRate float64
	// AcceptBurst is how many connections may be accepted at once after a
	// quiet period. With AcceptRate set and AcceptBurst 0, the burst is one
	// second's worth of AcceptRate (at least 1). Without AcceptRate it has no
	// effect.
	AcceptBurst int
}

// Validate reports limits that cannot mean what the operator intended:
// negative values, and a rate that is not a finite number. Configuration code
// calls it so that such values are refused with a clear error; New itself
// treats them as "no limit".
func (l Limits) Validate() error {
	var errs []error
	if l.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("netlimit: max connections %d is negative (0 means unlimited)", l.MaxConns))
	}
	if l.MaxConnsPerIP < 0 {
		errs = append(errs, fmt.Errorf("netlimit: max connections per IP %d is negative (0 means unlimited)", l.MaxConnsPerIP))
	}
	if l.AcceptRate < 0 || math.IsNaN(l.AcceptRate) || math.IsInf(l.AcceptRate, 0) {
		errs = append(errs, fmt.Errorf("netlimit: accept rate %v is not a finite non-negative number (0 means unlimited)", l.AcceptRate))
	}
	if l.AcceptBurst < 0 {
		errs = append(errs, fmt.Errorf("netlimit: accept burst %d is negative", l.AcceptBurst))
	}
	return errors.Join(errs...)
}

// Counters is told about every refused connection, with one of the Reason
// constants; PromMetrics.For provides one backed by Prometheus. It is called
// from the accepting goroutine and must not block.
type Counters interface {
	Refused(reason string)
}

// Listener is a net.Listener that refuses connections beyond its Limits.
// Refused connections are closed and never returned by Accept; accepted ones
// are returned wrapped, and their Close releases their place.
type Listener struct {
	inner    net.Listener
	lim      Limits
	burst    float64
	counters Counters
	now      func() time.Time // time.Now; replaced in tests
	fds      *fdGuard
	// queue is a second descriptor of the listening socket, through which
	// connections are shed without the runtime's accept (see fds.go); nil
	// where that cannot be done. raw is its raw connection.
	queue *os.File
	raw   syscall.RawConn
	// parking, when not nil, keeps connections until their first byte
	// (SetParker, park.go).
	parking *parking
	// ops are the connections' reads and writes in flight (sysio_linux.go).
	ops *sync.Pool

	mu     sync.Mutex
	open   int
	perIP  map[netip.Addr]int // only when lim.MaxConnsPerIP > 0; no zero entries
	tokens float64
	last   time.Time
}

// Wrap is New returning a plain net.Listener, for callers that need nothing
// more.
func Wrap(ln net.Listener, lim Limits, c Counters) net.Listener {
	return New(ln, lim, c)
}

// New wraps ln with lim. c, which may be nil, counts refusals. Values that
// Limits.Validate rejects are treated as 0 (no limit). Close the Listener
// rather than ln: it may hold a second descriptor of ln's socket (see
// fds.go), which keeps the socket listening until the Listener is closed.
func New(ln net.Listener, lim Limits, c Counters) *Listener {
	lim.MaxConns = max(lim.MaxConns, 0)
	lim.MaxConnsPerIP = max(lim.MaxConnsPerIP, 0)
	if !(lim.AcceptRate > 0) || math.IsInf(lim.AcceptRate, 0) {
		lim.AcceptRate = 0
	}
	l := &Listener{inner: ln, lim: lim, counters: c, now: time.Now, ops: newSysOps()}
	l.queue, l.raw = dupListener(ln)
	l.fds = newFDGuard(l.raw != nil)
	if lim.AcceptRate > 0 {
		l.burst = float64(lim.AcceptBurst)
		if lim.AcceptBurst <= 0 {
			l.burst = max(1, math.Ceil(lim.AcceptRate))
		}
		l.tokens = l.burst // start full: a fresh server takes its first burst
	}
	if lim.MaxConnsPerIP > 0 {
		l.perIP = make(map[netip.Addr]int)
	}
	return l
}

// SetLog gives the listener a logger for its warnings about running out of
// file descriptors (a bounded number, see fds.go). Call it before the first
// Accept; without it nothing is logged.
func (l *Listener) SetLog(log *slog.Logger) {
	l.fds.mu.Lock()
	defer l.fds.mu.Unlock()
	l.fds.log = log
}

// Accept waits for a connection within the limits. Connections over a limit
// are closed immediately and counted, and Accept keeps waiting, so the
// server above never sees them. Running out of file descriptors is ridden
// out the same way, and a lack of kernel memory is waited out (see
// fds.go). Other errors of the inner listener are returned as they are (a
// server's accept loop already knows how to handle them). With a set
// (SetParker), a connection is returned only once it has sent something
// (see park.go).
func (l *Listener) Accept() (net.Conn, error) {
	if l.parking != nil {
		return l.parking.accept()
	}
	c, err := l.acceptAdmitted()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// acceptAdmitted is the next connection within the limits, or the inner
// listener's next error that is not ridden out.
func (l *Listener) acceptAdmitted() (*conn, error) {
	backedOff := false
	for {
		c, err := l.inner.Accept()
		if err != nil {
			if kernelShort(err) {
				l.fds.shortOfMemory(l.now(), err)
				l.fds.wait()
				backedOff = true
				continue
			}
			if !outOfFDs(err) {
				return nil, err
			}
			l.fds.exhausted(l.now(), err, l.Open())
			if c, err = l.shedPending(); err != nil {
				l.fds.wait()
			}
			if c == nil {
				continue
			}
		}
		if backedOff || l.fds.inEpisode.Load() {
			// The next shortage starts its back-off from the shortest.
			l.fds.accepted(l.now(), l.raw != nil)
			backedOff = false
		}
		ip, hasIP := remoteIP(c)
		tracked, reason := l.admit(ip, hasIP)
		if reason != "" {
			l.refuse(reason)
			c.Close()
			continue
		}
		return &conn{Conn: c, rc: rawConnOf(c), l: l, ip: ip, tracked: tracked}, nil
	}
}

// refuse counts a refusal. It is called before the connection is closed,
// so that whoever sees the connection end also finds it in the metrics.
func (l *Listener) refuse(reason string) {
	if l.counters != nil {
		l.counters.Refused(reason)
	}
}

// admit checks the limits for a new connection from ip and, if it fits,
// takes its place. The caps are checked before the rate bucket so that a
// client hammering its per-IP cap does not drain the tokens other clients
// need. tracked reports whether the connection was counted against its IP.
func (l *Listener) admit(ip netip.Addr, hasIP bool) (tracked bool, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.MaxConns > 0 && l.open >= l.lim.MaxConns {
		return false, ReasonTotal
	}
	tracked = hasIP && l.perIP != nil
	if tracked && l.perIP[ip] >= l.lim.MaxConnsPerIP {
		return false, ReasonPerIP
	}
	if !l.takeToken() {
		return false, ReasonRate
	}
	l.open++
	if tracked {
		l.perIP[ip]++
	}
	return tracked, ""
}

// takeToken refills the bucket for the time since the last call and takes
// one token if there is one. Called with l.mu held.
func (l *Listener) takeToken() bool {
	if l.lim.AcceptRate == 0 {
		return true
	}
	now := l.now()
	if !l.last.IsZero() {
		if elapsed := now.Sub(l.last).Seconds(); elapsed > 0 {
			l.tokens = min(l.burst, l.tokens+elapsed*l.lim.AcceptRate)
		}
	}
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// release gives back the place of a closed connection. The map entry goes
// at zero, so that the map holds only IPs with open connections and cannot
// grow with the number of clients ever seen.
func (l *Listener) release(ip netip.Addr, tracked bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if tracked {
		if n := l.perIP[ip] - 1; n > 0 {
			l.perIP[ip] = n
		} else {
			delete(l.perIP, ip)
		}
	}
}

// Open returns the number of accepted connections not yet closed, for an
// open-connections gauge.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Close closes the inner listener and gives back the spare descriptor.
// Connections already accepted stay open and still release their place
// when closed; those still waiting for their first byte (SetParker) are
// closed.
func (l *Listener) Close() error {
	err := l.inner.Close()
	// The second descriptor keeps the socket listening until it is closed
	// too; closing it also ends a shedding that waits on it.
	if l.queue != nil {
		_ = l.queue.Close()
	}
	l.fds.close()
	if l.parking != nil {
		l.parking.close()
	}
	return err
}

// Addr returns the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// remoteIP returns the client address of c without its port and zone, with
// IPv4-mapped IPv6 addresses unmapped so that one client counts as one
// whichever way a dual-stack socket reports it.
func remoteIP(c net.Conn) (netip.Addr, bool) {
	var ap netip.AddrPort
	switch a := c.RemoteAddr().(type) {
	case nil:
		return netip.Addr{}, false
	case *net.TCPAddr:
		ap = a.AddrPort()
	default:
		var err error
		if ap, err = netip.ParseAddrPort(a.String()); err != nil {
			return netip.Addr{}, false
		}
	}
	ip := ap.Addr().Unmap().WithZone("")
	return ip, ip.IsValid()
}

// conn is an accepted connection holding a place in its Listener's counts
// until it is closed.
type conn struct {
	net.Conn
	rc       syscall.RawConn // reads and writes go through it when not nil (sysio_linux.go)
	l        *Listener
	ip       netip.Addr
	tracked  bool
	released atomic.Bool
	// firstReadBy, when not 0, is the end of the wait of a connection
	// that was parked until its first byte (Unix ns): the first read
	// deadline set on it is cut to it (SetReadDeadline).
	firstReadBy atomic.Int64

	// readBy is the read deadline last set (Unix ns, 0: none), idle tells
	// that the server is between two requests on the connection
	// (MarkIdle), and handoff is where a keep-alive connection parked
	// between requests stands (keepalive.go).
	readBy  atomic.Int64
	idle    atomic.Bool
	handoff atomic.Int32

	// after holds what AfterClose registered; closed is set by the first
	// Close (both under mu).
	mu     sync.Mutex
	after  []func()
	closed bool
}

// Close closes the connection and, the first time only, releases its place
// and runs what AfterClose registered: servers and hijackers commonly close
// a connection more than once, and a second release would let the counts
// drift below the truth and the caps admit more than they should. A
// keep-alive connection its server let go between requests to be parked
// (keepalive.go) is parked instead.
func (c *conn) Close() error {
	if c.handoff.Load() != served {
		return c.handOver(c)
	}
	return c.closeNow()
}

// closeNow is Close for real: what a parked connection's Listener calls.
func (c *conn) closeNow() error {
	err := c.Conn.Close()
	if c.released.CompareAndSwap(false, true) {
		c.l.release(c.ip, c.tracked)
		c.mu.Lock()
		after := c.after
		c.after, c.closed = nil, true
		c.mu.Unlock()
		for _, f := range after {
			f()
		}
	}
	return err
}

// SetReadDeadline sets the read deadline; the first one set on a
// connection that was parked until its first byte is cut to the end of
// its wait. A server sets its header timeout as the first read deadline
// when it starts on a connection; without the cut, a client that sends
// one byte just before the wait ends would get a whole header timeout
// more, twice today's.
func (c *conn) SetReadDeadline(t time.Time) error {
	t = c.cutFirst(t)
	c.noteReadBy(t)
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline for reads (the write deadline is not
// cut).
func (c *conn) SetDeadline(t time.Time) error {
	by := c.cutFirst(t)
	c.noteReadBy(by)
	if !by.Equal(t) {
		return errors.Join(c.Conn.SetReadDeadline(by), c.Conn.SetWriteDeadline(t))
	}
	return c.Conn.SetDeadline(t)
}

// cutFirst is t, or the end of the parked wait if that comes first and
// this is the first deadline set.
func (c *conn) cutFirst(t time.Time) time.Time {
	if c.firstReadBy.Load() == 0 {
		return t
	}
	ns := c.firstReadBy.Swap(0)
	if ns == 0 {
		return t
	}
	if by := time.Unix(0, ns); t.IsZero() || by.Before(t) {
		return by
	}
	return t
}

// AfterClose registers f to run once the connection is closed, on the
// goroutine that closes it (at once if it already is). This makes the
// connection a ws.CloseNotifier: fasthttp closes a connection it gives up
// on before calling the hijack handler a request set, and ws.Hijack hears
// of it here to give back what the handler reserved for the socket.
func (c *conn) AfterClose(f func()) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		f()
		return
	}
	c.after = append(c.after, f)
	c.mu.Unlock()
}

// NetConn returns the underlying connection, like tls.Conn.NetConn, for code
// that needs the *net.TCPConn (keep-alive, CloseWrite, the file descriptor).
// Closing it directly bypasses the release: close the wrapper instead.
func (c *conn) NetConn() net.Conn { return c.Conn }

// ReadFrom keeps io.Copy into this connection on the kernel's fast path:
// embedding net.Conn hides *net.TCPConn's ReadFrom, and without it a copy
// from another TCP connection would lose splice(2). A source that is itself
// a limited conn is unwrapped for the same reason.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if src, ok := r.(*conn); ok {
		r = src.Conn
	}
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
