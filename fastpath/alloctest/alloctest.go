// Package alloctest measures how often a step allocates, the way the
// zero-allocation proofs of the forwarding paths need it: after a warm-up
// (buffers and queues grow to their steady-state sizes), testing's
// AllocsPerRun, which rounds down, and the exact malloc count over as many
// more runs, which says whether anything at all slipped through. Both count
// every malloc in the process, the server's goroutines included.
package alloctest

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// Count is one measurement.
type Count struct {
	// PerRun is testing.AllocsPerRun's average (rounded down).
	PerRun float64
	// Mallocs is the exact count over Runs more runs.
	Mallocs uint64
	Runs    int
}

// Exact is Mallocs per run.
func (c Count) Exact() float64 { return float64(c.Mallocs) / float64(c.Runs) }

// Measure runs step warm times, then runs times under AllocsPerRun and
// runs times more under an exact count. An error from step fails t.
func Measure(t testing.TB, warm, runs int, step func() error) Count {
	t.Helper()
	for range warm {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	var failed error
	avg := testing.AllocsPerRun(runs, func() {
		if failed == nil {
			failed = step()
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	return Count{PerRun: avg, Mallocs: after.Mallocs - before.Mallocs, Runs: runs}
}

// RaceEnabled reports whether the test binary was built with -race, from
// the build settings every Go binary carries. Under the race detector
// sync.Pool drops some of what is put back, on purpose, so counts are not
// meaningful there; the proofs assert their zeros in runs without it.
func RaceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// SkipUnderRace skips an allocation proof in a -race run (see
// RaceEnabled): make test runs every test named Alloc once more without
// it, where the proof asserts its zeros.
func SkipUnderRace(t testing.TB) {
	t.Helper()
	if RaceEnabled() {
		t.Skip("allocation counts are not meaningful under -race; make test asserts them in its run without it")
	}
}
