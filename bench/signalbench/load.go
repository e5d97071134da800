package signalbench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// loadResult is one round of load on one relay.
type loadResult struct {
	Frames  uint64        // frames the relay forwarded, both directions
	Elapsed time.Duration // from the first frame sent to the last echo read
}

// runLoad drives every pair for d: each primary keeps window frames in
// flight to its companion, which echoes each one back, so every round
// trip is two forwarded frames. When d has passed, each primary sends a
// stop frame after its last one and reads the echoes still due; the round
// ends when every pair has seen its stop frame come back. Nothing here
// allocates per frame.
func runLoad(ctx context.Context, pairs []*pair, f *frames, window int, d time.Duration) (loadResult, error) {
	deadline := time.Now().Add(d + 30*time.Second) // only if a relay stops forwarding
	for _, p := range pairs {
		_ = p.primary.nc.SetDeadline(deadline)
		_ = p.companion.nc.SetDeadline(deadline)
	}
	var over atomic.Bool
	counts := make([]uint64, len(pairs))
	errs := make([]error, 2*len(pairs))
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.AfterFunc(d, func() { over.Store(true) })
	defer timer.Stop()
	stopCtx := context.AfterFunc(ctx, func() { over.Store(true) })
	defer stopCtx()
	for i, p := range pairs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs[2*i] = echo(p.companion, f)
		}()
		go func() {
			defer wg.Done()
			counts[i], errs[2*i+1] = drive(p.primary, f, window, &over)
			if errs[2*i+1] != nil {
				// The companion waits for a stop frame that will not
				// come: end its wait now rather than at the deadline.
				_ = p.companion.nc.SetReadDeadline(time.Now())
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return loadResult{}, err
	}
	var total uint64
	for _, n := range counts {
		total += n
	}
	return loadResult{Frames: 2 * total, Elapsed: elapsed}, nil
}

// drive is one primary's side of a round: window frames out, then one
// more for every echo read until over, then the stop frame. It returns
// the round trips completed, the stop frame's included.
func drive(c *rawConn, f *frames, window int, over *atomic.Bool) (uint64, error) {
	buf := make([]byte, f.size)
	for range window {
		if _, err := c.nc.Write(f.masked); err != nil {
			return 0, err
		}
	}
	var n uint64
	stopSent := false
	for {
		stopped, err := c.readBinary(buf, f.payload, f.stop)
		if err != nil {
			return n, fmt.Errorf("primary: %w", err)
		}
		n++
		if stopped {
			return n, nil
		}
		if stopSent {
			continue
		}
		frame := f.masked
		if over.Load() {
			frame, stopSent = f.stopMask, true
		}
		if _, err := c.nc.Write(frame); err != nil {
			return n, err
		}
	}
}

// echo is one companion's side of a round: every frame goes back as it
// came, until the stop frame has.
func echo(c *rawConn, f *frames) error {
	buf := make([]byte, f.size)
	for {
		stopped, err := c.readBinary(buf, f.payload, f.stop)
		if err != nil {
			return fmt.Errorf("companion: %w", err)
		}
		frame := f.masked
		if stopped {
			frame = f.stopMask
		}
		if _, err := c.nc.Write(frame); err != nil {
			return err
		}
		if stopped {
			return nil
		}
	}
}
