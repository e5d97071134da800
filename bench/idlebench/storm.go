package idlebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/netlimit"
)

// The binary's default listener limits (RELAY_MAX_CONNS_PER_IP,
// RELAY_ACCEPT_RATE, RELAY_ACCEPT_BURST in cmd/edgerelay/config), which
// the storm runs against. RELAY_MAX_CONNS (10,000) is raised to twice the
// storm's sockets, as an operator holding that many devices would: right
// after a cut the relay still holds old sockets whose resets it has not
// read yet while their clients' new ones arrive.
const (
	BinaryMaxConnsPerIP = 1000
	BinaryAcceptRate    = 1000
	BinaryAcceptBurst   = 2000
)

// StormOptions shape MeasureStorm. Zero fields take the defaults noted.
type StormOptions struct {
	// Binary is cmd/idleserve (see Build). Required.
	Binary string
	// Sockets is how many watch sockets drop and reconnect at once: one
	// on each direction of Sockets/2 mailboxes, as a link's two devices
	// hold them. Default 10,000.
	Sockets int
	// Rounds is how many servers of each side are stormed, alternately,
	// each a fresh process. Default 1.
	Rounds int
	// Limits are the listener's; zero fields take the binary's defaults
	// above (MaxConns twice Sockets).
	Limits netlimit.Limits
	// TLS storms a TLS listener: every reconnect a full handshake.
	TLS bool
	// Aliases is how many loopback source addresses the sockets come
	// from (default DefaultAliases).
	Aliases int
	// Progress, when not nil, gets one line per server.
	Progress io.Writer
}

func (o StormOptions) withDefaults() (StormOptions, error) {
	if o.Sockets == 0 {
		o.Sockets = 10_000
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	if o.Limits.MaxConns == 0 {
		o.Limits.MaxConns = 2 * o.Sockets
	}
	if o.Limits.MaxConnsPerIP == 0 {
		o.Limits.MaxConnsPerIP = BinaryMaxConnsPerIP
	}
	if o.Limits.AcceptRate == 0 {
		o.Limits.AcceptRate = BinaryAcceptRate
	}
	if o.Limits.AcceptBurst == 0 {
		o.Limits.AcceptBurst = BinaryAcceptBurst
	}
	switch {
	case o.Binary == "":
		return o, errors.New("idlebench: StormOptions.Binary is required (see Build)")
	case o.Sockets < 2 || o.Rounds < 1:
		return o, errors.New("idlebench: at least 2 sockets and 1 round")
	}
	return o, o.Limits.Validate()
}

// StormRound is one server's storm.
type StormRound struct {
	Sockets int
	// Open is the time the first opening of every socket took (through
	// the same limits), Reconnect the time from the cut (every socket
	// reset at once) until every client held a new socket, Settled until
	// the server held exactly Sockets again.
	Open, Reconnect, Settled time.Duration
	// Attempts is the reconnections tried (Sockets of them succeeded; the
	// rest were refused and tried again after a back-off).
	Attempts int
	// Refused is what the listener refused, by reason, over the
	// reconnection.
	Refused Refusals
	// Floor is the least time the accept rate allows for the
	// reconnection: the sockets past the burst at AcceptRate.
	Floor time.Duration
	// Parked is how many of the new sockets were parked once settled.
	Parked int
}

// StormReport is the outcome of MeasureStorm.
type StormReport struct {
	Options          StormOptions // defaults filled in
	Parked, Unparked []StormRound
	// Medians of Reconnect.
	ParkedReconnect, UnparkedReconnect time.Duration
}

// Check says what broke the storm's contract in r: a refusal for any
// reason but the accept rate, more accepted than the rate's bucket
// allows in the time, a client left without a socket.
func (o StormOptions) Check(r StormRound) error {
	var errs []error
	if n := r.Refused.BeyondRate(); n > 0 {
		errs = append(errs, fmt.Errorf("%d refusals beyond the accept rate (%+v)", n, r.Refused))
	}
	if r.Sockets != o.Sockets {
		errs = append(errs, fmt.Errorf("%d of %d sockets reconnected", r.Sockets, o.Sockets))
	}
	// The bucket lets in its burst, then AcceptRate a second: every socket
	// in sooner than that would mean the rate was not applied.
	if o.Limits.AcceptRate > 0 && r.Reconnect < r.Floor*9/10 {
		errs = append(errs, fmt.Errorf("%d sockets in %v, under the accept rate's floor of %v", r.Sockets, r.Reconnect, r.Floor))
	}
	if r.Attempts-r.Sockets < int(r.Refused.Rate) {
		errs = append(errs, fmt.Errorf("%d rate refusals but only %d failed attempts", r.Refused.Rate, r.Attempts-r.Sockets))
	}
	return errors.Join(errs...)
}

// MeasureStorm measures a reconnect storm against the accept path: an
// idleserve process (parked, then unparked, alternately) with the
// binary's listener limits holds Sockets idle watch sockets; every one is
// reset at once, as a network blip or a NAT rebinding cuts them, and every
// client reconnects at the same instant, a refused one trying again after
// an exponential back-off (100 ms doubling to 2 s, jittered) as real
// clients do. It reports the time until every client is back, and what
// the listener refused; there must be no refusal but the accept rate's.
func MeasureStorm(ctx context.Context, o StormOptions) (StormReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return StormReport{}, err
	}
	if err := serverproc.EnsureFiles(o.Sockets, fdHeadroom); err != nil {
		return StormReport{}, fmt.Errorf("idlebench: %w", err)
	}
	runs, err := abtest.Named(naming("storm", o.Progress), o.Rounds, func(side, _ int) (StormRound, error) {
		return stormOne(ctx, o, side)
	}, func(side, round int, r StormRound) string {
		return fmt.Sprintf("round %d storm %-8s %d watch sockets: opened in %v; reset, all back in %v (floor %v, server settled %v), %d attempts, refused %+v, %d parked",
			round, Sides[side], r.Sockets, r.Open.Round(time.Millisecond), r.Reconnect.Round(time.Millisecond), r.Floor.Round(time.Millisecond),
			r.Settled.Round(time.Millisecond), r.Attempts, r.Refused, r.Parked)
	})
	if err != nil {
		return StormReport{}, err
	}
	rep := StormReport{Options: o, Parked: runs[0], Unparked: runs[1]}
	p, u := abtest.Medians(runs, func(r StormRound) float64 { return float64(r.Reconnect) })
	rep.ParkedReconnect, rep.UnparkedReconnect = time.Duration(p), time.Duration(u)
	return rep, nil
}

