package mailboxbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/bench/abtest"
	"edgerelay/bench/serverproc"
)

// PinnedOptions shape ComparePinned. Zero fields take the defaults noted.
type PinnedOptions struct {
	// Rounds per side and figure; the first warms up and is not counted,
	// so at least 2. Default 6.
	Rounds int
	// RoundTime is how long one side serves one kind of request in one
	// round. Default 2 s (CPU time is read in 10 ms ticks).
	RoundTime time.Duration
	// PutRoundTime is how long one side writes in one PUT round; RoundTime
	// when zero. Synced writes follow the disk's fsync latency, which
	// drifts from second to second, so the report gives them longer
	// rounds than the reads.
	PutRoundTime time.Duration
	// Conns is the read load's keep-alive connections, one request in
	// flight on each. Default 8.
	Conns int
	// Pipeline is the depth of the pipelined read figures: each
	// connection writes this many requests at once, then reads their
	// answers (see readOp). Default 16, TechEmpower's depth; 1 leaves the
	// pipelined figures out.
	Pipeline int
	// Mailboxes, Stored and EnvelopeSize shape the read servers' stores
	// as in ReadOptions. Defaults 64, 100 and 1024 (EnvelopeSize is the
	// PUTs' size too).
	Mailboxes, Stored, EnvelopeSize int
	// Writers lists the PUT comparison's concurrent writer counts, each
	// writer on a mailbox (ours) or key range (Pebble) of its own.
	// Default 1 and 64.
	Writers []int
	// ServerCPU and LoadCPU are the cores the server processes and this
	// process (the load generator) are pinned to. Defaults 0 and 1.
	// Pinning is skipped, and the report says so, on a machine with one
	// core or without taskset.
	ServerCPU, LoadCPU int
	// Binary is cmd/mailboxserve; built into a temporary directory (from
	// the working directory, which must be inside the module) when empty.
	Binary string
	// DataDir holds the servers' stores, one directory each, on one
	// disk; a temporary directory (removed afterwards) when empty.
	DataDir string
	// ProfileDir, when set, adds one uncounted run of each side per
	// figure, after the counted ones, under a CPU profile written there
	// (mailboxserve-<figure>-<side>.pprof); the report holds the top of
	// each.
	ProfileDir string
	// ServerGOMAXPROCS, when positive, is the servers' GOMAXPROCS (all
	// of them alike). Otherwise the processes that commit to Pebble
	// (ours, raw Pebble, the PUT floor) run with the Ps the relay runs
	// with, at least two (store.EnsureProcs), and the net/http baseline
	// and the HEAD floor with the runtime's default, one on one pinned
	// core, which is their fastest.
	ServerGOMAXPROCS int
	// EnvelopeCache is our relay's envelope cache in bytes: 0 the
	// default, as serve runs; negative none, so that every GET of the
	// reads is a first read through Pebble.
	EnvelopeCache int
	// Progress, when not nil, gets one line per measurement.
	Progress io.Writer
}

func (o PinnedOptions) withDefaults() (PinnedOptions, error) {
	if o.Rounds == 0 {
		o.Rounds = 6
	}
	if o.RoundTime == 0 {
		o.RoundTime = 2 * time.Second
	}
	if o.PutRoundTime == 0 {
		o.PutRoundTime = o.RoundTime
	}
	if o.Conns == 0 {
		o.Conns = 8
	}
	if o.Pipeline == 0 {
		o.Pipeline = 16
	}
	if o.Mailboxes == 0 {
		o.Mailboxes = 64
	}
	if o.Stored == 0 {
		o.Stored = 100
	}
	if o.EnvelopeSize == 0 {
		o.EnvelopeSize = 1024
	}
	if len(o.Writers) == 0 {
		o.Writers = []int{1, 64}
	}
	if o.ServerCPU == 0 && o.LoadCPU == 0 {
		o.LoadCPU = 1
	}
	// The read checks are ReadOptions'.
	if _, err := (ReadOptions{Rounds: o.Rounds, Conns: o.Conns, Mailboxes: o.Mailboxes,
		Stored: o.Stored, EnvelopeSize: o.EnvelopeSize}).withDefaults(); err != nil {
		return o, err
	}
	for _, w := range o.Writers {
		if w < 1 {
			return o, fmt.Errorf("mailboxbench: %d writers", w)
		}
	}
	if o.Pipeline < 1 {
		return o, fmt.Errorf("mailboxbench: pipeline depth %d", o.Pipeline)
	}
	if o.ServerGOMAXPROCS < 0 {
		return o, fmt.Errorf("mailboxbench: ServerGOMAXPROCS %d", o.ServerGOMAXPROCS)
	}
	if o.ServerCPU == o.LoadCPU || o.ServerCPU < 0 || o.LoadCPU < 0 {
		return o, fmt.Errorf("mailboxbench: server core %d and load core %d: want two distinct cores", o.ServerCPU, o.LoadCPU)
	}
	return o, nil
}

