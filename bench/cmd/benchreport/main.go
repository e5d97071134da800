// Command benchreport is `make bench`: it runs the private channel relay
// against its baseline (package bench/channelbench), runs the micro
// benchmarks of the hot path with `go test -bench`, and writes
// bench/results/latest.md with each figure beside its baseline, the ratio
// and the design's goal for it.
//
// Run it from anywhere inside the module:
//
//	go run ./bench/cmd/benchreport [flags]
//
// QUICK=1 in the environment shortens every default (about a minute in
// all) for a smoke run; flags given explicitly still win.
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

// microPackages are the packages whose benchmarks the report reads.
func microPackages() []string {
	return []string{"./fastpath/bucket/", "./fastpath/channel/control/", "./fastpath/channel/"}
}

// settings are the run's knobs, from flags over QUICK-aware defaults.
type settings struct {
	rounds, frames, phones, size int
	count                        int
	benchtime                    string
	out                          string
	timeout                      time.Duration
	quick                        bool
}

func parseSettings(args []string, quick bool) (settings, error) {
	// The full run takes about 4 minutes on 2 cores, well under the 15
	// that `make bench` may take; the quick one, a smoke test of the whole
	// pipeline, well under 2 with a cold build cache. The timeouts only
	// guard against a hang and sit above those.
	s := settings{rounds: 8, frames: 200_000, phones: 4, size: 1024, count: 5, benchtime: "1s",
		out: filepath.Join("bench", "results", "latest.md"), timeout: 20 * time.Minute, quick: quick}
	if quick {
		s.rounds, s.frames, s.count, s.benchtime, s.timeout = 3, 30_000, 1, "100ms", 5*time.Minute
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

	// The micro benchmarks run after the comparison, never beside it: on
	// 2 cores they would measure each other.
	args := append([]string{"test", "-run=^$", "-bench=.", "-benchmem",
		"-count=" + fmt.Sprint(s.count), "-benchtime=" + s.benchtime}, microPackages()...)
	fmt.Fprintf(progress, "\n== go %s\n", strings.Join(args, " "))
	microStart := time.Now()
	var testOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Stdout = io.MultiWriter(&testOut, progress)
	cmd.Stderr = progress
	testErr := cmd.Run()
	microTook := time.Since(microStart)
	if testErr != nil {
		// A package that fails to build or a failing benchmark leaves its
		// rows missing; the rest of the report still stands.
		fmt.Fprintf(progress, "go test: %v\n", testErr)
	}
	bench := parseBench(&testOut)

	var rows []row
	rows = append(rows, channelRows(repPtr, compareErr, bench)...)
	rows = append(rows, bucketRows(bench)...)
	rows = append(rows, controlRows(bench)...)
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
		micro: fmt.Sprintf("`go test -bench=. -benchmem -count=%d -benchtime=%s` on %s; %v",
			s.count, s.benchtime, strings.Join(microPackages(), " "), microTook.Round(time.Second)),
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
	return errors.Join(compareErr, testErr)
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
