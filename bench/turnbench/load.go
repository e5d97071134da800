package turnbench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"edgerelay/turn/turntest"
)

// Transport is how the load's clients reach the TURN server. Every
// transport relays to the same UDP echo peers; only the client leg
// differs.
type Transport string

const (
	// UDP: pion's client allocates over a UDP socket, then raw ChannelData
	// datagrams (RFC 8656 §12.5).
	UDP Transport = "udp"
	// TCP: TURN over one TCP connection per allocation (RFC 8656 §12.5:
	// ChannelData framed in the stream, padded to 4 bytes).
	TCP Transport = "tcp"
	// TLS: as TCP, inside TLS (turns:).
	TLS Transport = "tls"
)

// LoadOptions shapes one load run against one server.
type LoadOptions struct {
	// Server is the TURN server's address for Transport (the UDP and TCP
	// listeners share a port; TLS has its own); Secret its REST
	// credentials' secret.
	Server netip.AddrPort
	Secret string
	// Transport is the client leg. Default UDP.
	Transport Transport
	// TLS is the client's TLS configuration for Transport TLS.
	TLS *tls.Config
	// Allocations is the concurrent allocations (each its own client
	// socket, five-tuple and relay socket). Default 8.
	Allocations int
	// Window is the datagrams in flight per allocation. Default 16, or
	// twice GSO when GSO is above 1; with GSO it must be a multiple of GSO.
	Window int
	// GSO, above 1, sends the client's datagrams (UDP only) as GSO runs:
	// GSO datagrams of the same size per sendmsg, with a UDP_SEGMENT
	// control message. On loopback the run stays one buffer until a
	// receiving socket: one with UDP_GRO on gets it coalesced in one read
	// (our server), one without gets the datagrams one by one (coturn).
	// A freed window slot waits until GSO slots are free, then they go as
	// one run. 0 or 1: one datagram per send. At most 64 (the kernel's
	// UDP_MAX_SEGMENTS), and a run's bytes at most 65,507.
	GSO int
	// PeerGSO has the echo peers send back in GSO runs of GSO datagrams
	// too (runPeer), so that input arrives coalesced on both of the
	// server's legs; without it they send one datagram at a time. Needs
	// GSO above 1.
	PeerGSO bool
	// Payload is the ChannelData payload in bytes, at least 16. Default 120.
	Payload int
	// Warmup runs before counting starts; Duration is the counted time.
	// Defaults 300 ms and 2 s.
	Warmup, Duration time.Duration
	// OnCounting, when not nil, is called as counting starts and again as
	// it stops, so the caller can take the server's CPU time and counters
	// over exactly the counted window.
	OnCounting func(start bool) error
}

// maxGSOSegments is the kernel's UDP_MAX_SEGMENTS before Linux 6.9
// (128 since): the longest run every kernel takes.
const maxGSOSegments = 64

func (o LoadOptions) withDefaults() (LoadOptions, error) {
	if o.Transport == "" {
		o.Transport = UDP
	}
	if o.Allocations == 0 {
		o.Allocations = 8
	}
	if o.GSO <= 1 {
		o.GSO = 1
	}
	if o.Window == 0 {
		o.Window = 16
		if o.GSO > 1 {
			o.Window = 2 * o.GSO
		}
	}
	if o.Payload == 0 {
		o.Payload = 120
	}
	if o.Warmup == 0 {
		o.Warmup = 300 * time.Millisecond
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Second
	}
	switch o.Transport {
	case UDP, TCP:
	case TLS:
		if o.TLS == nil {
			return o, errors.New("turnbench: transport tls needs LoadOptions.TLS")
		}
	default:
		return o, fmt.Errorf("turnbench: transport %q: want udp, tcp or tls", o.Transport)
	}
	if o.Payload < 16 || o.Payload > 1400 {
		return o, fmt.Errorf("turnbench: payload %d: need 16 to 1400 bytes", o.Payload)
	}
	if o.PeerGSO && o.GSO <= 1 {
		return o, errors.New("turnbench: echo peers in GSO runs need the clients' GSO runs (GSO above 1)")
	}
	if o.GSO > 1 {
		if o.Transport != UDP {
			return o, fmt.Errorf("turnbench: GSO runs need transport udp, not %s", o.Transport)
		}
		if o.GSO > maxGSOSegments || o.GSO*(4+o.Payload) > gsoMaxBytes {
			return o, fmt.Errorf("turnbench: GSO runs of %d × %d bytes: at most %d datagrams and %d bytes a run",
				o.GSO, 4+o.Payload, maxGSOSegments, gsoMaxBytes)
		}
		if o.Window%o.GSO != 0 {
			return o, fmt.Errorf("turnbench: window %d is not a multiple of the GSO run %d", o.Window, o.GSO)
		}
	}
	return o, nil
}

