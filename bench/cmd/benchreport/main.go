// Command benchreport is `make bench`: it runs every comparison of the
// relays with their baselines, the micro benchmarks of the hot path and
// the push benchmarks, and writes bench/results/latest.md with each figure
// beside its baseline, measured in the same run on the same machine, the
// ratio and the design's goal for it:
//
//   - the private channel relay against its net/http + gorilla/websocket +
//     encoding/json baseline (bench/channelbench): forwarding per relay
//     CPU-second, each relay a process of its own pinned apart from the
//     load generator, and the memory of 10,000 idle phone channels;
//   - the mailbox (bench/mailboxbench): HEAD and GET against the net/http
//     baseline and synced envelope PUTs against raw Pebble commits, each
//     server pinned in a process of its own (per server CPU-second), the
//     handlers called directly, and the memory of 10,000 idle watch
//     sockets;
//   - the mailbox's signal forwarding against its baseline
//     (bench/signalbench), pinned likewise;
//   - agent routing, instance to client and client to instance, against
//     the encoding/json baseline (bench/agentbench), pinned likewise;
//   - idle sockets parked beside today's goroutine per socket
//     (bench/idlebench, issue 18): the resident memory of an idle mailbox
//     watch, signal, phone channel and control socket, plain and TLS, at
//     10,000 sockets (capped to the open-file limit, and said so); the
//     added latency and CPU of a delivery to a parked watch socket; a
//     reconnect storm against the binary's accept limits;
//   - our TURN server against coturn (bench/turnbench): synthetic
//     ChannelData load, and real WebRTC traffic from two headless Chromium
//     pages over a relay-only data channel (skipped without chromium);
//   - with `go test -bench`: the token bucket against
//     golang.org/x/time/rate, the channel codec against encoding/json, the
//     SDK's envelope seal and open against raw AES-256-GCM, the relays'
//     exact allocations with raw clients, the mailbox push fan-out and the
//     push gateway (both to the fake APNs), and the push gateway in
//     cluster mode (three nodes' mounts on a 3-node embedded NATS cluster)
//     beside single node;
//   - the cluster routers (signal, private channel both ways, agent)
//     across a 3-node embedded cluster beside raw core NATS publish and
//     subscribe of the same bytes, and their back-pressure (a paced flow
//     beside a frozen consumer).
//
// Run it from anywhere inside the module:
//
//	go run ./bench/cmd/benchreport [flags]
//
// QUICK=1 in the environment shortens every default (about three minutes
// in all) for a smoke run; flags given explicitly still win.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"edgerelay/bench/channelbench"
)

// microPackages are the packages whose benchmarks the report reads, all
// of them.
func microPackages() []string {
	return []string{"./fastpath/bucket/", "./fastpath/channel/control/", "./fastpath/channel/"}
}

// The benchmarks of the bench packages that the report reads, each
// selected alone: those packages' other benchmarks are the load
// comparisons, which the report runs itself (see runMailbox, runSignal).
const (
	// mailboxMicroBench calls the mailbox handlers directly.
	mailboxMicroPackage = "./bench/mailboxbench/"
	mailboxMicroBench   = "^BenchmarkServeHTTP$"
	// signalMicroBench is one signal round trip with raw clients in one
	// process: the relay's allocations per frame, exactly.
	signalMicroPackage = "./bench/signalbench/"
	signalMicroBench   = "^BenchmarkSignalRoundTrip$"
	// The push benchmarks: writes with X-Relay-Notify through the mailbox
	// handler, and POST /send through the push gateway, to the fake APNs.
	pushFanoutPackage = "./bench/pushbench/"
	pushFanoutBench   = "^BenchmarkPushFanout$"
	pushgwPackage     = "./bench/pushgwbench/"
	pushgwBench       = "^BenchmarkSendAPNs$"
	// sdkBench is the SDK's envelope seal and open beside raw
	// AES-256-GCM (the package's other benchmarks are not compared).
	sdkPackage = "./sdk/link/"
	sdkBench   = "^Benchmark(Seal|Open)$"
)

// benchRun is one `go test -bench` invocation.
type benchRun struct {
	pattern   string
	pkgs      []string
	count     int
	benchtime string
}

func (b benchRun) String() string {
	return fmt.Sprintf("-bench='%s' -count=%d -benchtime=%s on %s", b.pattern, b.count, b.benchtime, strings.Join(b.pkgs, " "))
}

