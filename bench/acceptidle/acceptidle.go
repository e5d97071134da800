// Package acceptidle measures what an accepted HTTP connection costs the
// relay's server before it is anything else (issue 18, the accept path):
// a connection that was accepted and sends nothing, with the listener
// parking it until its first byte (netlimit.Listener.SetParker, the
// server.Service Parker) and without, and, for comparison, a plain HTTP
// keep-alive connection idle after one answered request.
//
// Each figure is one server process of its own (ServeProcess, through
// bench/serverproc), so that its resident memory is the server's alone:
// the memory it holds with n such connections open, less the memory
// before, divided by n, with its goroutines and the runtime's heap and
// stack accounts beside.
package acceptidle

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/park"
	"edgerelay/fastpath/server"
)

// Kind is a kind of idle connection.
type Kind string

const (
	// Silent: accepted, and nothing sent since.
	Silent Kind = "silent"
	// KeepAlive: one request sent and answered, then idle (HTTP/1.1
	// keep-alive).
	KeepAlive Kind = "keepalive"
)

// Kinds are the kinds measured, in order.
var Kinds = []Kind{Silent, KeepAlive}

// The server's settings are the binary's defaults (RELAY_MAX_HEADER_BYTES
// 8192, the fasthttp read buffer), except the timeouts: long enough that
// no connection is timed out while the figures are taken (the default
// header timeout of 10 s is shorter than opening 10,000 connections and
// reading the memory on a loaded machine). The timeouts do not change
// what a connection costs while it waits.
const (
	maxHeaderBytes = 8192
	headerTimeout  = 5 * time.Minute
	idleTimeout    = 5 * time.Minute
)

// ServeProcess is the body of the server process: one fasthttp service
// as fastpath/server runs it, parking connections until their first byte
// when parked is set. It prints "ready <addr>" and answers serverproc's
// commands, and "count" (the connections its listener holds open, those
// waiting included) and "waiting" (those parked).
func ServeProcess(parked, reduceIdle bool, in io.Reader, out io.Writer) error {
	if _, err := serverproc.RaiseFileLimit(); err != nil {
		return err
	}
	svc := server.Service{
		Name: "accept", Addr: "127.0.0.1:0",
		Handler:          func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") },
		HeaderTimeout:    headerTimeout,
		IdleTimeout:      idleTimeout,
		MaxHeaderBytes:   maxHeaderBytes,
		ReduceIdleMemory: reduceIdle,
	}
	if parked {
		set, err := park.New()
		if err != nil {
			return fmt.Errorf("acceptidle: %w", err)
		}
		defer set.Close()
		svc.Parker = set
	}
	l, err := server.Listen(svc, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve() }()
	limited := l.Limited()
	err = serverproc.Serve(serverproc.ServeOptions{
		Ready: l.Addr().String(),
		Commands: serverproc.Commands{
			"count":   func(string) (string, error) { return strconv.Itoa(limited.Open()), nil },
			"waiting": func(string) (string, error) { return strconv.Itoa(limited.Waiting()), nil },
		},
	}, in, out)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if shutErr := l.Shutdown(ctx); shutErr != nil && err == nil {
		err = shutErr
	}
	if serveErr := <-served; serveErr != nil && err == nil {
		err = serveErr
	}
	return err
}

// Options shape Measure.
type Options struct {
	// Argv starts a server process; "-park on" or "-park off" is
	// appended (see cmd/acceptidle). Required.
	Argv []string
	// Env is the server's environment (nil: this process's).
	Env []string
	// Sockets is how many connections each server holds (default 10,000).
	Sockets int
	// Aliases is how many loopback source addresses the connections come
	// from, 127.0.0.2 onwards (default 16).
	Aliases int
	// Rounds is how many servers of each side are measured per kind,
	// alternately parked and unparked (default 1).
	Rounds int
	// Kinds are the kinds measured (default Kinds).
	Kinds []Kind
	// Progress, when not nil, gets one line per server.
	Progress io.Writer
}

// Figure is one server's measurement.
type Figure struct {
	Kind   Kind
	Parked bool
	Round  int
	serverproc.IdleCost
}

// Measure runs a fresh server for each kind, side and round and measures
// what its connections cost.
func Measure(ctx context.Context, o Options) ([]Figure, error) {
	if len(o.Argv) == 0 {
		return nil, fmt.Errorf("acceptidle: Options.Argv is required")
	}
	o.Sockets = cmp(o.Sockets, 10_000)
	o.Aliases = cmp(o.Aliases, 16)
	o.Rounds = cmp(o.Rounds, 1)
	if len(o.Kinds) == 0 {
		o.Kinds = Kinds
	}
	if _, err := serverproc.RaiseFileLimit(); err != nil {
		return nil, err
	}
	var figs []Figure
	for _, kind := range o.Kinds {
		for round := range o.Rounds {
			for _, parked := range []bool{true, false} {
				f, err := measureOne(ctx, o, kind, parked)
				if err != nil {
					return figs, fmt.Errorf("acceptidle: %s, parked %v, round %d: %w", kind, parked, round, err)
				}
				f.Round = round
				figs = append(figs, f)
				if o.Progress != nil {
					fmt.Fprintln(o.Progress, f)
				}
			}
		}
	}
	return figs, nil
}

func cmp(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

func measureOne(ctx context.Context, o Options, kind Kind, parked bool) (Figure, error) {
	f := Figure{Kind: kind, Parked: parked}
	side := "off"
	if parked {
		side = "on"
	}
	argv := append(append([]string(nil), o.Argv...), "-park", side)
	p, err := serverproc.Start(ctx, "acceptidle-"+string(kind)+"-"+side, -1, o.Env, argv...)
	if err != nil {
		return f, err
	}
	defer p.Stop()
	addr := p.Ready
	open := func(ctx context.Context) ([]net.Conn, error) {
		return serverproc.OpenAll(ctx, o.Sockets, func(i int) (net.Conn, error) {
			return dial(addr, serverproc.LoopbackSource(i, o.Aliases), kind)
		})
	}
	f.IdleCost, err = serverproc.MeasureIdle(ctx, p, o.Sockets, open, "")
	return f, err
}

// dial opens one connection of kind to addr from src.
func dial(addr string, src *net.TCPAddr, kind Kind) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: src}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if kind == KeepAlive {
		if err := oneRequest(c); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// oneRequest sends a GET and reads its whole answer, leaving the
// connection open and idle.
func oneRequest(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: relay\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("answered %d", resp.StatusCode)
	}
	_ = c.SetDeadline(time.Time{})
	return err
}

// String is the figure's line of the report.
func (f Figure) String() string {
	side := "unparked"
	if f.Parked {
		side = "parked"
	}
	return fmt.Sprintf("%-9s %-8s %6d conns: RSS %6.1f → %6.1f MiB, %6.0f B each (heap %5.0f, stacks %5.0f), %.2f goroutines each",
		f.Kind, side, f.Sockets, float64(f.Before.RSS)/(1<<20), float64(f.After.RSS)/(1<<20),
		f.PerSocket, f.HeapPerSocket, f.StackPerSocket, f.GoroutinesPerSocket)
}
