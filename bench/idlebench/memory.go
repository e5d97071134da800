package idlebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"edgerelay/bench/abtest"
	"edgerelay/bench/serverproc"
)

// MemoryOptions shape MeasureMemory. Zero fields take the defaults noted.
type MemoryOptions struct {
	// Binary is cmd/idleserve (see Build). Required.
	Binary string
	// Sockets is how many idle sockets of each kind a server holds.
	// Default 10,000. More than the open-file limit allows (each socket
	// is a descriptor on both sides) is capped to what it allows, and
	// the report says so.
	Sockets int
	// Kinds are the sockets measured (default the four WebSockets and
	// the two connections of the accept path), each plain and, unless
	// PlainOnly, over TLS.
	Kinds     []Kind
	PlainOnly bool
	// Rounds is how many servers of each side are measured per kind,
	// alternately (parked, unparked, parked, …), each a fresh process.
	// Default 2.
	Rounds int
	// Aliases is how many loopback source addresses the sockets come
	// from (default DefaultAliases).
	Aliases int
	// ProfileDir, when set, receives a heap profile of each server with
	// its sockets open (idle-<kind>[-tls]-<side>-<round>.pprof).
	ProfileDir string
	// Progress, when not nil, gets one line per server.
	Progress io.Writer
}

func (o MemoryOptions) withDefaults() (MemoryOptions, error) {
	if o.Sockets == 0 {
		o.Sockets = 10_000
	}
	if len(o.Kinds) == 0 {
		o.Kinds = append(Kinds[:len(Kinds):len(Kinds)], AcceptKinds...)
	}
	if o.Rounds == 0 {
		o.Rounds = 2
	}
	switch {
	case o.Binary == "":
		return o, errors.New("idlebench: MemoryOptions.Binary is required (see Build)")
	case o.Sockets < 1 || o.Rounds < 1:
		return o, errors.New("idlebench: Sockets and Rounds must be positive")
	}
	for _, k := range o.Kinds {
		if _, err := ParseKind(string(k)); err != nil {
			return o, err
		}
	}
	return o, nil
}

// IdleRound is one server's measurement: serverproc's (the growth of its
// memory per socket), and the sockets it held when it was read (the
// phones' control sockets included) and how many of them were parked.
type IdleRound struct {
	serverproc.IdleCost
	Held, Parked int
}

// MemoryFigure is what one kind of idle socket costs, parked and
// unparked, over the rounds.
type MemoryFigure struct {
	Kind Kind
	TLS  bool
	// Controls is the control sockets open under the phones before the
	// first reading (phone only): their cost is in neither figure.
	Controls         int
	Parked, Unparked []IdleRound
	// ParkedMedian and UnparkedMedian are the medians of the bytes per
	// socket; Ratio is ParkedMedian / UnparkedMedian (below 1: parking
	// saves).
	ParkedMedian, UnparkedMedian, Ratio float64
	// GoalBytes is the most a parked socket may cost, and GoalText says
	// what it is: the 3 KiB plain and 6 KiB TLS for a WebSocket;
	// for a connection that never upgraded, no more than an idle
	// WebSocket (the parked watch socket's median of the same run, plain
	// or TLS alike, when it was measured).
	GoalBytes float64
	GoalText  string
}

// Name is the figure's name: "watch", "phone TLS", …
func (f MemoryFigure) Name() string {
	if f.TLS {
		return string(f.Kind) + " TLS"
	}
	return string(f.Kind)
}

// MemoryReport is the outcome of MeasureMemory.
type MemoryReport struct {
	Options MemoryOptions // defaults filled in
	// Requested is the sockets asked for; Options.Sockets what was
	// measured. FileLimit is the open-file limit (after raising the soft
	// limit to the hard one); Capped says that it cut Requested down.
	Requested int
	FileLimit uint64
	Capped    bool
	Figures   []MemoryFigure
}