// PinnedRun is one counted run of one side.
type PinnedRun struct {
	// Ops is the requests answered (or commits made) in Elapsed.
	Ops     uint64
	Elapsed time.Duration
	// CPU is the server process's user and system time over the run.
	CPU time.Duration
	// Mallocs is the server process's heap allocations over the run.
	Mallocs uint64
}

// PerSec is operations per wall second.
func (r PinnedRun) PerSec() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// PerCPUSec is operations per second of the server's CPU time.
func (r PinnedRun) PerCPUSec() float64 {
	if r.CPU <= 0 {
		return 0
	}
	return float64(r.Ops) / r.CPU.Seconds()
}

// PinnedSide is one side of a figure over the counted rounds.
type PinnedSide struct {
	Name string // "ours", "baseline" or "raw pebble"
	Runs []PinnedRun
	// Medians over the runs: operations per server CPU-second, per wall
	// second, the server core's use (CPU time / wall time) and the
	// server's heap allocations per operation.
	PerCPUSec, PerSec, CoreUse, AllocsPerOp float64
}

// PinnedFigure is one comparison: a kind of read against the baseline,
// or PUTs with some writers against raw Pebble.
type PinnedFigure struct {
	// Name is "HEAD of a direction", "GET of one envelope" or "PUT synced,
	// <n> writer(s)"; Writers is the PUT's writer count (0 for reads) and
	// Depth a read's requests in flight per connection (1, or Pipeline).
	Name           string
	Writers, Depth int
	// Ours and Other (the baseline, or raw Pebble for PUT).
	Ours, Other PinnedSide
	// CPURatio and WallRatio are ours over the other's medians, per
	// server CPU-second and per wall second; the Round ratios are the
	// medians of the per-round ratios (each round ran both back to back).
	CPURatio, CPURoundRatio, WallRatio, WallRoundRatio float64
}

// PinnedProfile is the top of one CPU profile of a server process.
type PinnedProfile struct {
	// Figure names the run: "head-ours", "get-baseline", "put-64-ours",
	// "put-64-raw-pebble", …
	Figure string
	File   string
	Top    string // `go tool pprof -top`
}

// PinnedReport is the outcome of ComparePinned.
type PinnedReport struct {
	Options PinnedOptions // defaults filled in
	// Pinned says the servers and the load generator ran on separate
	// cores; without it the figures share the machine like CompareReads'.
	Pinned  bool
	Machine string
	Go      string
	Figures []PinnedFigure // HEAD, GET, pipelined HEAD and GET, then PUT per writer count
	// Floors are the floor server (floorServer) under the HEAD loads,
	// by depth (1 and Pipeline): the CPU per request that no server on
	// this machine can go below.
	Floors map[int]PinnedSide
	// PutFloors are the PUT floor server (floorServer with a store)
	// against raw Pebble, by writer count, alternated like the PUT
	// figures: the share of raw Pebble's rate that an HTTP server doing
	// nothing but the exchange and the commit keeps.
	PutFloors map[int]PinnedFigure
	Profiles  []PinnedProfile
	Warnings  []string
	Elapsed   time.Duration
}

