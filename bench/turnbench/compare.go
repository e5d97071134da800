// Package turnbench compares edgerelay's TURN server with coturn's
// turnserver: relayed packets per second per server core, at 120-byte and
// 1,200-byte payloads, both driven by the same Go load generator
// (RunLoad: an allocation per client, then raw ChannelData to a UDP echo
// peer and back) in the same run. The load's clients reach the server
// over UDP one datagram per send, over UDP in GSO runs that arrive
// GRO-coalesced where the receiving socket asked for it, or over TCP or
// TLS (Options.Transport, Options.GSO). With Options.BaselineNoGRO the
// baseline is our own server with UDP_GRO off instead of coturn: what
// coalesced reads are worth on the same load.
//
// Each server is a process of its own pinned to one core (taskset), the
// load generator (this process, every thread) to another, so the figure
// is one server core's worth of relaying. Rounds alternate the two in ABBA
// order (bench/abtest) and the first round is a warm-up; figures are
// medians over the counted rounds.
//
// The headline figure is packets per server CPU-second: the datagrams the
// server relayed (both directions) divided by the CPU time its process
// used over the counted window, from /proc. When the server's core is
// saturated that equals throughput; when the load generator is the
// bottleneck it still compares the servers' cost per packet fairly.
package turnbench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"edgerelay/bench/abtest"
)

// Options shapes a comparison. Zero fields take the defaults noted.
type Options struct {
	// Rounds is the rounds per payload, the first one a warm-up. Default
	// 7 (6 counted).
	Rounds int
	// Payloads are the ChannelData payload sizes. Default 120 and 1200.
	Payloads []int
	// Duration is the counted time of one run. Default 2 s.
	Duration time.Duration
	// Allocations and Window shape the load (see LoadOptions). Defaults 8
	// and 16 (twice GSO with GSO).
	Allocations, Window int
	// Transport is the clients' leg to the server (see LoadOptions).
	// Default UDP.
	Transport Transport
	// GSO, above 1, has the clients send GSO runs of that many datagrams
	// (see LoadOptions.GSO): our server, with UDP_GRO on its listener,
	// reads them coalesced; coturn, without, one by one. 0: one datagram
	// per send.
	GSO int
	// PeerGSO has the echo peers send back in GSO runs of GSO datagrams
	// as well (see LoadOptions.PeerGSO): input coalesced on both legs.
	PeerGSO bool
	// BaselineNoGRO compares ours against ours started with UDP_GRO off
	// (turnserve -no-gro) instead of against coturn; UDP only. With GSO
	// runs, the baseline reads the same input a datagram at a time.
	BaselineNoGRO bool
	// BaselineTurnserve, when set, is the baseline instead of coturn:
	// another turnserve binary (a build from before a change), started as
	// ours is, under the name "other".
	BaselineTurnserve string
	// ServerCPU and LoadCPU are the cores the servers and the load
	// generator are pinned to. Defaults 0 and 1; pinning is skipped (and
	// the report says so) on a machine with one core or without taskset.
	ServerCPU, LoadCPU int
	// Turnserve is our server's binary (bench/turnbench/cmd/turnserve);
	// built into a temporary directory when empty.
	Turnserve string
	// Turnserver is coturn's binary. Default "turnserver" on PATH.
	Turnserver string
	// ProfileSeconds, when positive, adds one uncounted run of ours at the
	// first payload with a CPU profile of that length, summarised in
	// Report.Profile. Default 0 (none).
	ProfileSeconds int
	// SocketBuffer, when positive, is our server's socket buffer
	// (turn.Config.SocketBuffer); 0 leaves its default.
	SocketBuffer int
	// Progress, when not nil, gets one line per run.
	Progress io.Writer
}

func (o Options) withDefaults() (Options, error) {
	if o.Rounds == 0 {
		o.Rounds = 7
	}
	if len(o.Payloads) == 0 {
		o.Payloads = []int{120, 1200}
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Second
	}
	if o.Allocations == 0 {
		o.Allocations = 8
	}
	if o.Transport == "" {
		o.Transport = UDP
	}
	if o.GSO <= 1 {
		o.GSO = 0
	}
	if o.Window == 0 {
		o.Window = 16
		if o.GSO > 1 {
			o.Window = 2 * o.GSO
		}
	}
	if _, err := (LoadOptions{Transport: o.Transport, TLS: &tls.Config{}, GSO: o.GSO, PeerGSO: o.PeerGSO, Window: o.Window, Payload: 120}).withDefaults(); err != nil {
		return o, err
	}
	for _, p := range o.Payloads {
		if _, err := (LoadOptions{Transport: o.Transport, TLS: &tls.Config{}, GSO: o.GSO, PeerGSO: o.PeerGSO, Window: o.Window, Payload: p}).withDefaults(); err != nil {
			return o, err
		}
	}
	if o.BaselineNoGRO && o.BaselineTurnserve != "" {
		return o, errors.New("turnbench: one baseline: GRO off or another turnserve, not both")
	}
	if o.BaselineNoGRO && o.Transport != UDP {
		return o, fmt.Errorf("turnbench: a GRO-off baseline needs transport udp, not %s", o.Transport)
	}
	if o.ServerCPU == 0 && o.LoadCPU == 0 {
		o.LoadCPU = 1
	}
	if o.Turnserver == "" {
		o.Turnserver = "turnserver"
	}
	if o.Rounds < 2 {
		return o, fmt.Errorf("turnbench: Rounds %d: need at least 2 (the first is a warm-up)", o.Rounds)
	}
	return o, nil
}