// CapNote says, when the sockets were capped, why, in a sentence.
func (r MemoryReport) CapNote() string {
	if !r.Capped {
		return ""
	}
	return fmt.Sprintf("CAPPED: %d sockets asked, but the open-file limit (RLIMIT_NOFILE hard limit) is %d, so %d were measured; "+
		"raise the hard limit (CAP_SYS_RESOURCE, or limits.conf) to measure %d", r.Requested, r.FileLimit, r.Options.Sockets, r.Requested)
}

// fdHeadroom is the descriptors a process needs besides its sockets: the
// store's files, listeners, pipes, the runtime's.
const fdHeadroom = 512

// capSockets is the most sockets of a kind (the phones' control sockets
// besides) that a limit of lim descriptors holds, in whole thousands
// when that is at least a thousand.
func capSockets(want int, lim uint64) (int, bool) {
	if lim <= fdHeadroom {
		return 1, true
	}
	// Phones add a control socket per 32.
	most := int((lim - fdHeadroom) * 32 / 33)
	if want <= most {
		return want, false
	}
	if most >= 1000 {
		most -= most % 1000
	}
	return max(most, 1), true
}

// MeasureMemory measures what an idle socket of each kind costs a relay
// with and without parking, plain and over TLS. For each, an idleserve
// process starts (not pinned: nothing is timed) with the mailboxes or
// computers the sockets need claimed; the benchmark reads its memory,
// opens the sockets from this process (an upgrade request, the 101, then
// silence; phones on control sockets opened before the first reading;
// for the accept path's kinds a connection and nothing, or one request
// and its answer), waits until the server holds them all and, parking,
// until the WebSockets have parked, and reads its memory again
// (serverproc.MeasureIdle). The servers ping once an hour, so no ping is
// sent, answered or missed meanwhile.
func MeasureMemory(ctx context.Context, o MemoryOptions) (MemoryReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return MemoryReport{}, err
	}
	rep := MemoryReport{Requested: o.Sockets}
	if rep.FileLimit, err = serverproc.RaiseFileLimit(); err != nil {
		return rep, err
	}
	o.Sockets, rep.Capped = capSockets(o.Sockets, rep.FileLimit)
	rep.Options = o
	if rep.Capped && o.Progress != nil {
		fmt.Fprintln(o.Progress, rep.CapNote())
	}
	tlsModes := []bool{false, true}
	if o.PlainOnly {
		tlsModes = tlsModes[:1]
	}
	for _, kind := range o.Kinds {
		for _, useTLS := range tlsModes {
			f, err := measureKind(ctx, o, kind, useTLS)
			if err != nil {
				return rep, err
			}
			rep.Figures = append(rep.Figures, f)
		}
	}
	setGoals(rep.Figures)
	return rep, nil
}

// setGoals sets each figure's goal (see MemoryFigure.GoalBytes).
func setGoals(figs []MemoryFigure) {
	watch := map[bool]float64{}
	for _, f := range figs {
		if f.Kind == Watch {
			watch[f.TLS] = f.ParkedMedian
		}
	}
	for i := range figs {
		f := &figs[i]
		f.GoalBytes, f.GoalText = GoalPlainBytes, "≤ 3 KiB per socket (the issue's goal at 100,000)"
		if f.TLS {
			f.GoalBytes, f.GoalText = GoalTLSBytes, "≤ 6 KiB per socket (the issue's goal at 100,000)"
		}
		if w, ok := watch[f.TLS]; ok && !f.Kind.upgrades() {
			f.GoalBytes, f.GoalText = w, fmt.Sprintf("≤ an idle WebSocket's %.1f KiB (the parked watch socket's, this run)", w/1024)
		}
	}
}

func measureKind(ctx context.Context, o MemoryOptions, kind Kind, useTLS bool) (MemoryFigure, error) {
	l := DefaultLayout(kind, o.Sockets)
	f := MemoryFigure{Kind: kind, TLS: useTLS, Controls: l.Controls()}
	runs, err := abtest.Named(naming(f.Name(), o.Progress), o.Rounds, func(side, round int) (IdleRound, error) {
		return measureOne(ctx, o, l, useTLS, side, round)
	}, func(side, round int, r IdleRound) string {
		return fmt.Sprintf("round %d idle %-11s %-8s %d: %s, %d of %d parked", round, f.Name(), Sides[side], r.Sockets, r.Summary(), r.Parked, r.Held)
	})
	if err != nil {
		return f, err
	}
	f.Parked, f.Unparked = runs[0], runs[1]
	f.ParkedMedian, f.UnparkedMedian = medianPerSocket(f.Parked), medianPerSocket(f.Unparked)
	f.Ratio = f.ParkedMedian / f.UnparkedMedian
	return f, nil
}

