package turn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	pionturn "github.com/pion/turn/v4"
	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/fastpath/netlimit"
)

// Config configures the TURN server. Zero fields take the defaults noted.
type Config struct {
	// Listen is host:port for STUN/TURN over UDP and over TCP (the same
	// port on both). Port 0 picks a port free on both.
	Listen string
	// TLS, when not nil, adds a turns: listener (TLS over TCP) at
	// TLSListen.
	TLS *tls.Config
	// TLSListen is host:port for turns:, used when TLS is not nil.
	TLSListen string
	// Secret is the TURN REST shared secret; required. The mailbox ice
	// endpoint mints credentials with the same secret (see Credentials).
	Secret string
	// Realm is the long-term credential realm; required.
	Realm string
	// RelayIP is the address put in XOR-RELAYED-ADDRESS, for a server
	// behind 1:1 NAT. Zero means the listen IP, which then must not be
	// unspecified. Relay sockets are always bound to the listen IP.
	RelayIP netip.Addr
	// RelayPortMin and RelayPortMax bound the relay ports (inclusive).
	// Both 0: any port the kernel gives.
	RelayPortMin, RelayPortMax int
	// AllowPeers are peer prefixes opened despite the default deny of
	// every address that is not globally reachable (see peers.go).
	AllowPeers []netip.Prefix
	// MaxAllocations, MaxPerUser and MaxPerIP cap allocations in total,
	// per REST label and per client IP; past them an Allocate gets 486.
	// 0 takes DefaultMaxAllocations, DefaultMaxPerUser, DefaultMaxPerIP;
	// a negative value means no cap. Stream (TCP/TLS) connections are
	// capped at twice the allocation caps, total and per IP.
	MaxAllocations, MaxPerUser, MaxPerIP int
	// SocketBuffer is the receive and send buffer size in bytes asked for
	// on the UDP listener and on every allocation's relay socket; 0 takes
	// DefaultSocketBuffer. Past net.core.rmem_max / wmem_max it is granted
	// only to a process with CAP_NET_ADMIN (root); otherwise the kernel
	// caps it at those limits.
	SocketBuffer int
	// Log receives the server's log lines; nil discards them.
	Log *slog.Logger
	// Metrics, when not nil, gets the server's Prometheus series. Register
	// one server per registerer.
	Metrics prometheus.Registerer
	// Now is the clock credentials' expiry is judged by; nil is time.Now.
	Now func() time.Time
	// StreamIdleTimeout closes a TCP or TLS connection that has no
	// allocation when a whole frame has not arrived within it (a frame
	// trickled in byte by byte does not extend it); 0 takes 60 s, as
	// coturn. HandshakeTimeout bounds a turns: TLS handshake; 0 takes 10 s.
	StreamIdleTimeout, HandshakeTimeout time.Duration
	// NoGRO leaves UDP_GRO off on the sockets that receive (the listener
	// and the relay sockets), so that coalesced input is read a datagram
	// at a time: for comparisons of what GRO is worth (turnserve -no-gro)
	// and tests of both of the batched readers' paths. Off by default:
	// GRO costs nothing when input arrives one datagram at a time.
	NoGRO bool
	// NoHairpin sends a datagram from one allocation to another of this
	// server through the kernel, as coturn does, instead of handing it
	// over in the process (hairpin.go): for the benchmark's comparison of
	// the two, and tests of both. Off by default.
	NoHairpin bool

	// holdRelayReads, set by tests only, is waited on by every relay
	// socket's reader before its first read, so that the test can fill the
	// socket's receive buffer.
	holdRelayReads chan struct{}
	// noGSO, set by tests only, relays as if the kernel refused UDP GSO
	// (sendmmsg), so that both of the batched sender's paths are tested.
	noGSO bool
	// beforeUpRead, set by tests only, is called by the UDP listener's
	// reader before each batch it reads (Linux), so that a test can hold
	// it while the socket fills.
	beforeUpRead func()
}