// BuildMailboxserve builds cmd/mailboxserve into dir and returns its path.
// moduleDir is any directory inside the edgerelay module.
func BuildMailboxserve(ctx context.Context, moduleDir, dir string) (string, error) {
	return serverproc.Build(ctx, moduleDir, dir, "edgerelay/bench/mailboxbench/cmd/mailboxserve")
}

// ComparePinned is CompareReads and ComparePut with each server in a
// process of its own (cmd/mailboxserve) pinned to one core, and this
// process, the load generator, pinned to another, so that a server's CPU
// time (from /proc) is its own and not the load generator's or the other
// server's. The figures:
//
//   - HEAD of a direction and GET of one envelope, ours against the
//     net/http baseline, each over its own store seeded alike: requests
//     per second of server CPU time (the design's "requests per second
//     per core"; it compares the servers' cost per request fairly even
//     when the single load core, not the server, sets the pace) and per
//     wall second.
//   - Envelope PUTs synced before the 201, with each writer count, against
//     raw Pebble synced commits of the same key and value sizes made by a
//     pinned process of its own with as many goroutines: writes per wall
//     second (the design's figure: the share of the disk's synced-write
//     ceiling the request path keeps) and per server CPU-second.
//
// The two sides alternate round by round in ABBA order (package abtest),
// the first round dropped; figures are medians.
//
// While it runs, every thread of the calling process is pinned to LoadCPU
// with GOMAXPROCS 1 (both restored on return): run nothing else in the
// process meanwhile.
func ComparePinned(ctx context.Context, o PinnedOptions) (rep PinnedReport, err error) {
	start := time.Now()
	if o, err = o.withDefaults(); err != nil {
		return PinnedReport{}, err
	}
	rep = PinnedReport{Go: runtime.Version(),
		Machine: fmt.Sprintf("%s/%s, %d cores", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())}
	tmp, err := os.MkdirTemp("", "mailboxbench-pinned-")
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()
	if o.Binary == "" {
		if o.Binary, err = BuildMailboxserve(ctx, "", tmp); err != nil {
			return rep, err
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "built mailboxserve in %v\n", time.Since(start).Round(time.Millisecond))
		}
	}
	// A fresh directory for this run's stores, inside DataDir when given.
	parent := o.DataDir
	if parent == "" {
		parent = tmp
	}
	dataDir, err := os.MkdirTemp(parent, "pinned-")
	if err != nil {
		return rep, err
	}
	if o.DataDir != "" {
		defer func() { err = errors.Join(err, os.RemoveAll(dataDir)) }()
	}
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return rep, err
		}
	}
	rep.Options = o

	pin, err := serverproc.Pin(o.ServerCPU, o.LoadCPU)
	if err != nil {
		return rep, err
	}
	defer pin.Release()
	rep.Pinned, rep.Warnings = pin.Pinned, append(rep.Warnings, pin.Warnings()...)
	b := &pinnedBench{o: o, serverCPU: pin.ServerCPU, dataDir: dataDir}
	reads, rerr := b.reads(ctx)
	rep.Figures = append(rep.Figures, reads...)
	if rerr != nil {
		return rep, rerr
	}
	if rep.Floors, err = b.floors(ctx); err != nil {
		return rep, err
	}
	puts, putFloors, perr := b.puts(ctx)
	rep.Figures, rep.PutFloors = append(rep.Figures, puts...), putFloors
	if perr != nil {
		return rep, perr
	}

	for _, p := range b.profiles {
		out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=30", o.Binary, p.File).CombinedOutput()
		if err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("go tool pprof %s: %v: %s", p.File, err, out))
			continue
		}
		p.Top = string(out)
		rep.Profiles = append(rep.Profiles, p)
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// pinnedBench is one ComparePinned run's state.
type pinnedBench struct {
	o         PinnedOptions
	serverCPU int
	dataDir   string
	profiles  []PinnedProfile
}