func stormOne(ctx context.Context, o StormOptions, side int) (r StormRound, err error) {
	lim := o.Limits
	srv, err := startServer(ctx, o.Binary, side, o.TLS, o.Aliases, "-ping", idlePing.String(),
		"-mailboxes", strconv.Itoa(ceilDiv(o.Sockets, 2)),
		"-max-conns", strconv.Itoa(lim.MaxConns), "-max-conns-per-ip", strconv.Itoa(lim.MaxConnsPerIP),
		"-accept-rate", strconv.FormatFloat(lim.AcceptRate, 'g', -1, 64), "-accept-burst", strconv.Itoa(lim.AcceptBurst))
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()
	l := Layout{Kind: Watch, Sockets: o.Sockets, PerDirection: 1}
	socks := make([]*sock, o.Sockets)
	defer func() {
		for _, s := range socks {
			if s != nil {
				_ = s.Close()
			}
		}
	}()

	start := time.Now()
	if _, err := reconnectAll(ctx, srv.client, l, socks); err != nil {
		return r, err
	}
	r.Open = time.Since(start)
	if err := srv.WaitCount(ctx, o.Sockets); err != nil {
		return r, err
	}
	// The storm starts on a full bucket, as after a quiet while: the
	// opening emptied it, and it refills at AcceptRate.
	if lim.AcceptRate > 0 {
		refill := time.Duration(float64(lim.AcceptBurst) / lim.AcceptRate * float64(time.Second))
		select {
		case <-time.After(refill):
		case <-ctx.Done():
			return r, ctx.Err()
		}
		r.Floor = time.Duration(float64(max(0, o.Sockets-lim.AcceptBurst)) / lim.AcceptRate * float64(time.Second))
	}
	before, err := srv.refused(ctx)
	if err != nil {
		return r, err
	}

	// The cut: every socket reset at once.
	for i, s := range socks {
		_ = s.Close()
		socks[i] = nil
	}
	cut := time.Now()
	attempts, err := reconnectAll(ctx, srv.client, l, socks)
	r.Reconnect, r.Attempts = time.Since(cut), attempts
	if err != nil {
		return r, err
	}
	if err := srv.WaitCount(ctx, o.Sockets); err != nil {
		return r, err
	}
	r.Settled = time.Since(cut)
	after, err := srv.refused(ctx)
	if err != nil {
		return r, err
	}
	r.Refused = Refusals{Total: after.Total - before.Total, PerIP: after.PerIP - before.PerIP,
		Rate: after.Rate - before.Rate, FDs: after.FDs - before.FDs, Silent: after.Silent - before.Silent,
		Other: after.Other - before.Other, Open: after.Open}
	for _, s := range socks {
		if s != nil {
			r.Sockets++
		}
	}
	if side == 0 {
		if r.Parked, err = srv.settleParked(ctx, o.Sockets); err != nil {
			return r, err
		}
	}
	return r, nil
}

// The clients' back-off after a refusal: the first wait, its doubling's
// cap, and the whole reconnection's bound.
const (
	backoffFirst = 100 * time.Millisecond
	backoffMax   = 2 * time.Second
	stormBound   = 2 * time.Minute
)

// reconnectAll opens every socket of l into socks at once, one goroutine
// per client, each trying again after a jittered exponential back-off
// when refused, and returns the attempts made.
func reconnectAll(ctx context.Context, c *client, l Layout, socks []*sock) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, stormBound)
	defer cancel()
	var attempts atomic.Int64
	errs := make([]error, len(socks))
	var wg sync.WaitGroup
	for i := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait := backoffFirst
			for {
				attempts.Add(1)
				s, err := c.open(ctx, l, i)
				if err == nil {
					socks[i] = s
					return
				}
				var refused *refusedError
				if errors.As(err, &refused) || ctx.Err() != nil {
					// An answer other than 101 is the relay's, not the
					// listener's: it is not retried.
					errs[i] = err
					return
				}
				jittered := wait/2 + rand.N(wait)
				select {
				case <-time.After(jittered):
				case <-ctx.Done():
					errs[i] = fmt.Errorf("socket %d: %w (last: %v)", i, ctx.Err(), err)
					return
				}
				wait = min(2*wait, backoffMax)
			}
		}()
	}
	wg.Wait()
	return int(attempts.Load()), errors.Join(errs...)
}