// benchRuns are the `go test -bench` invocations of a run: the micro
// benchmarks with -count and -benchtime, the push benchmarks (whose ops
// are much longer, and whose set-up is a relay or gateway with a fake
// provider) with their own.
func benchRuns(s settings) []benchRun {
	return append([]benchRun{
		{".", microPackages(), s.count, s.benchtime},
		{mailboxMicroBench, []string{mailboxMicroPackage}, s.count, s.benchtime},
		{signalMicroBench, []string{signalMicroPackage}, s.count, s.benchtime},
		{sdkBench, []string{sdkPackage}, s.count, s.benchtime},
		{pushFanoutBench, []string{pushFanoutPackage}, s.pushCount, s.pushBenchtime},
		{pushgwBench, []string{pushgwPackage}, s.pushCount, s.pushBenchtime},
		{pushgwClusterBench, []string{pushgwPackage}, 1, s.pushClusterBenchtime},
		{mailboxClusterPattern(s.quick), []string{mailboxClusterPackage}, 1, s.mailboxClusterBenchtime},
	}, routeClusterRuns(s.quick)...)
}

// settings are the run's knobs, from flags over QUICK-aware defaults.
type settings struct {
	// rounds, frames, phones and size shape the channel comparison
	// (rounds also the mailbox's and the signal's); idlePhones is the
	// idle phone channels per relay in its memory figure.
	rounds, frames, phones, size int
	idlePhones                   int
	count                        int
	benchtime                    string
	out                          string
	timeout                      time.Duration
	quick                        bool
	// mailboxRound and mailboxPutRound are one side's time in one round
	// of the pinned mailbox comparison, reads and PUTs (synced writes
	// follow the disk's drifting fsync latency, so they get longer
	// rounds); watchSockets the idle watch sockets per server.
	mailboxRound, mailboxPutRound time.Duration
	watchSockets                  int
	// agentRounds and agentFrames shape the agent routing comparison's
	// throughput rounds (frames per direction per round), agentLatency
	// and agentLatencyRounds its latency runs.
	agentRounds, agentFrames int
	agentLatency             time.Duration
	agentLatencyRounds       int
	// signalRound is one relay's load time in one round of the signal
	// comparison (rounds as -rounds); signalPairs the rendezvous open.
	signalRound time.Duration
	signalPairs int
	// turn turns the TURN comparison on; turnRounds and turnRound are its
	// rounds per payload (the first a warm-up) and counted time per run.
	turn       bool
	turnRounds int
	turnRound  time.Duration
	// webrtc turns the real-traffic TURN comparison on (two headless
	// Chromium pages); webrtcRounds and webrtcMB are its rounds (the first
	// a warm-up) and MB moved per run.
	webrtc       bool
	webrtcRounds int
	webrtcMB     int
	// pushCount and pushBenchtime are -count and -benchtime of the push
	// benchmarks.
	pushCount     int
	pushBenchtime string
	// pushClusterBenchtime is -benchtime of each case of the push gateway
	// in cluster mode beside single node (which runs its rounds itself).
	pushClusterBenchtime string
	// mailboxClusterBenchtime is -benchtime of each case and round of the
	// mailbox's cluster backend beside raw JetStream.
	mailboxClusterBenchtime string
	// idleSockets and idleRounds shape the idle-socket memory figures of
	// issue 18 (sockets of each kind per server, servers per side and
	// figure; idleRounds the wake figure's too); wakeSockets and
	// wakeDeliveries the wake figure; stormSockets the reconnect storm.
	// idleSocketsLarge is a second memory pass, one round per side, at
	// the 100,000 (capped to the open-file limit); 0 skips it.
	idleSockets, idleRounds     int
	idleSocketsLarge            int
	wakeSockets, wakeDeliveries int
	stormSockets                int
}

