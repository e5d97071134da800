package store

import (
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/fastpath/promtest"
)

// commitCount is the number of commits the histogram timed.
func commitCount(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "edgerelay_store_commit_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no edgerelay_store_commit_seconds")
	return 0
}

// The write series exist at zero once registered, a commit is timed, a
// refused write is counted as refused and not timed, and a commit Pebble
// returns an error for is timed and counted as failed.
func TestStoreMetricsMove(t *testing.T) {
	const reserve = 1 << 20
	disk := &fakeDisk{}
	disk.free.Store(4 * reserve)
	db, _ := openGuarded(t, reserve, disk)
	reg := prometheus.NewRegistry()
	if err := db.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := db.RegisterMetrics(reg); err == nil {
		t.Fatal("a second registration on one registry was accepted")
	}
	errs := func(reason string) float64 {
		return promtest.Must(t, reg, "edgerelay_store_commit_errors_total", map[string]string{"reason": reason})
	}
	if c, r, f := commitCount(t, reg), errs(commitRefused), errs(commitFailed); c != 0 || r != 0 || f != 0 {
		t.Fatalf("at start: commits %d, refused %v, failed %v; want 0 0 0", c, r, f)
	}

	if err := put(db, "a", 10); err != nil {
		t.Fatal(err)
	}
	if c := commitCount(t, reg); c != 1 {
		t.Fatalf("after one commit the histogram counts %d", c)
	}

	disk.free.Store(reserve - 1)
	waitFor(t, "refusal", func() bool { return db.Unavailable() != nil })
	if err := put(db, "b", 10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write below the reserve: %v", err)
	}
	if c, r, f := commitCount(t, reg), errs(commitRefused), errs(commitFailed); c != 1 || r != 1 || f != 0 {
		t.Fatalf("after a refused write: commits %d, refused %v, failed %v; want 1 1 0", c, r, f)
	}
	disk.free.Store(4 * reserve)
	waitFor(t, "recovery", func() bool { return db.Unavailable() == nil })

	// Pebble returns an error from Apply: a database opened read-only
	// (what a failed disk does to a commit is the same path: an error, or
	// the fatal mark, back from Apply).
	ro := readOnlyDB(t)
	ro.metrics = db.metrics
	b := ro.NewBatch()
	if err := b.Set([]byte("c"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := ro.Commit(b); err == nil {
		t.Fatal("commit to a read-only database succeeded")
	}
	if c, r, f := commitCount(t, reg), errs(commitRefused), errs(commitFailed); c != 2 || r != 1 || f != 1 {
		t.Fatalf("after a failed commit: commits %d, refused %v, failed %v; want 2 1 1", c, r, f)
	}
}

// readOnlyDB is a store whose Pebble was opened read-only: every Apply
// returns an error.
func readOnlyDB(t *testing.T) *DB {
	t.Helper()
	dataDir := t.TempDir()
	db, err := Open(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, "pebble")
	pdb, err := pebble.Open(dir, &pebble.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pdb.Close() })
	h := newHealth(dir, 0, newBallast(filepath.Join(dataDir, ballastFile), 0), slog.New(slog.DiscardHandler))
	return &DB{pdb: pdb, dir: dir, health: h, metrics: newStoreMetrics()}
}