// Server is a running STUN/TURN server.
type Server struct {
	cfg     Config
	log     *slog.Logger
	pion    *pionturn.Server
	udp     *net.UDPConn
	tcp     net.Listener
	tlsLn   net.Listener
	relayIP netip.Addr

	peers   peerPolicy
	quotas  *quotas
	ports   *portPool
	relays  *relayTable
	streams *streamSet
	metrics *metrics
	// relayBufs are the relay sockets' read buffers (see datagramReader).
	relayBufs *sync.Pool
	// hairpinBufs frame datagrams handed from one allocation to another
	// (hairpin.go).
	hairpinBufs sync.Pool
	// upQueues are the queues stream connections borrow to send a read's
	// ChannelData on to the peers (Linux: streamup_linux.go).
	upQueues sync.Pool
	// out sends relayed frames to UDP clients in batches (Linux; see
	// gso_linux.go).
	out *udpOut
	// udpConn is the listener as pion reads it.
	udpConn *udpConn

	draining  atomic.Bool
	closing   chan struct{} // closed when Shutdown closes everything
	closeOnce sync.Once
}

// Start listens and serves until Shutdown.
func Start(cfg Config) (*Server, error) {
	if cfg.Secret == "" {
		return nil, errors.New("turn: Config.Secret is required")
	}
	if cfg.Realm == "" {
		return nil, errors.New("turn: Config.Realm is required")
	}
	if cfg.RelayPortMin < 0 || cfg.RelayPortMax > 65535 || cfg.RelayPortMin > cfg.RelayPortMax ||
		(cfg.RelayPortMin == 0) != (cfg.RelayPortMax == 0) {
		return nil, fmt.Errorf("turn: relay port range %d-%d: need 0-0 or 1 <= min <= max <= 65535", cfg.RelayPortMin, cfg.RelayPortMax)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = defaultStreamIdleTimeout
	}
	if cfg.SocketBuffer <= 0 {
		cfg.SocketBuffer = DefaultSocketBuffer
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = defaultHandshakeTimeout
	}
	cfg.MaxAllocations = orDefault(cfg.MaxAllocations, DefaultMaxAllocations)
	cfg.MaxPerUser = orDefault(cfg.MaxPerUser, DefaultMaxPerUser)
	cfg.MaxPerIP = orDefault(cfg.MaxPerIP, DefaultMaxPerIP)

	s := &Server{
		cfg:     cfg,
		log:     cfg.Log,
		peers:   newPeerPolicy(cfg.AllowPeers),
		quotas:  newQuotas(cfg.MaxAllocations, cfg.MaxPerUser, cfg.MaxPerIP),
		relays:  newRelayTable(),
		streams: newStreamSet(streamCap(cfg.MaxAllocations), streamCap(cfg.MaxPerIP)),
		closing: make(chan struct{}),

		relayBufs: newRelayBufPool(),
	}
	s.hairpinBufs.New = hairpinBuffer
	var err error
	if s.udp, s.tcp, err = listenPair(cfg.Listen); err != nil {
		return nil, err
	}
	s.tcp = streamsListener(s.tcp)
	// Every client's datagrams queue in the listener socket: at the
	// kernel's default (about 200 KiB, under a hundred full-size
	// datagrams) a burst from a few busy clients while the reader is
	// descheduled is dropped.
	growBuffers(s.udp, cfg.SocketBuffer)
	if s.out, err = newUDPOut(s.udp, cfg); err != nil {
		s.closeListeners()
		return nil, err
	}
	if s.metrics, err = newMetrics(cfg.Metrics, s.relays, s.udp); err != nil {
		s.closeListeners()
		return nil, err
	}
	listenIP := addrPort(s.udp.LocalAddr()).Addr()
	s.relayIP = cfg.RelayIP
	if !s.relayIP.IsValid() {
		if listenIP.IsUnspecified() {
			s.closeListeners()
			return nil, fmt.Errorf("turn: listening on %s needs Config.RelayIP: the relayed address must be one clients can reach", cfg.Listen)
		}
		s.relayIP = listenIP
	}
	s.ports = newPortPool(listenIP, cfg.RelayPortMin, cfg.RelayPortMax)
	if cfg.TLS != nil {
		if s.tlsLn, err = net.Listen("tcp", cfg.TLSListen); err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("turn: TLS listener: %w", err)
		}
		s.tlsLn = streamsListener(s.tlsLn)
	}

	s.udpConn = newUDPConn(s.udp, s)
	gen := relayAddressGenerator{srv: s}
	permit := func(_ net.Addr, ip net.IP) bool {
		a, ok := netip.AddrFromSlice(ip)
		return ok && s.peers.allowed(a)
	}
	pcfg := pionturn.ServerConfig{
		Realm:         cfg.Realm,
		LoggerFactory: pionLogger{log: cfg.Log},
		AuthHandler:   s.authKey,
		QuotaHandler:  s.reserve,
		EventHandler: pionturn.EventHandler{
			OnAllocationCreated: s.onAllocationCreated,
			OnAllocationDeleted: s.onAllocationDeleted,
			OnAllocationError:   s.onAllocationError,
			OnPermissionCreated: s.onPermissionCreated,
			OnPermissionDeleted: s.onPermissionDeleted,
			OnChannelCreated:    s.onChannelCreated,
			OnChannelDeleted:    s.onChannelDeleted,
		},
		PacketConnConfigs: []pionturn.PacketConnConfig{{
			PacketConn:            s.udpConn,
			RelayAddressGenerator: gen,
			PermissionHandler:     permit,
		}},
		ListenerConfigs: []pionturn.ListenerConfig{{
			Listener:              &streamListener{Listener: s.tcp, srv: s},
			RelayAddressGenerator: gen,
			PermissionHandler:     permit,
		}},
	}
	if s.tlsLn != nil {
		pcfg.ListenerConfigs = append(pcfg.ListenerConfigs, pionturn.ListenerConfig{
			Listener:              &streamListener{Listener: s.tlsLn, srv: s, tls: cfg.TLS},
			RelayAddressGenerator: gen,
			PermissionHandler:     permit,
		})
	}
	if s.pion, err = pionturn.NewServer(pcfg); err != nil {
		s.closeListeners()
		return nil, fmt.Errorf("turn: starting pion server: %w", err)
	}
	return s, nil
}