func parseSettings(args []string, quick bool) (settings, error) {
	// The full run's budget on 2 cores, reckoned from a QUICK run's rates: server programs 0.2
	// (warm cache; a cold one adds about a minute), channel 1 (forwarding
	// and idle phones), mailbox 3.3 (pinned HEAD and GET, one at a time
	// and pipelined, with their floors; PUTs in 2 s rounds beside raw
	// Pebble and the PUT floor, settling between rounds; idle watch
	// sockets), signal 0.9, agent 1, TURN 1.5, TURN WebRTC 1.5 (5 rounds of
	// 100 MB per server at about 10-15 MB/s on this machine), micro and push benchmarks 6,
	// the push gateway in cluster mode beside single node 0.6 (a 3-node
	// cluster started once, 5 rounds of 4 cases of 0.7 s), the mailbox's
	// cluster backend beside raw JetStream 0.5 (3 rounds of 6 cases of
	// 0.4 s), the cluster routers beside raw NATS 2.4 (3 rounds of 20000
	// frames a case, 3 packages, a cluster started per package), the idle
	// sockets parked vs unparked 10 (48 server processes of 10,000
	// sockets or connections and 16 of 100,000 WebSockets capped to the
	// open-file limit, 18,000 on a hard limit of 20,000, half of them over
	// TLS; the wake, 4 servers; the storm, 2 servers of 10,000 sockets
	// through the accept rate twice) — about 29 minutes. The quick one, a smoke test of the whole pipeline,
	// stays near 3 with a warm build cache. The timeouts only
	// guard against a hang and sit above those.
	s := settings{rounds: 8, frames: 200_000, phones: 4, size: 1024, idlePhones: 10_000, count: 5, benchtime: "1s",
		out: filepath.Join("bench", "results", "latest.md"), timeout: 35 * time.Minute, quick: quick,
		mailboxRound: time.Second, mailboxPutRound: 2 * time.Second, watchSockets: 10_000,
		signalRound: time.Second, signalPairs: 32,
		agentRounds: 7, agentFrames: 100_000, agentLatency: time.Second, agentLatencyRounds: 3,
		turn: true, turnRounds: 7, turnRound: 2 * time.Second,
		webrtc: true, webrtcRounds: 5, webrtcMB: 100,
		pushCount: 3, pushBenchtime: "3s", pushClusterBenchtime: "700ms", mailboxClusterBenchtime: "400ms",
		idleSockets: 10_000, idleRounds: 2, idleSocketsLarge: 100_000, wakeSockets: 1_000, wakeDeliveries: 3_000, stormSockets: 10_000}
	if quick {
		s.rounds, s.frames, s.count, s.benchtime, s.timeout = 3, 30_000, 1, "100ms", 5*time.Minute
		s.mailboxRound, s.mailboxPutRound = 300*time.Millisecond, 300*time.Millisecond
		// Idle sockets: enough to see the per-socket cost, a fifth of the
		// full run's 10,000 (opening them is most of those figures' time).
		s.watchSockets, s.idlePhones = 2_000, 2_000
		s.signalRound = 250 * time.Millisecond
		s.agentRounds, s.agentFrames, s.agentLatency, s.agentLatencyRounds = 3, 50_000, 200*time.Millisecond, 1
		s.turnRounds, s.turnRound = 2, 300*time.Millisecond
		s.webrtcRounds, s.webrtcMB = 2, 20
		s.pushCount, s.pushBenchtime = 1, "500ms"
		s.pushClusterBenchtime, s.mailboxClusterBenchtime = "100ms", "100ms"
		s.idleSockets, s.idleRounds, s.idleSocketsLarge, s.wakeDeliveries, s.stormSockets = 2_000, 1, 0, 1_000, 2_000
	}
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.IntVar(&s.rounds, "rounds", s.rounds, "rounds per relay in the channel comparison; the first is dropped")
	fs.IntVar(&s.frames, "frames", s.frames, "round trips per relay per round")
	fs.IntVar(&s.phones, "phones", s.phones, "concurrent phone channels")
	fs.IntVar(&s.size, "size", s.size, "bytes per phone frame")
	fs.IntVar(&s.idlePhones, "idle-phones", s.idlePhones, "idle phone channels per relay in the channel memory figure")
	fs.IntVar(&s.count, "count", s.count, "go test -count for the micro benchmarks")
	fs.StringVar(&s.benchtime, "benchtime", s.benchtime, "go test -benchtime for the micro benchmarks")
	fs.StringVar(&s.out, "out", s.out, "report file, relative to the module root")
	fs.DurationVar(&s.timeout, "timeout", s.timeout, "bound on the whole run")
	fs.DurationVar(&s.mailboxRound, "mailbox-round", s.mailboxRound, "one side's time per round and figure in the pinned mailbox comparison's reads (rounds as -rounds)")
	fs.DurationVar(&s.mailboxPutRound, "mailbox-put-round", s.mailboxPutRound, "one side's time per round in the pinned mailbox comparison's synced PUTs (rounds as -rounds)")
	fs.IntVar(&s.watchSockets, "watch-sockets", s.watchSockets, "idle watch sockets per server in the mailbox memory figure")
	fs.DurationVar(&s.signalRound, "signal-round", s.signalRound, "one relay's time per round in the signal comparison (rounds as -rounds)")
	fs.IntVar(&s.signalPairs, "signal-pairs", s.signalPairs, "signal rendezvous open on each relay, both sides connected")
	fs.IntVar(&s.agentRounds, "agent-rounds", s.agentRounds, "rounds per relay in the agent routing comparison; the first is dropped")
	fs.IntVar(&s.agentFrames, "agent-frames", s.agentFrames, "frames per direction per round in the agent routing comparison")
	fs.DurationVar(&s.agentLatency, "agent-latency", s.agentLatency, "length of one agent latency run")
	fs.IntVar(&s.agentLatencyRounds, "agent-latency-rounds", s.agentLatencyRounds, "counted agent latency rounds per relay and direction")
	fs.BoolVar(&s.turn, "turn", s.turn, "run the TURN comparison against coturn (needs turnserver and taskset)")
	fs.IntVar(&s.turnRounds, "turn-rounds", s.turnRounds, "rounds per payload in the TURN comparison; the first is a warm-up")
	fs.DurationVar(&s.turnRound, "turn-round", s.turnRound, "counted time of one TURN run")
	fs.BoolVar(&s.webrtc, "webrtc", s.webrtc, "run the real-traffic TURN comparison: two headless Chromium pages through ours and coturn (skipped, and said so, without /usr/bin/chromium)")
	fs.IntVar(&s.webrtcRounds, "webrtc-rounds", s.webrtcRounds, "rounds of the WebRTC comparison; the first is a warm-up")
	fs.IntVar(&s.webrtcMB, "webrtc-mb", s.webrtcMB, "MB moved per WebRTC run")
	fs.IntVar(&s.pushCount, "push-count", s.pushCount, "go test -count for the push benchmarks")
	fs.StringVar(&s.pushBenchtime, "push-benchtime", s.pushBenchtime, "go test -benchtime for the push benchmarks")
	fs.StringVar(&s.pushClusterBenchtime, "push-cluster-benchtime", s.pushClusterBenchtime, "go test -benchtime of each case and round of the push gateway in cluster mode vs single node")
	fs.StringVar(&s.mailboxClusterBenchtime, "mailbox-cluster-benchtime", s.mailboxClusterBenchtime, "go test -benchtime of each case and round of the mailbox's cluster backend vs raw JetStream (3 rounds, QUICK 1)")
	fs.IntVar(&s.idleSockets, "idle-sockets", s.idleSockets, "idle sockets of each kind per server in the parked vs unparked memory figures (capped to the open-file limit, and said so)")
	fs.IntVar(&s.idleSocketsLarge, "idle-sockets-large", s.idleSocketsLarge, "idle sockets of each kind per server in a second memory pass, one round per side (capped to the open-file limit, and said so; 0 skips it)")
	fs.IntVar(&s.idleRounds, "idle-rounds", s.idleRounds, "servers per side in each parked vs unparked memory figure and in the wake figure")
	fs.IntVar(&s.wakeSockets, "wake-sockets", s.wakeSockets, "watch sockets per server in the wake figure")
	fs.IntVar(&s.wakeDeliveries, "wake-deliveries", s.wakeDeliveries, "deliveries per server in the wake figure")
	fs.IntVar(&s.stormSockets, "storm-sockets", s.stormSockets, "watch sockets reset and reconnected in the reconnect storm")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return s, nil
}

