// Command benchreport is `make bench`: it runs the private channel relay
// against its baseline (package bench/channelbench), the mailbox relay
// against its yardsticks (package bench/mailboxbench: raw Pebble synced
// commits, the net/http baseline, idle watch sockets in a server process
// of their own), the mailbox's signal forwarding against its net/http +
// gorilla/websocket baseline (package bench/signalbench, each relay in a
// process of its own), our TURN server against coturn (package
// bench/turnbench), runs the micro benchmarks of the hot path and the
// push benchmarks (mailbox push fan-out, push gateway /send, both to the
// fake APNs) with `go test -bench`, and writes bench/results/latest.md
// with each figure beside its baseline, the ratio and the design's goal
// for it.
//
// Run it from anywhere inside the module:
//
//	go run ./bench/cmd/benchreport [flags]
//
// QUICK=1 in the environment shortens every default (well under two
// minutes in all) for a smoke run; flags given explicitly still win.
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
	"edgerelay/bench/mailboxbench"
)

// microPackages are the packages whose benchmarks the report reads.
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
	return []benchRun{
		{".", microPackages(), s.count, s.benchtime},
		{mailboxMicroBench, []string{mailboxMicroPackage}, s.count, s.benchtime},
		{signalMicroBench, []string{signalMicroPackage}, s.count, s.benchtime},
		{pushFanoutBench, []string{pushFanoutPackage}, s.pushCount, s.pushBenchtime},
		{pushgwBench, []string{pushgwPackage}, s.pushCount, s.pushBenchtime},
	}
}

// settings are the run's knobs, from flags over QUICK-aware defaults.
type settings struct {
	rounds, frames, phones, size int
	count                        int
	benchtime                    string
	out                          string
	timeout                      time.Duration
	quick                        bool
	// mailboxRound is one side's time in one round of the mailbox PUT and
	// read comparisons; watchSockets the idle watch sockets per server.
	mailboxRound time.Duration
	watchSockets int
	// signalRound is one relay's load time in one round of the signal
	// comparison (rounds as -rounds); signalPairs the rendezvous open.
	signalRound time.Duration
	signalPairs int
	// turn turns the TURN comparison on; turnRounds and turnRound are its
	// rounds per payload (the first a warm-up) and counted time per run.
	turn       bool
	turnRounds int
	turnRound  time.Duration
	// pushCount and pushBenchtime are -count and -benchtime of the push
	// benchmarks.
	pushCount     int
	pushBenchtime string
}