func medianPerSocket(rounds []IdleRound) float64 {
	return abtest.Median(abtest.Values(rounds, func(r IdleRound) float64 { return r.PerSocket }))
}

// idlePing is the servers' ping interval in the memory and wake figures:
// beyond any run, since the clients never answer.
const idlePing = time.Hour

// acceptHeaderTimeout is the servers' header timeout in the figures of
// connections that never upgrade: beyond any run.
const acceptHeaderTimeout = 10 * time.Minute

func measureOne(ctx context.Context, o MemoryOptions, l Layout, useTLS bool, side, round int) (r IdleRound, err error) {
	flags := []string{"-ping", idlePing.String(), "-mailboxes", strconv.Itoa(l.Mailboxes()), "-computers", strconv.Itoa(l.Computers())}
	if !l.Kind.upgrades() {
		// The server counts connections, and keeps those that send
		// nothing (the binary closes them after its 10 s header
		// timeout) through the measurement.
		flags = append(flags, "-count", "conns", "-header-timeout", acceptHeaderTimeout.String())
	}
	srv, err := startServer(ctx, o.Binary, side, useTLS, o.Aliases, flags...)
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()
	controls, err := serverproc.OpenAll(ctx, l.Controls(), func(i int) (net.Conn, error) { return asConn(srv.client.openControl(ctx, i)) })
	defer closeAll(controls)
	if err != nil {
		return r, err
	}
	if err := srv.WaitCount(ctx, len(controls)); err != nil {
		return r, err
	}
	// The control sockets park before the first reading, so that what
	// they hold is in both readings.
	if side == 0 {
		if _, err := srv.settleParked(ctx, len(controls)); err != nil {
			return r, err
		}
	}
	profile := ""
	if o.ProfileDir != "" {
		profile = filepath.Join(o.ProfileDir, fmt.Sprintf("idle-%s-%s-%d.pprof", kindFile(l.Kind, useTLS), Sides[side], round))
	}
	total := len(controls) + l.Sockets
	r.Held = total
	r.IdleCost, err = serverproc.MeasureIdle(ctx, srv.Proc, l.Sockets, func(ctx context.Context) ([]net.Conn, error) {
		conns, err := serverproc.OpenAll(ctx, l.Sockets, func(i int) (net.Conn, error) { return asConn(srv.client.open(ctx, l, i)) })
		if err != nil {
			return conns, err
		}
		// Parking, every socket is read parked: the reading waits for
		// the last ones opened to park (a second after their upgrade).
		if err := srv.WaitCount(ctx, total); err != nil {
			return conns, err
		}
		if side == 0 && l.Kind.upgrades() {
			r.Parked, err = srv.settleParked(ctx, total)
		}
		if side == 0 && l.Kind == KeepAlive {
			// Parked a second after their answers; fasthttp then lets
			// the goroutines that served them go a moment later (an
			// idle worker after 2 s): the figure is read once they
			// have, down to the server's own few dozen.
			if r.Parked, err = srv.settleParked(ctx, l.Sockets); err == nil {
				err = srv.settleGoroutines(ctx, serverGoroutines)
			}
		}
		return conns, err
	}, profile)
	return r, err
}

// serverGoroutines bounds the goroutines of a relay with nothing to
// serve (its listeners, timers, the park set's and the runtime's own).
const serverGoroutines = 100

func kindFile(k Kind, useTLS bool) string {
	if useTLS {
		return string(k) + "-tls"
	}
	return string(k)
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// asConn is a socket as serverproc.OpenAll takes it: no socket is a nil
// net.Conn, not a nil *sock inside one.
func asConn(s *sock, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}