// start runs one server process on the server core// on a fresh data directory and waits for its "ready" line (seeding
// comes first).
func (b *pinnedBench) start(ctx context.Context, relayName, dir string, args ...string) (*serverproc.Proc, error) {
	var env []string
	if b.o.ServerGOMAXPROCS > 0 {
		env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(b.o.ServerGOMAXPROCS))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	argv := append([]string{b.o.Binary, "-relay", relayName, "-dir", dir, "-listen", loopback}, args...)
	return serverproc.Start(ctx, "mailboxserve "+relayName, b.serverCPU, env, argv...)
}

// reads runs the HEAD and GET figures: both relays serving stores seeded
// alike, Conns raw keep-alive connections to each, each round one side
// answering HEADs then GETs.
func (b *pinnedBench) reads(ctx context.Context) (figs []PinnedFigure, err error) {
	o := b.o
	seedArgs := []string{"-mailboxes", strconv.Itoa(o.Mailboxes), "-stored", strconv.Itoa(o.Stored), "-size", strconv.Itoa(o.EnvelopeSize),
		"-envelope-cache", strconv.Itoa(o.EnvelopeCache)}
	procs, err := serverproc.StartPair(func(name string) (*serverproc.Proc, error) {
		return b.start(ctx, name, filepath.Join(b.dataDir, "reads-"+name), seedArgs...)
	})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, procs.Stop()) }()
	if err := settle(ctx, procs[0], procs[1]); err != nil { // the seeding's flushes
		return nil, err
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "read servers seeded and listening (%d mailboxes × %d envelopes of %d B each)\n", o.Mailboxes, o.Stored, o.EnvelopeSize)
	}
	relays := [2]*relay{{name: "ours", addr: procs[0].Ready}, {name: "baseline", addr: procs[1].Ready}}
	ro := ReadOptions{Rounds: o.Rounds, Conns: o.Conns, Mailboxes: o.Mailboxes, Stored: o.Stored, EnvelopeSize: o.EnvelopeSize}
	if err := sameAnswers(relays, ro); err != nil {
		return nil, err
	}
	var conns [2][]*rawClient
	defer func() {
		for _, cs := range conns {
			for _, c := range cs {
				err = errors.Join(err, c.close())
			}
		}
	}()
	for side, r := range relays {
		for range o.Conns {
			c, err := dialRaw(r.addr)
			if err != nil {
				return nil, err
			}
			conns[side] = append(conns[side], c)
		}
	}
	work := func(side int, l readLoad) func() (uint64, time.Duration, error) {
		return func() (uint64, time.Duration, error) {
			return pipelinedLoad(ctx, o.RoundTime, o.Conns, l.depth, func(w int) func() error {
				return readOp(conns[side][w], relays[side].addr, l.kind, w, l.depth, ro)
			})
		}
	}
	loads := b.readLoads()
	runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) ([]PinnedRun, error) {
		rs := make([]PinnedRun, len(loads))
		for i, l := range loads {
			r, err := measure(ctx, procs[side], work(side, l))
			if err != nil {
				return rs, fmt.Errorf("mailboxbench: pinned %s, round %d, %s: %w", l.name(), round, relays[side].name, err)
			}
			pinnedProgress(o.Progress, round, fmt.Sprintf("%-30s %-10s", l.name(), relays[side].name), r, "requests")
			rs[i] = r
		}
		return rs, nil
	})
	if err != nil {
		return nil, err
	}
	for i, l := range loads {
		var ours, other []PinnedRun
		for r := range runs[0] {
			ours = append(ours, runs[0][r][i])
			other = append(other, runs[1][r][i])
		}
		f := newPinnedFigure(kindNames[l.kind], 0, summarizePinned("ours", ours), summarizePinned("baseline", other))
		f.Depth = l.depth
		figs = append(figs, f)
	}
	if o.ProfileDir != "" {
		for _, l := range loads {
			for side, p := range procs {
				if err := b.profile(ctx, p, l.slug()+"-"+relays[side].name, work(side, l)); err != nil {
					return figs, err
				}
			}
		}
	}
	return figs, nil
}

// readLoad is one kind of read load: HEAD or GET, depth requests in
// flight per connection.
type readLoad struct{ kind, depth int }

