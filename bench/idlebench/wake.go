package idlebench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/relayserve"
	"edgerelay/bench/serverproc"
)

// WakeOptions shape MeasureWake. Zero fields take the defaults noted.
type WakeOptions struct {
	// Binary is cmd/idleserve (see Build). Required.
	Binary string
	// Sockets is how many watch sockets a server holds, each on the p2c
	// direction of a mailbox of its own. Default 1,000.
	Sockets int
	// Deliveries is how many envelopes one server delivers, one at a
	// time, to the sockets in turn (so each socket has been idle for
	// Sockets deliveries when its next one comes). Default 3,000.
	Deliveries int
	// Rounds is how many servers of each side deliver, alternately, each
	// a fresh process. Default 2.
	Rounds int
	// EnvelopeSize is each envelope's bytes (at least 25). Default 256.
	EnvelopeSize int
	// Progress, when not nil, gets one line per server.
	Progress io.Writer
}

func (o WakeOptions) withDefaults() (WakeOptions, error) {
	if o.Sockets == 0 {
		o.Sockets = 1_000
	}
	if o.Deliveries == 0 {
		o.Deliveries = 3_000
	}
	if o.Rounds == 0 {
		o.Rounds = 2
	}
	if o.EnvelopeSize == 0 {
		o.EnvelopeSize = 256
	}
	switch {
	case o.Binary == "":
		return o, errors.New("idlebench: WakeOptions.Binary is required (see Build)")
	case o.Sockets < 1 || o.Deliveries < 1 || o.Rounds < 1:
		return o, errors.New("idlebench: Sockets, Deliveries and Rounds must be positive")
	case o.EnvelopeSize < 25:
		return o, fmt.Errorf("idlebench: %d-byte envelopes: at least 25", o.EnvelopeSize)
	}
	return o, nil
}

// WakeRound is one server's deliveries.
type WakeRound struct {
	Deliveries int
	// P50 and P99 are the delivery latency's: from the PUT's first byte
	// sent to the envelope's last byte read from the watch socket.
	P50, P99 time.Duration
	// CPUPerDelivery and AllocsPerDelivery are the server's CPU time
	// (user and system, getrusage) and heap allocations over the
	// deliveries, divided by them: the PUT, its synced write and the
	// delivery together.
	CPUPerDelivery    time.Duration
	AllocsPerDelivery float64
	// Parked is how many of the sockets were parked before the first
	// delivery.
	Parked int
	// Pings, PingP50 and PingP99 are the client's own wake of its
	// socket: a text "ping" written to the watch socket, timed until its
	// "pong" is read. Parked, the ping's readability is what wakes the
	// socket onto a goroutine (the delivery above only starts a writer).
	// CPUPerPing is the server's CPU per ping.
	Pings            int
	PingP50, PingP99 time.Duration
	CPUPerPing       time.Duration
	// Keepalives is the same for the WebSocket's own keepalive: an empty
	// ping frame (RFC 6455 5.5.2, as native clients send them) timed
	// until its pong frame is read; a browser's pong to the server's ping
	// wakes a parked socket the same way. No handler takes part.
	Keepalives                 int
	KeepaliveP50, KeepaliveP99 time.Duration
	CPUPerKeepalive            time.Duration
}

// WakeReport is the outcome of MeasureWake.
type WakeReport struct {
	Options          WakeOptions // defaults filled in
	Parked, Unparked []WakeRound
	// The medians over the rounds of each side's figures, and what
	// parking adds to them (parked minus unparked: negative is faster).
	ParkedP50, ParkedP99, UnparkedP50, UnparkedP99 time.Duration
	ParkedCPU, UnparkedCPU                         time.Duration
	AddedP50, AddedP99, AddedCPU                   time.Duration
	// The same for the pings.
	ParkedPingP50, ParkedPingP99, UnparkedPingP50, UnparkedPingP99 time.Duration
	ParkedPingCPU, UnparkedPingCPU                                 time.Duration
	AddedPingP99, AddedPingCPU                                     time.Duration
	// And for the keepalives.
	ParkedKeepaliveP50, ParkedKeepaliveP99, UnparkedKeepaliveP50, UnparkedKeepaliveP99 time.Duration
	ParkedKeepaliveCPU, UnparkedKeepaliveCPU                                           time.Duration
	AddedKeepaliveP99, AddedKeepaliveCPU                                               time.Duration
}

