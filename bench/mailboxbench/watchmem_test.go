package mailboxbench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/serverproc"
)

// buildWatchmem builds the server program once per test binary run.
func buildWatchmem(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := BuildWatchmem(ctx, ".", tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

func TestCompareWatchMemorySmall(t *testing.T) {
	bin := buildWatchmem(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	profiles := t.TempDir()
	// 3 per direction: 400 sockets over 67 mailboxes, the last one
	// holding only some.
	rep, err := CompareWatchMemory(ctx, WatchOptions{Binary: bin, Sockets: 400, PerDirection: 3, ProfileDir: profiles, Progress: &out})
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	// Each socket is a reader goroutine in ours (its writer runs only
	// while something is queued), a reader and a writer in the baseline;
	// anything else means a socket leaks or lost a goroutine. (A few more
	// may come and go: fasthttp keeps idle workers for a while, net/http's
	// serving goroutines end a moment after their answer.)
	if err := rep.Check(400, serverproc.Goroutines{Lo: 0.98, Hi: 1.05}, serverproc.Goroutines{Lo: 1.98, Hi: 2.05}); err != nil {
		t.Error(err)
	}
	if err := serverproc.CheckProfiles(profiles, func(side string) string { return "watchmem-" + side + "-0.pprof" }); err != nil {
		t.Error(err)
	}
}

// A ninth socket on one direction is refused, so PerDirection cannot go
// past the spec's cap, and a server that cannot start is an error.
func TestCompareWatchMemoryRefusesBadOptions(t *testing.T) {
	for _, o := range []WatchOptions{{}, {Binary: "x", PerDirection: 9}, {Binary: "x", Sockets: -1}} {
		if _, err := CompareWatchMemory(context.Background(), o); err == nil {
			t.Errorf("no error for %+v", o)
		}
	}
	if _, err := CompareWatchMemory(context.Background(), WatchOptions{Binary: filepath.Join(t.TempDir(), "none"), Sockets: 1}); err == nil {
		t.Error("no error for a missing server program")
	}
}

// BenchmarkWatchMemory measures 2,000 idle watch sockets on each relay per
// iteration and reports the bytes of resident memory each one costs.
func BenchmarkWatchMemory(b *testing.B) {
	bin := buildWatchmem(b)
	var ours, base float64
	b.ReportAllocs() // the load generator's, for what they are worth: the servers are other processes
	for b.Loop() {
		rep, err := CompareWatchMemory(context.Background(), WatchOptions{Binary: bin, Sockets: 2000})
		if err != nil {
			b.Fatal(err)
		}
		ours, base = rep.OursMedian, rep.BaselineMedian
	}
	b.ReportMetric(ours, "ours-B/socket")
	b.ReportMetric(base, "baseline-B/socket")
}