// readLoads are the read figures in report order: every kind one request
// at a time, then pipelined.
func (b *pinnedBench) readLoads() []readLoad {
	var loads []readLoad
	for kind := range kindCount {
		loads = append(loads, readLoad{kind, 1})
	}
	if b.o.Pipeline > 1 {
		for kind := range kindCount {
			loads = append(loads, readLoad{kind, b.o.Pipeline})
		}
	}
	return loads
}

func (l readLoad) name() string {
	if l.depth == 1 {
		return kindNames[l.kind]
	}
	return fmt.Sprintf("%s, %d pipelined", kindNames[l.kind], l.depth)
}

// slug names the load in profile files: "head", "get-p16", …
func (l readLoad) slug() string {
	s := [kindCount]string{"head", "get", "head-envelope"}[l.kind]
	if l.depth > 1 {
		s += fmt.Sprintf("-p%d", l.depth)
	}
	return s
}

// pipelinedLoad is countedLoad of ops that each make depth requests: it
// counts requests.
func pipelinedLoad(ctx context.Context, d time.Duration, workers, depth int, newOp func(w int) func() error) (uint64, time.Duration, error) {
	n, elapsed, err := countedLoad(ctx, d, workers, newOp)
	return n * uint64(depth), elapsed, err
}

// puts runs the PUT figures: our relay over a store with max(Writers)
// mailboxes claimed, and a raw Pebble process beside it, both pinned to
// the server core in turn (one is idle while the other runs); then the
// PUT floor against raw Pebble alike.
func (b *pinnedBench) puts(ctx context.Context) (figs []PinnedFigure, floors map[int]PinnedFigure, err error) {
	o := b.o
	maxWriters := slices.Max(o.Writers)
	var ours, raw, floor *serverproc.Proc
	defer func() {
		for _, p := range []*serverproc.Proc{ours, raw, floor} {
			if p != nil {
				err = errors.Join(err, p.Stop())
			}
		}
	}()
	if ours, err = b.start(ctx, "ours", filepath.Join(b.dataDir, "put-ours"),
		"-mailboxes", strconv.Itoa(maxWriters), "-size", strconv.Itoa(o.EnvelopeSize)); err != nil {
		return nil, nil, err
	}
	if raw, err = b.start(ctx, "pebble", filepath.Join(b.dataDir, "put-pebble"),
		"-size", strconv.Itoa(o.EnvelopeSize)); err != nil {
		return nil, nil, err
	}
	if floor, err = b.start(ctx, "floorput", filepath.Join(b.dataDir, "put-floor")); err != nil {
		return nil, nil, err
	}
	clients := map[*serverproc.Proc]*fasthttp.HostClient{ours: newClient(ours.Ready, maxWriters), floor: newClient(floor.Ready, maxWriters)}
	defer func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}()
	next := make([]uint64, maxWriters) // each writer's last sequence, rising across rounds
	httpWork := func(p *serverproc.Proc, writers int) func() (uint64, time.Duration, error) {
		return func() (uint64, time.Duration, error) {
			return countedLoad(ctx, o.PutRoundTime, writers, func(w int) func() error {
				return putOp(clients[p], w, &next[w], o.EnvelopeSize)
			})
		}
	}
	rawWork := func(writers int) func() (uint64, time.Duration, error) {
		return func() (uint64, time.Duration, error) {
			ans, err := raw.Ask(ctx, fmt.Sprintf("put %d %v", writers, o.PutRoundTime), o.PutRoundTime+time.Minute)
			if err != nil {
				return 0, 0, err
			}
			var n, ns uint64
			if _, err := fmt.Sscanf(ans, "%d %d", &n, &ns); err != nil {
				return 0, 0, fmt.Errorf("put answered %q", ans)
			}
			return n, time.Duration(ns), nil
		}
	}
	// compare alternates ours against raw Pebble, and measures the floor
	// right beside each raw Pebble run (before it in odd rounds, after
	// it in even ones), so that ours and the floor are each set against
	// the same raw Pebble rounds: the disk's fsync latency drifts, and
	// separate raw series made the two shares differ by as much as that
	// drift.
	// putRound is one side's measurement in one round: ours, or raw
	// Pebble with the floor beside it.
	type putRound struct{ main, floor PinnedRun }
	compare := func(writers int) (f, floorFig PinnedFigure, err error) {
		run := func(p *serverproc.Proc, name string, round int, work func() (uint64, time.Duration, error)) (PinnedRun, error) {
			if err := settle(ctx, ours, raw, floor); err != nil {
				return PinnedRun{}, err
			}
			r, err := measure(ctx, p, work)
			if err != nil {
				return r, fmt.Errorf("mailboxbench: pinned PUT, %d writers, round %d, %s: %w", writers, round, name, err)
			}
			pinnedProgress(o.Progress, round, fmt.Sprintf("PUT %2d writers     %-10s", writers, name), r, "writes")
			return r, nil
		}
		runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (rr putRound, err error) {
			if side == 0 {
				rr.main, err = run(ours, "ours", round, httpWork(ours, writers))
				return rr, err
			}
			pair := [2]func() error{
				func() (err error) { rr.main, err = run(raw, "raw pebble", round, rawWork(writers)); return err },
				func() (err error) { rr.floor, err = run(floor, "floor", round, httpWork(floor, writers)); return err },
			}
			if round%2 == 1 {
				pair[0], pair[1] = pair[1], pair[0]
			}
			for _, do := range pair {
				if err := do(); err != nil {
					return rr, err
				}
			}
			return rr, nil
		})
		if err != nil {
			return f, floorFig, err
		}
		var oursRuns, rawRuns, floorRuns []PinnedRun
		for i := range runs[0] {
			oursRuns = append(oursRuns, runs[0][i].main)
			rawRuns = append(rawRuns, runs[1][i].main)
			floorRuns = append(floorRuns, runs[1][i].floor)
		}
		rawSide := summarizePinned("raw pebble", rawRuns)
		f = newPinnedFigure(putName(writers), writers, summarizePinned("ours", oursRuns), rawSide)
		floorFig = newPinnedFigure(putName(writers), writers, summarizePinned("floor", floorRuns), rawSide)
		if o.ProfileDir != "" {
			for _, p := range []struct {
				proc *serverproc.Proc
				name string
				work func() (uint64, time.Duration, error)
			}{{ours, "ours", httpWork(ours, writers)}, {raw, "raw-pebble", rawWork(writers)}, {floor, "floor", httpWork(floor, writers)}} {
				if err := b.profile(ctx, p.proc, fmt.Sprintf("put-%d-%s", writers, p.name), p.work); err != nil {
					return f, floorFig, err
				}
			}
		}
		return f, floorFig, nil
	}
	floors = map[int]PinnedFigure{}
	for _, writers := range o.Writers {
		f, floorFig, err := compare(writers)
		if err != nil {
			return figs, floors, err
		}
		figs = append(figs, f)
		floors[writers] = floorFig
	}
	return figs, floors, nil
}