func main() {
	s, err := parseSettings(os.Args[1:], os.Getenv("QUICK") == "1")
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(2)
	}
	if err := run(s); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(s settings) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	goVersion, err := goOutput(ctx, root, "env", "GOVERSION")
	if err != nil {
		return err
	}
	// Everything that goes to the terminal also goes into the report's
	// raw-output block.
	var raw bytes.Buffer
	progress := io.MultiWriter(&raw, os.Stderr)
	var parts [][2]string
	timed := func(name string, f func() string) {
		t0 := time.Now()
		what := f()
		parts = append(parts, [2]string{name, fmt.Sprintf("%s; %v", what, time.Since(t0).Round(time.Second))})
	}

	// The server programs, built at once (one go build links them in
	// parallel); a comparison whose program is missing builds its own.
	tmp, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var bins servers
	timed("server programs", func() string {
		var berr error
		bins, berr = buildServers(ctx, root, tmp)
		if berr != nil {
			fmt.Fprintf(progress, "building the server programs: %v\n", berr)
			return "failed to build (each comparison builds its own)"
		}
		return fmt.Sprintf("%d built with one go build", len(bins))
	})

	var chRep *channelbench.Report
	var compareErr error
	timed("channel comparison", func() string {
		fmt.Fprintf(progress, "\n== channel forwarding: ours vs baseline, each relay in a process of its own, %d rounds of %d frames, %d phones, %d B\n",
			s.rounds, s.frames, s.phones, s.size)
		rep, err := channelbench.Compare(ctx, channelbench.CompareOptions{
			Rounds: s.rounds, Frames: s.frames, Phones: s.phones, FrameSize: s.size, Binary: bins.path("channelserve"), Progress: progress,
		})
		if compareErr = err; err != nil {
			fmt.Fprintf(progress, "comparison failed: %v\n", err)
			return "failed (see the table and the raw output)"
		}
		chRep = &rep
		fmt.Fprintf(progress, "median: ours %.0f, baseline %.0f round trips per relay CPU-second, ratio %.2f\n",
			rep.Ours.MedianPerCPU, rep.Baseline.MedianPerCPU, rep.Ratio)
		return fmt.Sprintf("%d rounds per relay (first dropped) of %s round trips, %d phones, %d B frames, alternated; %s",
			s.rounds, thousands(float64(s.frames)), s.phones, s.size,
			pinnedText(rep.Pinned, rep.Options.ServerCPU, rep.Options.LoadCPU, "relay", rep.Warnings))
	})
	var idle *channelbench.IdleReport
	var idleErr error
	timed("channel idle phones", func() string {
		fmt.Fprintf(progress, "\n== private channel idle phone channels: ours vs baseline, %s phones, a relay process each\n", thousands(float64(s.idlePhones)))
		bin := bins.path("channelserve")
		if bin == "" {
			if bin, idleErr = channelbench.BuildChannelserve(ctx, root, tmp); idleErr != nil {
				return "failed to build channelserve"
			}
		}
		rep, err := channelbench.CompareIdle(ctx, channelbench.IdleOptions{Binary: bin, Phones: s.idlePhones, Progress: progress})
		if idleErr = err; err != nil {
			fmt.Fprintf(progress, "comparison failed: %v\n", err)
			return "failed (see the table and the raw output)"
		}
		idle = &rep
		return fmt.Sprintf("%s idle phone channels on %d computers per relay", thousands(float64(s.idlePhones)), rep.Computers)
	})

	var mb mailboxResults
	timed("mailbox comparisons", func() string {
		mb = runMailbox(ctx, s, bins, progress)
		return mailboxInfo(s, mb)
	})
	var sig signalResults
	timed("signal comparison", func() string {
		sig = runSignal(ctx, s, bins, progress)
		return signalInfo(s, sig)
	})
	var ag agentResults
	timed("agent routing comparison", func() string {
		ag = runAgent(ctx, s, bins, progress)
		return agentInfo(ag)
	})
	var idle18 idleResults
	timed("idle sockets parked vs unparked", func() string {
		idle18 = runIdle(ctx, s, bins, root, tmp, progress)
		return idleInfo(s, idle18)
	})
	var tr turnResults
	timed("TURN comparison", func() string {
		tr = runTURN(ctx, s, bins, progress)
		return turnInfo(s, tr)
	})
	var wr webrtcResults
	timed("TURN WebRTC comparison", func() string {
		wr = runWebRTC(ctx, s, bins, progress)
		return webrtcInfo(s, wr)
	})

	// The micro and push benchmarks run after the comparisons, never
	// beside them: on 2 cores they would measure each other.
	var testOut bytes.Buffer
	var testErr error
	timed("micro and push benchmarks", func() string {
		var micro []string
		for _, b := range benchRuns(s) {
			testErr = errors.Join(testErr, goBench(ctx, root, b, &testOut, progress))
			micro = append(micro, b.String())
		}
		return fmt.Sprintf("`go test -run=^$ -benchmem` with %s", strings.Join(micro, "; "))
	})
	bench := parseBench(&testOut)

	var rows []row
	rows = append(rows, channelRows(chRep, compareErr, bench)...)
	rows = append(rows, channelIdleRows(idle, idleErr)...)
	rows = append(rows, bucketRows(bench)...)
	rows = append(rows, controlRows(bench)...)
	rows = append(rows, sdkRows(bench)...)
	rows = append(rows, mailboxRows(mb, bench)...)
	rows = append(rows, signalRows(sig, bench)...)
	rows = append(rows, agentRows(ag)...)
	rows = append(rows, idleRows(idle18)...)
	rows = append(rows, pushFanoutRows(bench)...)
	rows = append(rows, turnRows(tr)...)
	rows = append(rows, webrtcRows(wr)...)
	rows = append(rows, pushgwRows(bench)...)
	rows = append(rows, pushgwClusterRows(bench)...)
	rows = append(rows, mailboxClusterRows(bench)...)
	rows = append(rows, routeClusterRows(bench)...)
	info := runInfo{
		date:      start,
		cpu:       cpuModel(),
		cores:     runtime.NumCPU(),
		procs:     runtime.GOMAXPROCS(0),
		goVersion: goVersion,
		osArch:    runtime.GOOS + "/" + runtime.GOARCH,
		quick:     s.quick,
		parts:     parts,
		elapsed:   time.Since(start),
	}
	report := render(info, rows, raw.String())
	out := s.out
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s in %v\n\n", out, info.elapsed.Round(time.Second))
	for _, line := range strings.Split(report, "\n") {
		if strings.HasPrefix(line, "|") {
			fmt.Println(line)
		}
	}
	return errors.Join(compareErr, idleErr, mb.err(), sig.err, ag.err, idle18.err(), tr.err, wr.err, testErr)
}