// gsoMaxBytes is a GSO run's most payload: 65,535 less IPv4's and UDP's
// headers.
const gsoMaxBytes = 65535 - 20 - 8

// LoadResult is what one run counted in its counted window.
type LoadResult struct {
	// Relayed is the datagrams the server relayed: those the echo peer got
	// (client to peer) plus those the clients got back (peer to client).
	Relayed uint64
	// Lost is the datagrams presumed lost (not back within lossTimeout)
	// and sent again.
	Lost    uint64
	Elapsed time.Duration
	// SendErrors is the client's sends that failed over the whole run
	// (warm-up included), and SendError the first one's error.
	SendErrors uint64
	SendError  error
	// TLSSuite is the cipher suite the first client negotiated (TLS only).
	TLSSuite string
}

// lossTimeout is how long a datagram may take before it counts as lost
// and its window slot is refilled. Loopback round trips take tens of
// microseconds, even under load well under a few milliseconds.
const lossTimeout = 50 * time.Millisecond

// RunLoad allocates through the server (each allocation binds a channel
// to a UDP echo peer of its own), then keeps Window datagrams in flight
// per allocation, raw ChannelData, for Warmup plus Duration, and counts.
// Each echo frees its slot, refilled at once from the client's read
// goroutine (with GSO, once a run's worth of slots is free), so the
// offered load follows what the server relays; a datagram not back within
// lossTimeout is sent again.
func RunLoad(ctx context.Context, o LoadOptions) (LoadResult, error) {
	o, err := o.withDefaults()
	if err != nil {
		return LoadResult{}, err
	}
	var (
		streams  []*stream
		peers    []echoPeer
		back     atomic.Uint64
		tlsSuite string
	)
	defer func() {
		for _, s := range streams {
			s.c.close()
		}
		for _, p := range peers {
			_ = p.Close()
		}
	}()
	bindCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := range o.Allocations {
		// A peer per allocation: a server that relays in bursts must not
		// overflow one shared socket's receive buffer (about a hundred
		// datagrams by default) and have the generator count the loss.
		peer, err := newEchoPeer(o)
		if err != nil {
			return LoadResult{}, err
		}
		peers = append(peers, peer)
		c, err := dialClient(bindCtx, o, fmt.Sprintf("load-%d", i), unmapped(peer.Addr().AddrPort()))
		if err != nil {
			return LoadResult{}, fmt.Errorf("turnbench: allocation %d over %s: %w", i, o.Transport, err)
		}
		streams = append(streams, newStream(c, o, &back))
		if sc, ok := c.(*streamClient); ok && i == 0 {
			tlsSuite = sc.tlsSuite()
		}
	}
	for _, s := range streams {
		s.start()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // refill the slots of lost datagrams
		defer wg.Done()
		tick := time.NewTicker(lossTimeout / 5)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				for _, s := range streams {
					s.resendLost(now)
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	for _, s := range streams {
		s.fill()
	}

	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(o.Warmup); err != nil {
		return LoadResult{}, err
	}
	lost := func() (n uint64) {
		for _, s := range streams {
			n += s.lost.Load()
		}
		return n
	}
	if o.OnCounting != nil {
		if err := o.OnCounting(true); err != nil {
			return LoadResult{}, err
		}
	}
	start := time.Now()
	received := func() (n uint64) {
		for _, p := range peers {
			n += p.Received()
		}
		return n
	}
	peer0, back0, lost0 := received(), back.Load(), lost()
	if err := sleep(o.Duration); err != nil {
		return LoadResult{}, err
	}
	res := LoadResult{
		Relayed:  received() - peer0 + back.Load() - back0,
		Lost:     lost() - lost0,
		Elapsed:  time.Since(start),
		TLSSuite: tlsSuite,
	}
	if o.OnCounting != nil {
		if err := o.OnCounting(false); err != nil {
			return LoadResult{}, err
		}
	}
	for _, s := range streams {
		s.stop()
		n, err := s.sendErrors()
		res.SendErrors += n
		if res.SendError == nil {
			res.SendError = err
		}
	}
	if res.Relayed == 0 {
		return res, fmt.Errorf("turnbench: nothing was relayed (%d failed sends, the first: %v)", res.SendErrors, res.SendError)
	}
	return res, nil
}

// client is one allocation's client side, whichever the transport: its
// channel is bound to the echo peer before the load starts.
type client interface {
	// channel is the bound channel's number.
	channel() uint16
	// stride is the bytes a ChannelData frame of payload bytes takes on
	// the wire: 4 + payload, padded to 4 bytes on a stream.
	stride(payload int) int
	// start hands every ChannelData payload from the server to onEcho,
	// from one goroutine, until close.
	start(onEcho func(payload []byte))
	// send writes n frames laid out back to back in buf, stride bytes
	// each, headers filled in.
	send(buf []byte, n, stride int) error
	close()
}

func dialClient(ctx context.Context, o LoadOptions, label string, peer netip.AddrPort) (client, error) {
	if o.Transport == UDP {
		return dialUDPClient(ctx, o, label, peer)
	}
	return dialStreamClient(ctx, o, label, peer)
}

// stream is one allocation's window of datagrams. Each datagram carries
// its slot number and the slot's sequence number; an echo for the slot's
// current sequence frees the slot, which is refilled (at once, or with
// GSO once a run's worth is free), and a stale one (its slot was presumed
// lost and refilled) is ignored, so the window stays Window datagrams
// wide.
type stream struct {
	c       client
	ch      uint16
	payload int
	stride  int
	run     int // datagrams per send (LoadOptions.GSO)
	back    *atomic.Uint64
	lost    atomic.Uint64
	running atomic.Bool

	mu   sync.Mutex // guards what follows; echoes and the loss ticker both send
	seq  []uint32
	sent []time.Time // zero while the slot is free, waiting in pending
	// pending are free slots waiting to be sent as one run, since
	// pendingSince.
	pending      []int
	pendingSince time.Time
	frames       []byte // run frames of stride bytes
	errs         uint64
	firstErr     error
}

func newStream(c client, o LoadOptions, back *atomic.Uint64) *stream {
	stride := c.stride(o.Payload)
	return &stream{
		c: c, ch: c.channel(), payload: o.Payload, stride: stride, run: o.GSO, back: back,
		seq: make([]uint32, o.Window), sent: make([]time.Time, o.Window),
		pending: make([]int, 0, o.Window),
		frames:  make([]byte, o.GSO*stride),
	}
}

// start takes over the client's ChannelData.
func (s *stream) start() {
	s.running.Store(true)
	s.c.start(s.onEcho)
}

func (s *stream) stop() { s.running.Store(false) }

func (s *stream) sendErrors() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs, s.firstErr
}

func (s *stream) onEcho(p []byte) {
	if len(p) < 8 {
		return
	}
	slot := int(binary.BigEndian.Uint32(p[0:4]))
	seq := binary.BigEndian.Uint32(p[4:8])
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot >= len(s.seq) || s.seq[slot] != seq || s.sent[slot].IsZero() {
		return // stale: the slot was refilled after a presumed loss
	}
	s.back.Add(1)
	if s.running.Load() {
		s.freeLocked(slot, time.Now())
	}
}

// fill sends the whole window.
func (s *stream) fill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for slot := range s.seq {
		s.freeLocked(slot, now)
	}
	s.sendPendingLocked(now)
}