// settle waits until none of procs has Pebble work running (the
// "settle" command): they share the server core, and one's flushes and
// compactions from earlier rounds would otherwise run during another's
// measured round. Each side still pays for the work its own round's
// writes start.
func settle(ctx context.Context, procs ...*serverproc.Proc) error {
	for _, p := range procs {
		if _, err := p.Ask(ctx, "settle", settleLimit+10*time.Second); err != nil {
			return fmt.Errorf("mailboxbench: settle %s: %w", p.Name, err)
		}
	}
	return nil
}

func putName(writers int) string {
	if writers == 1 {
		return "PUT synced, 1 writer"
	}
	return fmt.Sprintf("PUT synced, %d writers", writers)
}

// profile runs work once more, uncounted, with p under a CPU profile.
func (b *pinnedBench) profile(ctx context.Context, p *serverproc.Proc, slug string, work func() (uint64, time.Duration, error)) error {
	file, err := filepath.Abs(filepath.Join(b.o.ProfileDir, "mailboxserve-"+slug+".pprof"))
	if err != nil {
		return err
	}
	if _, err := p.Ask(ctx, "profile "+file, 10*time.Second); err != nil {
		return err
	}
	_, _, werr := work()
	if _, err := p.Ask(ctx, "profile-stop", 10*time.Second); err != nil {
		return errors.Join(werr, err)
	}
	if werr != nil {
		return fmt.Errorf("mailboxbench: profiled %s run: %w", slug, werr)
	}
	b.profiles = append(b.profiles, PinnedProfile{Figure: slug, File: file})
	return nil
}

