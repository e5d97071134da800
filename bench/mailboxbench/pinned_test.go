package mailboxbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestComparePinnedSmoke runs the pinned comparison end to end at a toy
// size: mailboxserve built and started for each relay and for raw Pebble
// (pinned when the machine allows), reads checked and counted, PUTs and
// raw commits counted, CPU time and allocations read, a profile taken,
// the rows rendered. Its figures mean nothing; `make bench` takes them.
func TestComparePinnedSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	progress := &stampedLog{start: time.Now()}
	profiles := t.TempDir()
	rep, err := ComparePinned(ctx, PinnedOptions{
		Rounds:     2,
		RoundTime:  100 * time.Millisecond,
		Conns:      2,
		Mailboxes:  4,
		Stored:     3,
		Writers:    []int{4}, // one PUT figure: one writer takes the same path
		DataDir:    t.TempDir(),
		ProfileDir: profiles,
		Progress:   progress,
	})
	t.Logf("\n%s", progress.b.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("took %v, pinned %v, warnings %q", time.Since(start).Round(time.Millisecond), rep.Pinned, rep.Warnings)
	var names []string
	for _, f := range rep.Figures {
		names = append(names, f.Name)
		for _, s := range []PinnedSide{f.Ours, f.Other} {
			if len(s.Runs) != 1 {
				t.Errorf("%s, %s: %d counted runs, want 1", f.Name, s.Name, len(s.Runs))
				continue
			}
			r := s.Runs[0]
			if r.Ops == 0 || r.Elapsed <= 0 || s.PerSec <= 0 {
				t.Errorf("%s, %s: %+v", f.Name, s.Name, r)
			}
			// CPU time is counted in 10 ms ticks: a synced-write round of
			// 100 ms on a loaded machine may show none, so only its
			// sign is checked here; the report's rounds are seconds long.
			if r.CPU < 0 {
				t.Errorf("%s, %s: negative server CPU time: %+v", f.Name, s.Name, r)
			}
		}
		if f.WallRatio <= 0 {
			t.Errorf("%s: wall ratio %v", f.Name, f.WallRatio)
		}
	}
	want := "HEAD of a direction|GET of one envelope|PUT synced, 4 writers"
	if got := strings.Join(names, "|"); got != want {
		t.Errorf("figures %s, want %s", got, want)
	}
	// Both sides of each of the three figures.
	if len(rep.Profiles) != 6 {
		t.Errorf("%d profiles, want 6 (warnings %q)", len(rep.Profiles), rep.Warnings)
	}
	for _, p := range rep.Profiles {
		if fi, err := os.Stat(p.File); err != nil || fi.Size() == 0 || filepath.Dir(p.File) != profiles {
			t.Errorf("profile %s: %v", p.File, err)
		}
		if !strings.Contains(p.Top, "flat%") {
			t.Errorf("profile %s: top %q", p.Figure, p.Top)
		}
	}
	if rep.Floor == nil || len(rep.Floor.Runs) != 1 || rep.Floor.PerSec <= 0 {
		t.Errorf("HTTP floor: %+v", rep.Floor)
	}
	md := rep.Markdown()
	// Two rows per figure and the HTTP floor's after the HEAD rows.
	if rows := strings.Count(md, "\n"); rows != 7 {
		t.Errorf("%d rows, want 7:\n%s", rows, md)
	}
	if lines := strings.Split(md, "\n"); !strings.HasPrefix(lines[2], "| HTTP floor for the HEAD rows") {
		t.Errorf("third row is not the HTTP floor's: %.80s", lines[2])
	}
	for line := range strings.Lines(md) {
		if strings.Count(line, " | ") != 4 || !strings.HasPrefix(line, "| ") {
			t.Errorf("not a 5-column row: %q", line)
		}
	}
	t.Logf("\n%s", md)
}

// stampedLog keeps progress lines, each with the time since start.
type stampedLog struct {
	start time.Time
	b     strings.Builder
}

func (l *stampedLog) Write(p []byte) (int, error) {
	fmt.Fprintf(&l.b, "%6.2fs %s", time.Since(l.start).Seconds(), p)
	return len(p), nil
}