// MeasureWake measures the cost of waking a parked socket: an envelope
// PUT to a mailbox whose watch socket is parked, beside the same to one
// whose socket keeps its reader goroutine, each side an idleserve
// process of its own (alternately, fresh processes). The deliveries go
// one at a time over one keep-alive connection, round robin over the
// sockets, and each is timed from the PUT's sending to the envelope's
// arrival on its watch socket. The store lives on /dev/shm where there
// is one (see ServeProcess), so that the PUT's synced write does not
// drown what parking adds.
func MeasureWake(ctx context.Context, o WakeOptions) (WakeReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return WakeReport{}, err
	}
	if err := serverproc.EnsureFiles(o.Sockets, fdHeadroom); err != nil {
		return WakeReport{}, fmt.Errorf("idlebench: %w", err)
	}
	runs, err := abtest.Named(naming("wake", o.Progress), o.Rounds, func(side, _ int) (WakeRound, error) {
		return wakeOne(ctx, o, side)
	}, func(side, round int, r WakeRound) string {
		return fmt.Sprintf("round %d wake %-8s %d deliveries to %d watch sockets (%d parked): p50 %v, p99 %v, server CPU %v and %.1f allocations per delivery; %d pings: p50 %v, p99 %v, server CPU %v per ping; %d keepalives: p50 %v, p99 %v, server CPU %v per keepalive",
			round, Sides[side], r.Deliveries, o.Sockets, r.Parked, r.P50, r.P99, r.CPUPerDelivery, r.AllocsPerDelivery,
			r.Pings, r.PingP50, r.PingP99, r.CPUPerPing, r.Keepalives, r.KeepaliveP50, r.KeepaliveP99, r.CPUPerKeepalive)
	})
	if err != nil {
		return WakeReport{}, err
	}
	rep := WakeReport{Options: o, Parked: runs[0], Unparked: runs[1]}
	// Each figure's medians, parked and unparked, and what parking adds.
	med := func(f func(WakeRound) time.Duration) (parked, unparked, added time.Duration) {
		p, u := abtest.Medians(runs, func(r WakeRound) float64 { return float64(f(r)) })
		return time.Duration(p), time.Duration(u), time.Duration(p) - time.Duration(u)
	}
	rep.ParkedP50, rep.UnparkedP50, rep.AddedP50 = med(func(r WakeRound) time.Duration { return r.P50 })
	rep.ParkedP99, rep.UnparkedP99, rep.AddedP99 = med(func(r WakeRound) time.Duration { return r.P99 })
	rep.ParkedCPU, rep.UnparkedCPU, rep.AddedCPU = med(func(r WakeRound) time.Duration { return r.CPUPerDelivery })
	rep.ParkedPingP50, rep.UnparkedPingP50, _ = med(func(r WakeRound) time.Duration { return r.PingP50 })
	rep.ParkedPingP99, rep.UnparkedPingP99, rep.AddedPingP99 = med(func(r WakeRound) time.Duration { return r.PingP99 })
	rep.ParkedPingCPU, rep.UnparkedPingCPU, rep.AddedPingCPU = med(func(r WakeRound) time.Duration { return r.CPUPerPing })
	rep.ParkedKeepaliveP50, rep.UnparkedKeepaliveP50, _ = med(func(r WakeRound) time.Duration { return r.KeepaliveP50 })
	rep.ParkedKeepaliveP99, rep.UnparkedKeepaliveP99, rep.AddedKeepaliveP99 = med(func(r WakeRound) time.Duration { return r.KeepaliveP99 })
	rep.ParkedKeepaliveCPU, rep.UnparkedKeepaliveCPU, rep.AddedKeepaliveCPU = med(func(r WakeRound) time.Duration { return r.CPUPerKeepalive })
	return rep, nil
}