// Run is one counted run of one server.
type Run struct {
	Relayed uint64        // datagrams relayed, both directions
	Lost    uint64        // datagrams presumed lost and sent again
	Elapsed time.Duration // counted wall time
	CPU     time.Duration // the server process's CPU time over it
	// Drops is the datagrams the kernel dropped on the server's UDP
	// sockets over the counted window (ProcessUDPDrops).
	Drops uint64
	// Mallocs is ours only: heap allocations in the server process over
	// the counted window, and ServerRelayed the packets it counted.
	Mallocs, ServerRelayed uint64
	// SendErrors is the load generator's failed sends (see LoadResult).
	SendErrors uint64
	// TLSSuite is the negotiated cipher suite (TLS only).
	TLSSuite string
}

// PerSec is relayed datagrams per wall second.
func (r Run) PerSec() float64 { return float64(r.Relayed) / r.Elapsed.Seconds() }

// PerCoreSec is relayed datagrams per server CPU-second.
func (r Run) PerCoreSec() float64 {
	if r.CPU <= 0 {
		return 0
	}
	return float64(r.Relayed) / r.CPU.Seconds()
}

// Side is one server at one payload over the counted rounds.
type Side struct {
	Name string
	Runs []Run
	// Medians over the runs: packets per server CPU-second, per wall
	// second, and the server core's utilisation (CPU time / wall time).
	PerCoreSec, PerSec, CoreUse float64
	// LossRate is lost / relayed over all runs.
	LossRate float64
	// AllocsPerPacket is ours only (else -1): server mallocs per packet
	// the server relayed, over all runs.
	AllocsPerPacket float64
	// Drops is the kernel's drops on the server's sockets over all runs.
	Drops uint64
	// TLSSuite is the cipher suite the load negotiated (TLS only).
	TLSSuite string
}

// PayloadResult is both servers at one payload size.
type PayloadResult struct {
	Payload int
	// Baseline is coturn, or ours with GRO off (Options.BaselineNoGRO).
	Ours, Baseline Side
	// Ratio is Ours.PerCoreSec / Baseline.PerCoreSec: above 1, ours relays
	// more per core. RoundRatio is the median of the per-round ratios
	// (robust to drift between rounds), RoundRatios those ratios, whose
	// spread shows how far one round can be trusted; ThroughputRatio
	// compares PerSec.
	Ratio, RoundRatio, ThroughputRatio float64
	RoundRatios                        []float64
}

// Report is the outcome of Compare.
type Report struct {
	Options  Options
	Results  []PayloadResult
	Pinned   bool   // servers and load generator ran on separate cores
	Machine  string // GOOS/GOARCH, cores
	Go       string
	Coturn   string // turnserver's version line ("" when not the baseline)
	Profile  string // top of our server's CPU profile, if asked for
	Elapsed  time.Duration
	Warnings []string
}