// resendLost frees the slots of datagrams out longer than lossTimeout and
// sends them again at once, with any free slots that have waited a tick
// for a run to fill (a run never fills while datagrams are lost).
func (s *stream) resendLost(now time.Time) {
	if !s.running.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	lost := false
	for slot, at := range s.sent {
		if !at.IsZero() && now.Sub(at) > lossTimeout {
			s.lost.Add(1)
			s.freeLocked(slot, now)
			lost = true
		}
	}
	if len(s.pending) > 0 && (lost || now.Sub(s.pendingSince) >= lossTimeout/5) {
		s.sendPendingLocked(now)
	}
}

// freeLocked queues the slot for its next datagram, and sends a run once
// run slots are free.
func (s *stream) freeLocked(slot int, now time.Time) {
	s.sent[slot] = time.Time{}
	if len(s.pending) == 0 {
		s.pendingSince = now
	}
	s.pending = append(s.pending, slot)
	if len(s.pending) >= s.run {
		s.sendPendingLocked(now)
	}
}

// sendPendingLocked sends the free slots' next datagrams, in runs.
func (s *stream) sendPendingLocked(now time.Time) {
	for i := 0; i < len(s.pending); {
		n := min(s.run, len(s.pending)-i)
		for k, slot := range s.pending[i : i+n] {
			s.seq[slot]++
			s.sent[slot] = now
			f := s.frames[k*s.stride : (k+1)*s.stride]
			binary.BigEndian.PutUint16(f[0:2], s.ch)
			binary.BigEndian.PutUint16(f[2:4], uint16(s.payload))
			binary.BigEndian.PutUint32(f[4:8], uint32(slot))
			binary.BigEndian.PutUint32(f[8:12], s.seq[slot])
		}
		if err := s.c.send(s.frames[:n*s.stride], n, s.stride); err != nil {
			if s.errs == 0 {
				s.firstErr = err
			}
			s.errs++
		}
		i += n
	}
	s.pending = s.pending[:0]
}

// newEchoPeer is an echo peer on the server's loopback address, in GSO
// runs with PeerGSO.
func newEchoPeer(o LoadOptions) (echoPeer, error) {
	at := netip.AddrPortFrom(o.Server.Addr(), 0)
	if o.PeerGSO {
		return newRunPeer(at, o.GSO)
	}
	return turntest.NewEchoPeer(at.String())
}

func unmapped(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
