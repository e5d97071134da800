package turnbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"edgerelay/turn"
	"edgerelay/turn/turntest"
)

// LoadOptions shapes one load run against one server.
type LoadOptions struct {
	// Server is the TURN server's UDP address; Secret and Realm its REST
	// credentials' secret and realm.
	Server netip.AddrPort
	Secret string
	// Allocations is the concurrent allocations (each its own client
	// socket, five-tuple and relay socket). Default 8.
	Allocations int
	// Window is the datagrams in flight per allocation. Default 16.
	Window int
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

func (o LoadOptions) withDefaults() LoadOptions {
	if o.Allocations == 0 {
		o.Allocations = 8
	}
	if o.Window == 0 {
		o.Window = 16
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
	return o
}

// LoadResult is what one run counted in its counted window.
type LoadResult struct {
	// Relayed is the datagrams the server relayed: those the echo peer got
	// (client to peer) plus those the clients got back (peer to client).
	Relayed uint64
	// Lost is the datagrams presumed lost (not back within lossTimeout)
	// and sent again.
	Lost    uint64
	Elapsed time.Duration
}

// lossTimeout is how long a datagram may take before it counts as lost
// and its window slot is refilled. Loopback round trips take tens of
// microseconds, even under load well under a few milliseconds.
const lossTimeout = 50 * time.Millisecond

// RunLoad allocates through the server with pion's client (each
// allocation binds a channel to one UDP echo peer), then keeps Window
// datagrams in flight per allocation, raw ChannelData, for Warmup plus
// Duration, and counts. Each echo sends the next datagram from the
// client's read goroutine, so the offered load follows what the server
// relays; a datagram not back within lossTimeout is sent again.
func RunLoad(ctx context.Context, o LoadOptions) (LoadResult, error) {
	o = o.withDefaults()
	if o.Payload < 16 || o.Payload > 1400 {
		return LoadResult{}, fmt.Errorf("turnbench: payload %d: need 16 to 1400 bytes", o.Payload)
	}
	var (
		streams []*stream
		peers   []*turntest.EchoPeer
		back    atomic.Uint64
	)
	defer func() {
		for _, s := range streams {
			s.alloc.Close()
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
		peer, err := turntest.NewEchoPeer(netip.AddrPortFrom(o.Server.Addr(), 0).String())
		if err != nil {
			return LoadResult{}, err
		}
		peers = append(peers, peer)
		user, pass := turn.Credentials(o.Secret, fmt.Sprintf("load-%d", i), time.Hour, time.Now())
		a, err := turntest.Allocate(o.Server, user, pass)
		if err != nil {
			return LoadResult{}, fmt.Errorf("turnbench: allocation %d: %w", i, err)
		}
		s := newStream(a, o.Window, o.Payload, &back)
		streams = append(streams, s)
		if _, err := a.BindChannel(bindCtx, peer.Addr()); err != nil {
			return LoadResult{}, fmt.Errorf("turnbench: allocation %d: %w", i, err)
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
		Relayed: received() - peer0 + back.Load() - back0,
		Lost:    lost() - lost0,
		Elapsed: time.Since(start),
	}
	if o.OnCounting != nil {
		if err := o.OnCounting(false); err != nil {
			return LoadResult{}, err
		}
	}
	for _, s := range streams {
		s.stop()
	}
	if res.Relayed == 0 {
		return res, errors.New("turnbench: nothing was relayed")
	}
	return res, nil
}

// stream is one allocation's window of datagrams. Each datagram carries
// its slot number and the slot's sequence number; an echo for the slot's
// current sequence frees the slot, which is refilled at once, and a stale
// one (its slot was presumed lost and refilled) is ignored, so the window
// stays Window datagrams wide.
type stream struct {
	alloc   *turntest.Allocation
	payload int
	back    *atomic.Uint64
	lost    atomic.Uint64
	running atomic.Bool

	mu    sync.Mutex // guards the slots and frame; echoes and the loss ticker both send
	seq   []uint32
	sent  []time.Time
	frame []byte
}

func newStream(a *turntest.Allocation, window, payload int, back *atomic.Uint64) *stream {
	return &stream{
		alloc: a, payload: payload, back: back,
		seq: make([]uint32, window), sent: make([]time.Time, window),
		frame: make([]byte, 4+payload),
	}
}

// start takes over the client's ChannelData from pion.
func (s *stream) start() {
	s.running.Store(true)
	s.alloc.Conn.OnData(s.onEcho)
}

func (s *stream) stop() { s.running.Store(false) }

func (s *stream) onEcho(p []byte) {
	if len(p) < 8 {
		return
	}
	slot := int(binary.BigEndian.Uint32(p[0:4]))
	seq := binary.BigEndian.Uint32(p[4:8])
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot >= len(s.seq) || s.seq[slot] != seq {
		return // stale: the slot was refilled after a presumed loss
	}
	s.back.Add(1)
	if s.running.Load() {
		s.sendLocked(slot, time.Now())
	}
}

func (s *stream) fill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for slot := range s.seq {
		s.sendLocked(slot, now)
	}
}

func (s *stream) resendLost(now time.Time) {
	if !s.running.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, at := range s.sent {
		if now.Sub(at) > lossTimeout {
			s.lost.Add(1)
			s.sendLocked(slot, now)
		}
	}
}

func (s *stream) sendLocked(slot int, now time.Time) {
	s.seq[slot]++
	s.sent[slot] = now
	binary.BigEndian.PutUint32(s.frame[4:8], uint32(slot))
	binary.BigEndian.PutUint32(s.frame[8:12], s.seq[slot])
	_ = s.alloc.Conn.Send(s.frame)
}