// serverPackages are the server programs of the out-of-process
// comparisons.
var serverPackages = []string{
	"edgerelay/bench/channelbench/cmd/channelserve",
	"edgerelay/bench/mailboxbench/cmd/mailboxserve",
	"edgerelay/bench/mailboxbench/cmd/watchmem",
	"edgerelay/bench/signalbench/cmd/signalserve",
	"edgerelay/bench/agentbench/cmd/agentserve",
	"edgerelay/bench/turnbench/cmd/turnserve",
	"edgerelay/bench/idlebench/cmd/idleserve",
}

// servers are the built server programs by name ("channelserve", …).
type servers map[string]string

// path is the named program, or "" (the comparison then builds it).
func (s servers) path(name string) string { return s[name] }

// buildServers builds every server program into dir with one go build.
func buildServers(ctx context.Context, root, dir string) (servers, error) {
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, serverPackages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, out)
	}
	bins := servers{}
	for _, p := range serverPackages {
		bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// goBench runs one `go test -bench`, its output going to out and
// progress. A package that fails to build or a failing benchmark leaves
// its rows missing; the rest of the report still stands.
func goBench(ctx context.Context, root string, b benchRun, out, progress io.Writer) error {
	args := append([]string{"test", "-run=^$", "-bench=" + b.pattern, "-benchmem",
		"-count=" + fmt.Sprint(b.count), "-benchtime=" + b.benchtime}, b.pkgs...)
	fmt.Fprintf(progress, "\n== go %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Stdout = io.MultiWriter(out, progress)
	cmd.Stderr = progress
	err := cmd.Run()
	if err != nil {
		fmt.Fprintf(progress, "go test: %v\n", err)
	}
	return err
}

// moduleRoot is the directory of the main module's go.mod, so the report
// lands in the same place whatever the working directory.
func moduleRoot(ctx context.Context) (string, error) {
	gomod, err := goOutput(ctx, "", "env", "GOMOD")
	if err != nil {
		return "", err
	}
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module: run from the edgerelay checkout")
	}
	return filepath.Dir(gomod), nil
}

func goOutput(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// cpuModel is the first "model name" of /proc/cpuinfo, or what the
// platform is when there is no such file.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU (" + runtime.GOARCH + ")"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return "unknown CPU (" + runtime.GOARCH + ")"
}
