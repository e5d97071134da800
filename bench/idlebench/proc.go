package idlebench

import (
	"context"
	"errors"
	"io"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/serverproc"
)

// Build builds cmd/idleserve into dir and returns its path. moduleDir is
// any directory inside the edgerelay module ("" for the working
// directory).
func Build(ctx context.Context, moduleDir, dir string) (string, error) {
	return serverproc.Build(ctx, moduleDir, dir, "edgerelay/bench/idlebench/cmd/idleserve")
}

// Sides of every comparison here, in abtest's order: today's path (a
// reader goroutine per socket) is the baseline the parked figures are
// set beside.
var Sides = [2]string{"parked", "unparked"}

// naming names a figure's errors ("idlebench: what, parked, round 0: …")
// and progress for abtest.Named.
func naming(what string, progress io.Writer) abtest.Naming {
	return abtest.Naming{What: "idlebench: " + what, Sides: Sides, Progress: progress}
}

func parkFlag(side int) string {
	if side == 0 {
		return "on"
	}
	return "off"
}

// relayProc is one running idleserve.
type relayProc struct {
	*serverproc.Proc
	client *client
}

// startServer starts bin for one side with the extra flags given, and a
// client for it.
func startServer(ctx context.Context, bin string, side int, useTLS bool, aliases int, flags ...string) (*relayProc, error) {
	args := append([]string{bin, "-park", parkFlag(side)}, flags...)
	name := "idleserve " + Sides[side]
	if useTLS {
		args = append(args, "-tls")
		name += " TLS"
	}
	p, err := serverproc.Start(ctx, name, -1, nil, args...)
	if err != nil {
		return nil, err
	}
	c, err := newClient(p.Ready, useTLS, aliases)
	if err != nil {
		return nil, errors.Join(err, p.Stop())
	}
	return &relayProc{Proc: p, client: c}, nil
}

// parked asks how many sockets the server holds parked.
func (s *relayProc) parked(ctx context.Context) (int, error) { return s.AskInt(ctx, "parked") }

// refused asks what the listeners refused and hold.
func (s *relayProc) refused(ctx context.Context) (Refusals, error) {
	var r Refusals
	err := s.AskJSON(ctx, "refused", &r)
	return r, err
}

// settleParked waits until want sockets are parked, or until the count
// has not moved for parkSettle (a socket parks ws.DefaultParkAfter after
// its last input, so a count that stands still that long will not
// reach want): it returns the count either way, for the figure to show.
func (s *relayProc) settleParked(ctx context.Context, want int) (int, error) {
	return settle(ctx, s.parked, func(n int) bool { return n >= want })
}

// settleGoroutines waits until the server runs at most want goroutines,
// or until the count has not moved for parkSettle.
func (s *relayProc) settleGoroutines(ctx context.Context, want int) error {
	_, err := settle(ctx, func(ctx context.Context) (int, error) {
		m, err := s.Mem(ctx)
		return m.Goroutines, err
	}, func(n int) bool { return n <= want })
	return err
}

// settle reads a count until it is reached, or until it has not moved
// for parkSettle, and returns its last value.
func settle(ctx context.Context, read func(context.Context) (int, error), reached func(int) bool) (int, error) {
	last, since := -1, time.Now()
	for {
		n, err := read(ctx)
		if err != nil || reached(n) {
			return n, err
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > parkSettle {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// parkSettle is how long a parked count may stand still below its target
// before the sockets left are taken to be sockets that do not park.
const parkSettle = 3 * time.Second