// wakeLayout is socket i on the p2c direction of mailbox i.
func wakeLayout(n int) Layout { return Layout{Kind: Watch, Sockets: 2 * n, PerDirection: 1} }

func wakeOne(ctx context.Context, o WakeOptions, side int) (r WakeRound, err error) {
	srv, err := startServer(ctx, o.Binary, side, false, 0, "-ping", idlePing.String(), "-mailboxes", strconv.Itoa(o.Sockets))
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()
	l := wakeLayout(o.Sockets)
	conns, err := serverproc.OpenAll(ctx, o.Sockets, func(i int) (net.Conn, error) { return asConn(srv.client.open(ctx, l, 2*i)) })
	defer closeAll(conns)
	if err != nil {
		return r, err
	}
	if err := srv.WaitCount(ctx, o.Sockets); err != nil {
		return r, err
	}
	if side == 0 {
		if r.Parked, err = srv.settleParked(ctx, o.Sockets); err != nil {
			return r, err
		}
	}
	// OpenAll keeps its order: conns[i] watches mailbox i.
	socks := make([]*sock, len(conns))
	for i, c := range conns {
		socks[i] = c.(*sock)
	}
	put, err := newPutter(srv.client.mailboxAddr, o.EnvelopeSize)
	if err != nil {
		return r, err
	}
	defer put.close()
	lat := make([]time.Duration, 0, o.Deliveries)
	u, err := srv.Measure(ctx, func() error {
		buf := make([]byte, o.EnvelopeSize)
		for k := range o.Deliveries {
			i, seq := k%o.Sockets, uint64(k/o.Sockets+1)
			d, err := put.deliver(socks[i], i, seq, buf)
			if err != nil {
				return fmt.Errorf("delivery %d (mailbox %d, envelope %d): %w", k, i, seq, err)
			}
			lat = append(lat, d)
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.Deliveries = len(lat)
	r.P50, r.P99 = percentiles(lat)
	r.CPUPerDelivery = u.CPU / time.Duration(r.Deliveries)
	r.AllocsPerDelivery = float64(u.Mallocs) / float64(r.Deliveries)

	if r.Pings, r.PingP50, r.PingP99, r.CPUPerPing, err = roundTrips(ctx, srv, socks, side, o, textPing); err != nil {
		return r, err
	}
	r.Keepalives, r.KeepaliveP50, r.KeepaliveP99, r.CPUPerKeepalive, err = roundTrips(ctx, srv, socks, side, o, keepalive)
	return r, err
}

// roundTrips times o.Deliveries exchanges x over the sockets. A pass
// takes every socket once, and the next waits until they have parked
// again (a socket that read data parks ws.DefaultParkAfter later), so
// that every exchange meets a parked socket; only the passes are in the
// CPU figure.
func roundTrips(ctx context.Context, srv *relayProc, socks []*sock, side int, o WakeOptions, x exchange) (n int, p50, p99, cpu time.Duration, err error) {
	took := make([]time.Duration, 0, o.Deliveries)
	var total time.Duration
	buf := make([]byte, 64)
	for len(took) < o.Deliveries {
		if side == 0 {
			if n, err := srv.settleParked(ctx, o.Sockets); err != nil {
				return 0, 0, 0, 0, err
			} else if n < o.Sockets {
				return 0, 0, 0, 0, fmt.Errorf("%d of %d sockets parked again after a pass of %s", n, o.Sockets, x.name)
			}
		}
		u, err := srv.Measure(ctx, func() error {
			for i := 0; i < o.Sockets && len(took) < o.Deliveries; i++ {
				d, err := socks[i].roundTrip(x, buf)
				if err != nil {
					return fmt.Errorf("%s %d (socket %d): %w", x.name, len(took), i, err)
				}
				took = append(took, d)
			}
			return nil
		})
		if err != nil {
			return 0, 0, 0, 0, err
		}
		total += u.CPU
	}
	p50, p99 = percentiles(took)
	return len(took), p50, p99, total / time.Duration(len(took)), nil
}

// percentiles sorts v and returns its p50 and p99.
func percentiles(v []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(v)
	return v[len(v)/2], v[min(len(v)-1, len(v)*99/100)]
}

// An exchange is a client frame and the answer it waits for.
type exchange struct {
	name   string
	frame  []byte // masked (RFC 6455 5.3) with the key 1, 2, 3, 4
	op     byte
	answer string
}

// maskedFrame is a client's frame of opcode op, masked with 1, 2, 3, 4.
func maskedFrame(op byte, payload string) []byte {
	key := [4]byte{1, 2, 3, 4}
	f := []byte{0x80 | op, 0x80 | byte(len(payload)), key[0], key[1], key[2], key[3]}
	for i, b := range []byte(payload) {
		f = append(f, b^key[i%4])
	}
	return f
}

var (
	// textPing is the mailbox watch's "ping" text message, answered with
	// a "pong" text by the service.
	textPing = exchange{"pings", maskedFrame(0x1, "ping"), 0x1, "pong"}
	// keepalive is an empty ping frame, answered with a pong frame by the
	// WebSocket layer.
	keepalive = exchange{"keepalives", maskedFrame(0x9, ""), 0xA, ""}
)

// roundTrip writes x's frame on the socket and returns the time until its
// answer is read.
func (s *sock) roundTrip(x exchange, buf []byte) (time.Duration, error) {
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := s.Write(x.frame); err != nil {
		return 0, err
	}
	for {
		op, payload, err := s.readFrame(buf)
		if err != nil {
			return 0, fmt.Errorf("waiting for the answer: %w", err)
		}
		if op == x.op && string(payload) == x.answer {
			return time.Since(start), nil
		}
	}
}

// putter PUTs envelopes over one keep-alive connection, by hand, so that
// the PUT and the watch socket's read are timed apart from any client
// library's pooling.
type putter struct {
	nc   net.Conn
	br   *bufio.Reader
	addr string
	env  []byte
	req  []byte
}

func newPutter(addr string, size int) (*putter, error) {
	nc, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, err
	}
	return &putter{nc: nc, br: bufio.NewReader(nc), addr: addr, env: make([]byte, size)}, nil
}

func (p *putter) close() { _ = p.nc.Close() }

// deliver PUTs envelope seq into mailbox i's p2c direction and reads it
// from s, its watcher, into buf; it returns the time from the request's
// sending to the envelope's arrival, then reads the PUT's answer (a 201).
func (p *putter) deliver(s *sock, i int, seq uint64, buf []byte) (time.Duration, error) {
	envelope(p.env, seq)
	p.req = fmt.Appendf(p.req[:0], "PUT %s/p2c/%d HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", relayserve.MailboxPath(i), seq, p.addr, relayserve.Token, len(p.env))
	p.req = append(p.req, p.env...)
	deadline := time.Now().Add(10 * time.Second)
	_ = p.nc.SetDeadline(deadline)
	_ = s.SetReadDeadline(deadline)
	start := time.Now()
	if _, err := p.nc.Write(p.req); err != nil {
		return 0, err
	}
	var took time.Duration
	for {
		op, payload, err := s.readFrame(buf)
		if err != nil {
			return 0, fmt.Errorf("reading the watch socket: %w", err)
		}
		if op != 2 { // a text "pong" or the like: not the envelope
			continue
		}
		took = time.Since(start)
		if len(payload) != len(p.env) || binary.BigEndian.Uint64(payload[1:9]) != seq {
			return 0, fmt.Errorf("the watch delivered %d bytes of envelope %d, want %d bytes of %d",
				len(payload), binary.BigEndian.Uint64(payload[1:9]), len(p.env), seq)
		}
		break
	}
	resp, err := http.ReadResponse(p.br, nil)
	if err != nil {
		return 0, fmt.Errorf("reading the PUT's answer: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("PUT answered %d %s", resp.StatusCode, body)
	}
	return took, nil
}

// envelope fills env as envelope seq: the version byte, the sequence, and
// filler for the ciphertext (the relay checks only the first two).
func envelope(env []byte, seq uint64) {
	env[0] = 0x01
	binary.BigEndian.PutUint64(env[1:9], seq)
	for j := 9; j < len(env); j++ {
		env[j] = byte(seq) + byte(j)
	}
}
