package mailboxbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/bench/serverproc"
)

// WatchOptions shape CompareWatchMemory. Zero fields take the defaults noted.
type WatchOptions struct {
	// Binary is the watchmem server program (see BuildWatchmem). Required.
	Binary string
	// Sockets is how many idle watch sockets each server holds. Default
	// 10,000.
	Sockets int
	// PerDirection is how many of them share one direction of a mailbox:
	// at most 8, the spec's cap. Default 8, so 625 mailboxes hold 10,000
	// sockets over their two directions.
	PerDirection int
	// Rounds is how many servers of each kind are measured, alternately;
	// each is a fresh process, so none is a warm-up. Default 1.
	Rounds int
	// ProfileDir, when set, receives a heap profile of each server with
	// its sockets open (watchmem-<impl>-<round>.pprof), for `go tool pprof`.
	ProfileDir string
	// Progress, when not nil, gets one line per server.
	Progress io.Writer
}

func (o WatchOptions) withDefaults() (WatchOptions, error) {
	if o.Sockets == 0 {
		o.Sockets = 10_000
	}
	if o.PerDirection == 0 {
		o.PerDirection = 8
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	switch {
	case o.Binary == "":
		return o, errors.New("mailboxbench: WatchOptions.Binary is required (see BuildWatchmem)")
	case o.Sockets < 1 || o.Rounds < 1:
		return o, errors.New("mailboxbench: Sockets and Rounds must be positive")
	case o.PerDirection < 1 || o.PerDirection > 8:
		return o, fmt.Errorf("mailboxbench: %d sockets per direction: the spec allows 1 to 8", o.PerDirection)
	}
	return o, nil
}

// WatchSide is one server's memory with its sockets open (the growth
// per socket, and the server's own reports before and after).
type WatchSide = serverproc.IdleCost

// WatchReport is the outcome of CompareWatchMemory: the costs of each
// round's servers, their medians and ratio.
type WatchReport struct {
	Options WatchOptions // defaults filled in
	serverproc.IdleComparison
}

// BuildWatchmem builds cmd/watchmem into dir and returns its path.
// moduleDir is any directory inside the edgerelay module.
func BuildWatchmem(ctx context.Context, moduleDir, dir string) (string, error) {
	return serverproc.Build(ctx, moduleDir, dir, "edgerelay/bench/mailboxbench/cmd/watchmem")
}

// CompareWatchMemory measures what an idle watch socket costs our relay
// and the baseline. For each, a watchmem server process starts; the
// benchmark claims the mailboxes over HTTP and reads the server's memory,
// opens Sockets watch sockets from this process (raw TCP: an upgrade
// request, the 101, then silence), waits until the server holds them all,
// and reads its memory again. Each socket's share is the difference
// divided by the sockets.
//
// Everything runs on 127.0.0.1 and is bounded: the server exits when this
// side closes its standard input, or by itself after ten minutes.
func CompareWatchMemory(ctx context.Context, o WatchOptions) (WatchReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return WatchReport{}, err
	}
	if err := serverproc.EnsureFiles(o.Sockets, 256); err != nil {
		return WatchReport{}, fmt.Errorf("mailboxbench: %w", err)
	}
	c, err := serverproc.CompareIdle(o.Rounds, "watch sockets", o.Progress, func(side, round int) (WatchSide, error) {
		return measureWatch(ctx, serverproc.Sides[side], round, o)
	})
	if err != nil {
		return WatchReport{}, fmt.Errorf("mailboxbench: %w", err)
	}
	return WatchReport{Options: o, IdleComparison: c}, nil
}

func measureWatch(ctx context.Context, impl string, round int, o WatchOptions) (side WatchSide, err error) {
	srv, err := serverproc.Start(ctx, "watchmem "+impl, -1, nil, o.Binary, "-impl", impl)
	if err != nil {
		return side, err
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()
	perMailbox := 2 * o.PerDirection
	mailboxes := (o.Sockets + perMailbox - 1) / perMailbox
	if err := claimAll(ctx, srv.Ready, mailboxes); err != nil {
		return side, err
	}
	profile := ""
	if o.ProfileDir != "" {
		profile = filepath.Join(o.ProfileDir, fmt.Sprintf("watchmem-%s-%d.pprof", impl, round))
	}
	return serverproc.MeasureIdle(ctx, srv, o.Sockets, func(ctx context.Context) ([]net.Conn, error) {
		return openWatches(ctx, srv.Ready, o)
	}, profile)
}

// claimAll claims mailboxes 0..n-1 over HTTP, many at a time so that
// their synced writes share syncs.
func claimAll(ctx context.Context, addr string, n int) error {
	client := newClient(addr, 32)
	defer client.CloseIdleConnections()
	return serverproc.ForEach(ctx, n, 32, func(i int) error {
		var req fasthttp.Request
		var resp fasthttp.Response
		req.SetRequestURI("http://" + addr + mailboxPath(i))
		req.Header.SetMethod(fasthttp.MethodPut)
		req.Header.Set("Authorization", "Bearer "+token)
		if err := client.DoTimeout(&req, &resp, 10*time.Second); err != nil {
			return err
		}
		if resp.StatusCode() != fasthttp.StatusCreated {
			return fmt.Errorf("claim %d: %d %s", i, resp.StatusCode(), resp.Body())
		}
		return nil
	})
}

// openWatches opens o.Sockets watch sockets, PerDirection on each
// direction of mailboxes 0, 1, …, the way a client does (the bearer in
// Authorization, subprotocol zerobyte.v1). An idle reader of an empty
// mailbox is sent nothing until the first ping, 30 s later.
func openWatches(ctx context.Context, addr string, o WatchOptions) ([]net.Conn, error) {
	return serverproc.OpenAll(ctx, o.Sockets, func(i int) (net.Conn, error) {
		dir := [2]string{"p2c", "c2p"}[(i/o.PerDirection)%2]
		mailbox := i / (2 * o.PerDirection)
		return serverproc.DialUpgrade(addr, mailboxPath(mailbox)+"/"+dir+"/watch",
			"Sec-WebSocket-Protocol: zerobyte.v1", "Authorization: Bearer "+token)
	})
}