func parseSettings(args []string, quick bool) (settings, error) {
	// The full run takes about 10 minutes on 2 cores (channel 1, mailbox
	// 1, signal 1, TURN 1.5, micro and push benchmarks 5), under the 15
	// that `make bench` may take; the quick one, a smoke test of the whole
	// pipeline, about 1 with a warm build cache. The timeouts only
	// guard against a hang and sit above those.
	s := settings{rounds: 8, frames: 200_000, phones: 4, size: 1024, count: 5, benchtime: "1s",
		out: filepath.Join("bench", "results", "latest.md"), timeout: 20 * time.Minute, quick: quick,
		mailboxRound: time.Second, watchSockets: 10_000,
		signalRound: time.Second, signalPairs: 32,
		turn: true, turnRounds: 7, turnRound: 2 * time.Second,
		pushCount: 3, pushBenchtime: "3s"}
	if quick {
		s.rounds, s.frames, s.count, s.benchtime, s.timeout = 3, 30_000, 1, "100ms", 5*time.Minute
		s.mailboxRound = 500 * time.Millisecond
		s.signalRound = 250 * time.Millisecond
		s.turnRounds, s.turnRound = 2, 300*time.Millisecond
		s.pushCount, s.pushBenchtime = 1, "500ms"
	}
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.IntVar(&s.rounds, "rounds", s.rounds, "rounds per relay in the channel comparison; the first is dropped")
	fs.IntVar(&s.frames, "frames", s.frames, "round trips per relay per round")
	fs.IntVar(&s.phones, "phones", s.phones, "concurrent phone channels")
	fs.IntVar(&s.size, "size", s.size, "bytes per phone frame")
	fs.IntVar(&s.count, "count", s.count, "go test -count for the micro benchmarks")
	fs.StringVar(&s.benchtime, "benchtime", s.benchtime, "go test -benchtime for the micro benchmarks")
	fs.StringVar(&s.out, "out", s.out, "report file, relative to the module root")
	fs.DurationVar(&s.timeout, "timeout", s.timeout, "bound on the whole run")
	fs.DurationVar(&s.mailboxRound, "mailbox-round", s.mailboxRound, "one side's time per round in the mailbox PUT and read comparisons (rounds as -rounds)")
	fs.IntVar(&s.watchSockets, "watch-sockets", s.watchSockets, "idle watch sockets per server in the mailbox memory figure")
	fs.DurationVar(&s.signalRound, "signal-round", s.signalRound, "one relay's time per round in the signal comparison (rounds as -rounds)")
	fs.IntVar(&s.signalPairs, "signal-pairs", s.signalPairs, "signal rendezvous open on each relay, both sides connected")
	fs.BoolVar(&s.turn, "turn", s.turn, "run the TURN comparison against coturn (needs turnserver and taskset)")
	fs.IntVar(&s.turnRounds, "turn-rounds", s.turnRounds, "rounds per payload in the TURN comparison; the first is a warm-up")
	fs.DurationVar(&s.turnRound, "turn-round", s.turnRound, "counted time of one TURN run")
	fs.IntVar(&s.pushCount, "push-count", s.pushCount, "go test -count for the push benchmarks")
	fs.StringVar(&s.pushBenchtime, "push-benchtime", s.pushBenchtime, "go test -benchtime for the push benchmarks")
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

	fmt.Fprintf(progress, "== channel forwarding: ours vs baseline, %d rounds of %d frames, %d phones, %d B\n",
		s.rounds, s.frames, s.phones, s.size)
	compareStart := time.Now()
	rep, compareErr := channelbench.Compare(ctx, channelbench.CompareOptions{
		Rounds: s.rounds, Frames: s.frames, Phones: s.phones, FrameSize: s.size, Progress: progress,
	})
	compareTook := time.Since(compareStart)
	var repPtr *channelbench.Report
	if compareErr != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", compareErr)
	} else {
		repPtr = &rep
		fmt.Fprintf(progress, "median: ours %.0f, baseline %.0f frames/s, ratio %.2f\n",
			rep.Ours.Median, rep.Baseline.Median, rep.Ratio)
	}

	mailboxStart := time.Now()
	mb := runMailbox(ctx, s, root, progress)
	mailboxTook := time.Since(mailboxStart)

	signalStart := time.Now()
	sig := runSignal(ctx, s, progress)
	signalTook := time.Since(signalStart)

	turnStart := time.Now()
	tr := runTURN(ctx, s, progress)
	turnTook := time.Since(turnStart)

	// The micro and push benchmarks run after the comparisons, never
	// beside them: on 2 cores they would measure each other.
	microStart := time.Now()
	var testOut bytes.Buffer
	var testErr error
	for _, b := range benchRuns(s) {
		testErr = errors.Join(testErr, goBench(ctx, root, b, &testOut, progress))
	}
	microTook := time.Since(microStart)
	bench := parseBench(&testOut)

	var rows []row
	rows = append(rows, channelRows(repPtr, compareErr, bench)...)
	rows = append(rows, bucketRows(bench)...)
	rows = append(rows, controlRows(bench)...)
	rows = append(rows, mailboxRows(mb, bench)...)
	rows = append(rows, signalRows(sig, bench)...)
	rows = append(rows, pushFanoutRows(bench)...)
	rows = append(rows, turnRows(tr)...)
	rows = append(rows, pushgwRows(bench)...)
	var micro []string
	for _, b := range benchRuns(s) {
		micro = append(micro, b.String())
	}
	info := runInfo{
		date:      start,
		cpu:       cpuModel(),
		cores:     runtime.NumCPU(),
		procs:     runtime.GOMAXPROCS(0),
		goVersion: goVersion,
		osArch:    runtime.GOOS + "/" + runtime.GOARCH,
		quick:     s.quick,
		compare: fmt.Sprintf("%d rounds per relay (first dropped) of %s frames, %d phones, %d B frames, alternated; %v",
			s.rounds, thousands(float64(s.frames)), s.phones, s.size, compareTook.Round(time.Second)),
		mailbox: fmt.Sprintf("%d rounds per side (first dropped) of %v, alternated; PUTs of 1 KiB envelopes by 1 and 64 writers; "+
			"HEAD and GET over 8 connections; %s idle watch sockets per server; %v",
			s.rounds, s.mailboxRound, thousands(float64(s.watchSockets)), mailboxTook.Round(time.Second)),
		signal:  signalInfo(s, sig, signalTook),
		turn:    turnInfo(s, tr, turnTook),
		micro:   fmt.Sprintf("`go test -run=^$ -benchmem` with %s; %v", strings.Join(micro, "; "), microTook.Round(time.Second)),
		elapsed: time.Since(start),
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
	fmt.Printf("\nwrote %s\n\n", out)
	for _, line := range strings.Split(report, "\n") {
		if strings.HasPrefix(line, "|") {
			fmt.Println(line)
		}
	}
	return errors.Join(compareErr, mb.err(), sig.err, tr.err, testErr)
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

// mailboxResults are the mailbox comparisons' reports, each with the error
// that stopped it (its rows then say so).
type mailboxResults struct {
	put              mailboxbench.PutReport
	reads            mailboxbench.ReadReport
	watch            mailboxbench.WatchReport
	putErr, readsErr error
	watchErr         error
}

func (m mailboxResults) err() error { return errors.Join(m.putErr, m.readsErr, m.watchErr) }

// runMailbox runs the mailbox comparisons one after the other: envelope
// PUTs against raw Pebble, reads against the net/http baseline, then the
// memory of idle watch sockets (its server program built first).
func runMailbox(ctx context.Context, s settings, root string, progress io.Writer) mailboxResults {
	var m mailboxResults
	fmt.Fprintf(progress, "\n== mailbox envelope PUT, synced: ours over loopback HTTP vs raw Pebble, %d rounds of %v\n", s.rounds, s.mailboxRound)
	m.put, m.putErr = mailboxbench.ComparePut(ctx, mailboxbench.PutOptions{Rounds: s.rounds, RoundTime: s.mailboxRound, Progress: progress})
	if m.putErr != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", m.putErr)
	}
	fmt.Fprintf(progress, "\n== mailbox HEAD and GET over loopback: ours vs baseline, %d rounds of %v\n", s.rounds, s.mailboxRound)
	m.reads, m.readsErr = mailboxbench.CompareReads(ctx, mailboxbench.ReadOptions{Rounds: s.rounds, RoundTime: s.mailboxRound, Progress: progress})
	if m.readsErr != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", m.readsErr)
	}
	fmt.Fprintf(progress, "\n== mailbox idle watch sockets: ours vs baseline, %s sockets, a server process each\n", thousands(float64(s.watchSockets)))
	m.watchErr = func() error {
		dir, err := os.MkdirTemp("", "benchreport-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin, err := mailboxbench.BuildWatchmem(ctx, root, dir)
		if err != nil {
			return err
		}
		m.watch, err = mailboxbench.CompareWatchMemory(ctx, mailboxbench.WatchOptions{Binary: bin, Sockets: s.watchSockets, Progress: progress})
		return err
	}()
	if m.watchErr != nil {
		fmt.Fprintf(progress, "comparison failed: %v\n", m.watchErr)
	}
	return m
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