// streamsListener is ln under netlimit's Listener, with no limits of its
// own (the caps are TURN's: streamSet): its connections read and write
// with raw syscalls, which do not wake the runtime's monitor thread at
// each read of a stream that goes quiet between bursts
// (fastpath/netlimit/sysio_linux.go), and running out of descriptors
// sheds the waiting connections instead of failing every accept
// (fastpath/netlimit/fds.go).
func streamsListener(ln net.Listener) net.Listener {
	return netlimit.Wrap(ln, netlimit.Limits{}, nil)
}

func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return -1
	}
	return v
}

// streamCap is the connection cap for an allocation cap: twice as many,
// so a client can keep a STUN-only connection beside its allocations.
func streamCap(allocs int) int {
	if allocs < 0 {
		return int(^uint(0) >> 1)
	}
	return 2 * allocs
}

// listenPair opens UDP and TCP on the same address. With port 0 the UDP
// port is chosen first and TCP tries the same; another process may hold
// that TCP port, so a few rounds are tried.
func listenPair(addr string) (*net.UDPConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("turn: listen address %q: %w", addr, err)
	}
	var lastErr error
	for range 10 {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("turn: UDP listener: %w", err)
		}
		udp := pc.(*net.UDPConn)
		p := port
		if p == "0" {
			p = strconv.Itoa(udp.LocalAddr().(*net.UDPAddr).Port)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err == nil {
			return udp, ln, nil
		}
		_ = udp.Close()
		lastErr = err
		if port != "0" {
			break
		}
	}
	return nil, nil, fmt.Errorf("turn: TCP listener: %w", lastErr)
}

func (s *Server) closeListeners() {
	if s.udp != nil {
		_ = s.udp.Close()
	}
	if s.tcp != nil {
		_ = s.tcp.Close()
	}
	if s.tlsLn != nil {
		_ = s.tlsLn.Close()
	}
}

// Addr is the UDP listen address (also the TCP one).
func (s *Server) Addr() net.Addr { return s.udp.LocalAddr() }

// TLSAddr is the turns: listen address, nil without TLS.
func (s *Server) TLSAddr() net.Addr {
	if s.tlsLn == nil {
		return nil
	}
	return s.tlsLn.Addr()
}

// Allocations is the number of live allocations.
func (s *Server) Allocations() int { return s.pion.AllocationCount() }

