package mailboxbench

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgerelay/store"
)

func TestComparePutSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	rep, err := ComparePut(ctx, PutOptions{Writers: []int{1, 4}, Rounds: 3, RoundTime: 100 * time.Millisecond,
		EnvelopeSize: 200, DataDir: t.TempDir(), Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if len(rep.Figures) != 2 || rep.Figures[0].Writers != 1 || rep.Figures[1].Writers != 4 {
		t.Fatalf("figures %+v, want one per writer count in order", rep.Figures)
	}
	for _, f := range rep.Figures {
		// Three rounds, the first dropped.
		if len(f.Ours) != 2 || len(f.Pebble) != 2 || f.OursMedian <= 0 || f.PebbleMedian <= 0 ||
			f.Ratio != f.OursMedian/f.PebbleMedian || f.RoundRatio <= 0 {
			t.Errorf("implausible figure %+v", f)
		}
	}
	if got := strings.Count(out.String(), "\n"); got != 2*2*3 {
		t.Errorf("%d progress lines, want 12", got)
	}
}

func TestComparePutRefusesBadOptions(t *testing.T) {
	for _, o := range []PutOptions{{Rounds: 1}, {EnvelopeSize: 24}, {EnvelopeSize: 65537}, {Writers: []int{0}}} {
		if _, err := ComparePut(context.Background(), o); err == nil {
			t.Errorf("no error for %+v", o)
		}
	}
}

// Every acknowledged PUT is on disk: after a run, a reopened store holds
// each writer's envelopes up to the last sequence it saw acknowledged.
func TestPutRigStoresWhatItAcknowledged(t *testing.T) {
	dir := t.TempDir()
	rig, err := newPutRig(dir, 3, 100)
	if err != nil {
		t.Fatal(err)
	}
	for side := range 2 {
		if _, err := loadN(context.Background(), 30, 3, func(w int) func() error { return rig.op(side, w) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := rig.close(); err != nil {
		t.Fatal(err)
	}
	for w := range 3 {
		if rig.next[w] < 1 || rig.rawNext[w] < 1 {
			t.Errorf("writer %d wrote nothing (%d, %d)", w, rig.next[w], rig.rawNext[w])
		}
	}
	if got := storedCounts(t, dir, 3); fmt.Sprint(got) != fmt.Sprint(rig.next) {
		t.Errorf("stored %v envelopes per mailbox, acknowledged %v", got, rig.next)
	}
}

// BenchmarkPut writes b.N envelopes of 1 KiB through each side, spread
// over the writers: ours over loopback HTTP, each 201 synced; raw Pebble
// batches of one Set applied with pebble.Sync. ns/op is wall time per
// write across all writers (the inverse of the rate); allocs/op counts
// the whole process, load generator included.
func BenchmarkPut(b *testing.B) {
	for _, writers := range []int{1, 64} {
		for side, name := range putSides {
			b.Run(fmt.Sprintf("writers=%d/%s", writers, name), func(b *testing.B) {
				rig, err := newPutRig(b.TempDir(), writers, 1024)
				if err != nil {
					b.Fatal(err)
				}
				defer func() {
					if err := rig.close(); err != nil {
						b.Error(err)
					}
				}()
				b.ReportAllocs()
				b.ResetTimer()
				rate, err := loadN(context.Background(), b.N, writers, func(w int) func() error { return rig.op(side, w) })
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(rate, "writes/s")
			})
		}
	}
}

// storedCounts reopens the store of a closed put rig in dir and counts
// the envelopes of mailboxes 0..n-1.
func storedCounts(t *testing.T, dir string, n int) []uint64 {
	t.Helper()
	db, err := store.Open(filepath.Join(dir, "ours"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := store.NewEnvelopeLog(db)
	counts := make([]uint64, n)
	for i := range counts {
		st, err := log.State(mailboxName(i), store.DirP2C)
		if err != nil {
			t.Fatal(err)
		}
		counts[i] = uint64(st.Count)
	}
	return counts
}