// Compare starts both servers, runs the load generator against each,
// alternating, for every payload, and reports. ctx bounds the whole
// comparison.
func Compare(ctx context.Context, o Options) (rep Report, err error) {
	start := time.Now()
	if o, err = o.withDefaults(); err != nil {
		return Report{}, err
	}
	rep = Report{Options: o, Go: runtime.Version(),
		Machine: fmt.Sprintf("%s/%s, %d cores", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())}
	var coturnBin string
	if o.againstCoturn() {
		if coturnBin, err = exec.LookPath(o.Turnserver); err != nil {
			return rep, fmt.Errorf("turnbench: coturn's turnserver not found (%w): run .ci/install-coturn.sh", err)
		}
		rep.Coturn = coturnVersion(ctx, coturnBin)
	}
	dir, err := os.MkdirTemp("", "turnbench")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	if o.Turnserve == "" {
		o.Turnserve = filepath.Join(dir, "turnserve")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.Turnserve, "edgerelay/bench/turnbench/cmd/turnserve")
		if out, err := build.CombinedOutput(); err != nil {
			return rep, fmt.Errorf("turnbench: building turnserve: %w\n%s", err, out)
		}
	}

	serverCPU, loadCPU := o.ServerCPU, o.LoadCPU
	_, tasksetErr := exec.LookPath("taskset")
	rep.Pinned = runtime.NumCPU() >= 2 && tasksetErr == nil
	if !rep.Pinned {
		serverCPU, loadCPU = -1, -1
		rep.Warnings = append(rep.Warnings, "not pinned: needs taskset and 2 cores; servers and load generator share the machine")
	} else {
		restore, err := pinSelf(ctx, loadCPU)
		if err != nil {
			return rep, err
		}
		defer restore()
		// One core for the generator: as many Ps as cores it may use.
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}

	const secret, realm = "turnbench-secret", "turnbench"
	var cert *benchCert
	if o.Transport == TLS {
		c, err := writeBenchCert(dir)
		if err != nil {
			return rep, err
		}
		cert = &c
	}
	oo := oursOptions{socketBuffer: o.SocketBuffer, cert: cert}
	ours, err := startOurs(ctx, o.Turnserve, secret, realm, serverCPU, oo)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, ours.stop()) }()
	var base *server
	switch {
	case o.BaselineNoGRO:
		oo.noGRO = true
		base, err = startOurs(ctx, o.Turnserve, secret, realm, serverCPU, oo)
	case o.BaselineTurnserve != "":
		oo.name = "other"
		base, err = startOurs(ctx, o.BaselineTurnserve, secret, realm, serverCPU, oo)
	default:
		base, err = startCoturn(ctx, coturnBin, secret, realm, dir, serverCPU, cert)
	}
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, base.stop()) }()
	servers := [2]*server{ours, base}

	for _, payload := range o.Payloads {
		runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (Run, error) {
			r, err := measure(ctx, servers[side], secret, payload, o, cert)
			if err != nil {
				return r, fmt.Errorf("turnbench: %d B, round %d, %s: %w", payload, round, servers[side].name, err)
			}
			if o.Progress != nil {
				note := ""
				if round == 0 {
					note = " (warm-up)"
				}
				if r.SendErrors > 0 {
					note += fmt.Sprintf(" (%d failed sends)", r.SendErrors)
				}
				fmt.Fprintf(o.Progress, "%s %5d B round %d %-10s %9.0f pkt/s %9.0f pkt/core-s  core %3.0f%%  lost %d  drops %d%s\n",
					o.LoadName(), payload, round, servers[side].name, r.PerSec(), r.PerCoreSec(),
					100*r.CPU.Seconds()/r.Elapsed.Seconds(), r.Lost, r.Drops, note)
			}
			return r, nil
		})
		if err != nil {
			return rep, err
		}
		pr := PayloadResult{Payload: payload, Ours: summarize(ours, runs[0]), Baseline: summarize(base, runs[1])}
		pr.Ratio = pr.Ours.PerCoreSec / pr.Baseline.PerCoreSec
		pr.ThroughputRatio = pr.Ours.PerSec / pr.Baseline.PerSec
		pr.RoundRatios = abtest.RoundRatios(perCore(runs[0]), perCore(runs[1]))
		pr.RoundRatio = abtest.Median(pr.RoundRatios)
		rep.Results = append(rep.Results, pr)
	}

	if o.ProfileSeconds > 0 {
		rep.Profile, err = profileOurs(ctx, ours, secret, dir, o, cert)
		if err != nil {
			rep.Warnings = append(rep.Warnings, "profile: "+err.Error())
		}
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// againstCoturn reports whether coturn is the baseline.
func (o Options) againstCoturn() bool { return !o.BaselineNoGRO && o.BaselineTurnserve == "" }

// measure runs the load once against s, taking the server's CPU time
// (and, for ours, its malloc and relayed counts) over the counted window.
func measure(ctx context.Context, s *server, secret string, payload int, o Options, cert *benchCert) (Run, error) {
	var (
		r      Run
		st0    Stats
		drops0 UDPDrops
	)
	counting := func(start bool) error {
		cpu, err := s.cpuTime()
		if err != nil {
			return err
		}
		drops, err := s.drops()
		if err != nil {
			return err
		}
		if start {
			r.CPU, drops0 = -cpu, drops
		} else {
			r.CPU, r.Drops = r.CPU+cpu, drops.DropsSince(drops0)
		}
		if s.debug == "" {
			return nil
		}
		st, err := s.stats(ctx)
		if err != nil {
			return err
		}
		if start {
			st0 = st
		} else {
			r.Mallocs = st.Mallocs - st0.Mallocs
			r.ServerRelayed = st.RelayedPackets - st0.RelayedPackets
		}
		return nil
	}
	lo := o.loadOptions(s, secret, payload, cert)
	lo.Duration, lo.OnCounting = o.Duration, counting
	res, err := RunLoad(ctx, lo)
	if err != nil {
		return r, err
	}
	r.Relayed, r.Lost, r.Elapsed = res.Relayed, res.Lost, res.Elapsed
	r.SendErrors, r.TLSSuite = res.SendErrors, res.TLSSuite
	// Let the allocations' refreshes to zero and the sockets' closing
	// settle before the other server's run.
	time.Sleep(100 * time.Millisecond)
	return r, nil
}

// loadOptions is the load of o against s at payload, its duration and
// counting left to the caller.
func (o Options) loadOptions(s *server, secret string, payload int, cert *benchCert) LoadOptions {
	lo := LoadOptions{
		Server: s.addr, Secret: secret, Payload: payload, Transport: o.Transport,
		Allocations: o.Allocations, Window: o.Window, GSO: o.GSO, PeerGSO: o.PeerGSO,
	}
	if cert != nil {
		lo.Server, lo.TLS = s.tlsAddr, cert.client
	}
	return lo
}

// LoadName says which load runs, in a word: udp, udp-gso16,
// udp-gso16-both (the echo peers in runs too), tcp, tls (and -vs-nogro
// with the GRO-off baseline).
func (o Options) LoadName() string {
	name := string(o.Transport)
	if name == "" {
		name = string(UDP) // the default
	}
	if o.GSO > 1 {
		name = fmt.Sprintf("%s-gso%d", name, o.GSO)
		if o.PeerGSO {
			name += "-both"
		}
	}
	if o.BaselineNoGRO {
		name += "-vs-nogro"
	}
	return name
}

// summarize is s's side over its runs; allocations per packet only for
// our servers (the ones with /stats).
func summarize(srv *server, runs []Run) Side {
	s := Side{Name: srv.name, Runs: runs, AllocsPerPacket: -1}
	var relayed, lost, mallocs, serverRelayed uint64
	var perSec, use []float64
	for _, r := range runs {
		perSec = append(perSec, r.PerSec())
		use = append(use, r.CPU.Seconds()/r.Elapsed.Seconds())
		relayed += r.Relayed
		lost += r.Lost
		mallocs += r.Mallocs
		serverRelayed += r.ServerRelayed
		s.Drops += r.Drops
		if s.TLSSuite == "" {
			s.TLSSuite = r.TLSSuite
		}
	}
	s.PerCoreSec = abtest.Median(perCore(runs))
	s.PerSec = abtest.Median(perSec)
	s.CoreUse = abtest.Median(use)
	if relayed > 0 {
		s.LossRate = float64(lost) / float64(relayed)
	}
	if srv.debug != "" && serverRelayed > 0 {
		s.AllocsPerPacket = float64(mallocs) / float64(serverRelayed)
	}
	return s
}

func perCore(runs []Run) []float64 { return abtest.Values(runs, Run.PerCoreSec) }

// profileOurs runs the load against ours once more, uncounted, while
// taking a CPU profile, and returns the top of `go tool pprof -top`.
func profileOurs(ctx context.Context, ours *server, secret, dir string, o Options, cert *benchCert) (string, error) {
	file := filepath.Join(dir, "turnserve.pprof")
	errc := make(chan error, 1)
	lo := o.loadOptions(ours, secret, o.Payloads[0], cert)
	lo.Duration = time.Duration(o.ProfileSeconds)*time.Second + 500*time.Millisecond
	lo.OnCounting = func(start bool) error {
		if start {
			go func() { errc <- ours.profile(ctx, o.ProfileSeconds, file) }()
		}
		return nil
	}
	_, err := RunLoad(ctx, lo)
	if err != nil {
		return "", err
	}
	if err := <-errc; err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=25", o.Turnserve, file).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w\n%s", err, out)
	}
	return string(out), nil
}

// pinSelf moves every thread of this process to cpu (threads made later
// inherit it) and returns a function that restores the previous set.
func pinSelf(ctx context.Context, cpu int) (func(), error) {
	pid := strconv.Itoa(os.Getpid())
	out, err := exec.CommandContext(ctx, "taskset", "-pc", pid).Output()
	if err != nil {
		return nil, fmt.Errorf("turnbench: taskset: %w", err)
	}
	// "pid 123's current affinity list: 0,1"
	_, prev, _ := strings.Cut(strings.TrimSpace(string(out)), ": ")
	if out, err := exec.CommandContext(ctx, "taskset", "-a", "-pc", strconv.Itoa(cpu), pid).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("turnbench: pinning the load generator: %w: %s", err, out)
	}
	return func() {
		_ = exec.Command("taskset", "-a", "-pc", prev, pid).Run()
	}, nil
}

func coturnVersion(ctx context.Context, bin string) string {
	out, _ := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	return strings.TrimSpace(string(out))
}
