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
		Rounds:       2,
		RoundTime:    100 * time.Millisecond,
		PutRoundTime: 150 * time.Millisecond,
		Conns:        2,
		Pipeline:     3,
		Mailboxes:    4,
		Stored:       3,
		Writers:      []int{4}, // one PUT figure: one writer takes the same path
		DataDir:      t.TempDir(),
		ProfileDir:   profiles,
		Progress:     progress,
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
	reads := "HEAD of a direction|GET of one envelope|HEAD of one envelope|"
	want := reads + reads + "PUT synced, 4 writers"
	if got := strings.Join(names, "|"); got != want {
		t.Errorf("figures %s, want %s", got, want)
	}
	for i, depth := range []int{1, 1, 1, 3, 3, 3} {
		if rep.Figures[i].Depth != depth {
			t.Errorf("figure %d (%s): depth %d, want %d", i, rep.Figures[i].Name, rep.Figures[i].Depth, depth)
		}
	}
	// Both sides of each of the seven figures, and the PUT floor's.
	if len(rep.Profiles) != 15 {
		t.Errorf("%d profiles, want 15 (warnings %q)", len(rep.Profiles), rep.Warnings)
	}
	for _, p := range rep.Profiles {
		if fi, err := os.Stat(p.File); err != nil || fi.Size() == 0 || filepath.Dir(p.File) != profiles {
			t.Errorf("profile %s: %v", p.File, err)
		}
		if !strings.Contains(p.Top, "flat%") {
			t.Errorf("profile %s: top %q", p.Figure, p.Top)
		}
	}
	for _, depth := range []int{1, 3} {
		if f, ok := rep.Floors[depth]; !ok || len(f.Runs) != 1 || f.PerSec <= 0 {
			t.Errorf("HTTP floor, %d in flight: %+v", depth, f)
		}
	}
	if f, ok := rep.PutFloors[4]; !ok || len(f.Ours.Runs) != 1 || f.Ours.PerSec <= 0 || f.Other.PerSec <= 0 {
		t.Errorf("PUT floor, 4 writers: %+v", f)
	}
	md := rep.Markdown()
	// Two rows per figure, and a floor's after each HEAD and PUT figure.
	lines := strings.Split(md, "\n")
	if len(lines) != 18 {
		t.Errorf("%d rows, want 17:\n%s", len(lines)-1, md)
	} else {
		for _, i := range []int{2, 9, 16} {
			if !strings.HasPrefix(lines[i], "| HTTP floor for the ") {
				t.Errorf("row %d is not a floor's: %.80s", i+1, lines[i])
			}
		}
		if !strings.Contains(lines[7], "3 requests pipelined") {
			t.Errorf("row 8 is not the pipelined HEAD's: %.200s", lines[7])
		}
		// Reads run RoundTime rounds, PUTs PutRoundTime ones.
		if !strings.Contains(lines[0], "rounds of 100ms") || !strings.Contains(lines[14], "rounds of 150ms") || !strings.Contains(lines[16], "rounds of 150ms") {
			t.Errorf("round times: HEAD row %.300s; PUT row %.300s", lines[0], lines[14])
		}
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