// Shutdown drains: new allocations are refused (508) and no new TCP or
// TLS connection is accepted, while existing allocations keep relaying
// until they end or ctx is done; then everything is closed. It returns
// ctx's error, wrapped, when allocations were still live at the deadline.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	// Closing the OS listeners stops new connections; our Accept wrappers
	// hold pion's accept loops (whose exit would end every allocation of
	// the listener) until the final close below.
	_ = s.tcp.Close()
	if s.tlsLn != nil {
		_ = s.tlsLn.Close()
	}
	var err error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for s.pion.AllocationCount() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = fmt.Errorf("turn: drain cut short with %d allocations: %w", s.pion.AllocationCount(), ctx.Err())
		case <-tick.C:
		}
	}
	s.closeOnce.Do(func() { close(s.closing) })
	if cerr := s.pion.Close(); cerr != nil {
		s.log.Debug("turn: closing pion server", "err", cerr)
	}
	s.streams.closeAll()
	// pion closes the allocations' relay sockets from its own goroutines;
	// wait (briefly) so that the ports are free when Shutdown returns.
	for deadline := time.Now().Add(2 * time.Second); s.pion.AllocationCount() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// authKey is pion's AuthHandler. The gate has already refused wrong,
// malformed and expired credentials with 401; this supplies the key pion
// checks MESSAGE-INTEGRITY with and signs its responses with.
func (s *Server) authKey(username, realm string, _ net.Addr) ([]byte, bool) {
	if realm != s.cfg.Realm {
		return nil, false
	}
	if _, ok := restExpiry(username); !ok {
		return nil, false
	}
	return longTermKey(s.cfg.Secret, username, realm), true
}

// reserve is pion's QuotaHandler, asked before each new allocation.
func (s *Server) reserve(username, _ string, src net.Addr) bool {
	_, stream := src.(*net.TCPAddr)
	if full := s.quotas.reserve(clientKey{stream, addrPort(src)}, username, s.cfg.Now()); full != "" {
		s.metrics.refused(full)
		return false
	}
	return true
}

func (s *Server) onAllocationCreated(src, dst net.Addr, _, username, _ string, relayAddr net.Addr, _ int) {
	t := tupleOf(src, dst)
	s.quotas.commit(t, username)
	s.metrics.allocations.Inc()
	s.metrics.allocationsTotal.Inc()
	r := s.relays.byRelayAddr(relayAddr)
	if r == nil {
		return
	}
	r.username.Store(&username)
	d := &downstream{client: t.client}
	if t.stream {
		sc := s.streams.get(t)
		if sc == nil {
			return // the connection closed already; pion is deleting the allocation
		}
		sc.allocated.Store(true)
		d.stream = sc
	} else {
		d.udp = s.udp
	}
	r.down.Store(d)
	s.relays.attach(t, r)
}

func (s *Server) onAllocationDeleted(src, dst net.Addr, _, _, _ string) {
	t := tupleOf(src, dst)
	s.relays.detach(t)
	s.quotas.release(t)
	s.metrics.allocations.Dec()
	if t.stream {
		if sc := s.streams.get(t); sc != nil {
			sc.allocated.Store(false)
		}
	}
}

// onAllocationError is pion reporting a request it failed to handle; for
// an Allocate past the quota question that gives back the reservation.
// pion reports it before reading the client's next request.
func (s *Server) onAllocationError(src, _ net.Addr, _, _ string) {
	_, stream := src.(*net.TCPAddr)
	s.quotas.cancel(clientKey{stream, addrPort(src)})
}

func (s *Server) onPermissionCreated(_, _ net.Addr, _, _, _ string, relayAddr net.Addr, peer net.IP) {
	if r := s.relays.byRelayAddr(relayAddr); r != nil {
		if ip, ok := netip.AddrFromSlice(peer); ok {
			r.permit(ip.Unmap())
		}
	}
}

func (s *Server) onPermissionDeleted(_, _ net.Addr, _, _, _ string, relayAddr net.Addr, peer net.IP) {
	if r := s.relays.byRelayAddr(relayAddr); r != nil {
		if ip, ok := netip.AddrFromSlice(peer); ok {
			r.unpermit(ip.Unmap())
		}
	}
}

func (s *Server) onChannelCreated(_, _ net.Addr, _, _, _ string, relayAddr, peer net.Addr, number uint16) {
	if r := s.relays.byRelayAddr(relayAddr); r != nil {
		r.bindChannel(number, addrPort(peer))
	}
}

func (s *Server) onChannelDeleted(_, _ net.Addr, _, _, _ string, relayAddr, _ net.Addr, number uint16) {
	if r := s.relays.byRelayAddr(relayAddr); r != nil {
		r.unbindChannel(number)
	}
}