// countedLoad is load, counting the ops: workers run newOp's ops for d.
func countedLoad(ctx context.Context, d time.Duration, workers int, newOp func(w int) func() error) (uint64, time.Duration, error) {
	counts := make([]uint64, workers)
	rate, err := load(ctx, d, workers, func(w int) func() error {
		op := newOp(w)
		return func() error {
			if err := op(); err != nil {
				return err
			}
			counts[w]++
			return nil
		}
	})
	if err != nil {
		return 0, 0, err
	}
	var n uint64
	for _, c := range counts {
		n += c
	}
	if n == 0 || rate <= 0 {
		return 0, 0, errors.New("no operation completed")
	}
	return n, time.Duration(float64(n) / rate * float64(time.Second)), nil
}

func summarizePinned(name string, runs []PinnedRun) PinnedSide {
	s := PinnedSide{Name: name, Runs: runs}
	var cpu, wall, use, allocs []float64
	for _, r := range runs {
		cpu = append(cpu, r.PerCPUSec())
		wall = append(wall, r.PerSec())
		use = append(use, r.CPU.Seconds()/r.Elapsed.Seconds())
		allocs = append(allocs, float64(r.Mallocs)/float64(r.Ops))
	}
	s.PerCPUSec, s.PerSec = abtest.Median(cpu), abtest.Median(wall)
	s.CoreUse, s.AllocsPerOp = abtest.Median(use), abtest.Median(allocs)
	return s
}

func newPinnedFigure(name string, writers int, ours, other PinnedSide) PinnedFigure {
	f := PinnedFigure{Name: name, Writers: writers, Ours: ours, Other: other}
	f.CPURatio = ours.PerCPUSec / other.PerCPUSec
	f.WallRatio = ours.PerSec / other.PerSec
	perCPU := func(s PinnedSide) []float64 {
		v := make([]float64, len(s.Runs))
		for i, r := range s.Runs {
			v[i] = r.PerCPUSec()
		}
		return v
	}
	perSec := func(s PinnedSide) []float64 {
		v := make([]float64, len(s.Runs))
		for i, r := range s.Runs {
			v[i] = r.PerSec()
		}
		return v
	}
	f.CPURoundRatio = abtest.RoundRatio(perCPU(ours), perCPU(other))
	f.WallRoundRatio = abtest.RoundRatio(perSec(ours), perSec(other))
	return f
}

func pinnedProgress(w io.Writer, round int, what string, r PinnedRun, unit string) {
	if w == nil {
		return
	}
	note := ""
	if round == 0 {
		note = "  (warm-up, not counted)"
	}
	fmt.Fprintf(w, "round %d %s %10.0f %s/s %10.0f %s/CPU-s  core %3.0f%%  %5.1f allocs/op%s\n",
		round, what, r.PerSec(), unit, r.PerCPUSec(), unit, 100*r.CPU.Seconds()/r.Elapsed.Seconds(),
		float64(r.Mallocs)/float64(r.Ops), note)
}

// measure runs work with the server's CPU time and heap allocations read
// on either side of it, after a collection (as CompareReads and
// ComparePut collect before each round).
func measure(ctx context.Context, p *serverproc.Proc, work func() (uint64, time.Duration, error)) (PinnedRun, error) {
	var r PinnedRun
	u, err := p.Measure(ctx, func() (err error) {
		r.Ops, r.Elapsed, err = work()
		return err
	})
	r.CPU, r.Mallocs = u.CPU, u.Mallocs
	return r, err
}
