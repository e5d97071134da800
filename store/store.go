// Package store keeps every piece of durable relay state in one Pebble
// database inside the data dir. The database is opened once per process;
// every write that is acknowledged to a client goes through Commit, which
// syncs the write-ahead log before it returns, and concurrent committers
// share syncs through Pebble's group commit.
package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// blockCacheBytes sizes Pebble's block cache.
const blockCacheBytes = 64 << 20

// ErrNotFound is returned by Get for a key that holds no value.
var ErrNotFound = errors.New("store: not found")

// DB is the relay's Pebble database.
type DB struct {
	pdb     *pebble.DB
	dir     string
	health  *health
	version uint64 // the store's format version (version.go)
	metrics *storeMetrics
}

// Options are the settings of Open that a server sets and a command does not.
type Options struct {
	// DiskReserve is the free space (bytes) the store keeps in its
	// filesystem: below it every write is refused with ErrUnavailable
	// until space is back, and half of it is held in <data dir>/ballast
	// for Pebble to finish with when the disk fills anyway. 0: no guard.
	DiskReserve uint64

	// freeBytes replaces the measure of free space in tests.
	freeBytes func(dir string) (uint64, error)
	// versions replaces this binary's format version and migration steps
	// in tests; noVersion writes a store as it was before versions
	// existed (the fixture's generator).
	versions  *versioning
	noVersion bool
}

// Open opens (creating if needed) the database in <dataDir>/pebble.
// Pebble's own lock file makes a second process fail here instead of
// corrupting the store, which is how the command line learns that a server
// is running on the same data dir.
func Open(dataDir string, log *slog.Logger) (*DB, error) {
	return OpenOptions(dataDir, log, Options{})
}

// OpenOptions is Open with the server's options.
func OpenOptions(dataDir string, log *slog.Logger, o Options) (*DB, error) {
	dir := filepath.Join(dataDir, "pebble")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create %s: %w", dir, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	vs := defaultVersioning()
	if o.versions != nil {
		vs = *o.versions
	}
	// Before anything below writes (the ballast, Pebble's own files): a
	// store of a newer format is refused untouched. Another failure of the
	// probe (it reads without the lock, so a running server's writes may
	// trip it; or the store is damaged) is left to Pebble's open below,
	// which takes the lock and says which.
	if !o.noVersion {
		if _, err := probeVersion(dir, vs); errors.Is(err, ErrNewerVersion) {
			return nil, fmt.Errorf("store: open %s: %w", dir, err)
		}
	}
	plog := log.With("component", "pebble")
	bal := newBallast(filepath.Join(dataDir, ballastFile), o.DiskReserve/2)
	h := newHealth(dir, o.DiskReserve, bal, log.With("component", "store"))
	if o.freeBytes != nil {
		h.freeBytes = o.freeBytes
	}
	if bal.held() {
		if free, err := h.freeBytes(dir); err == nil && free < o.DiskReserve {
			// A start on a full disk: Pebble needs room to replay its log.
			if err := bal.release(); err == nil {
				log.Warn("disk nearly full at start: ballast released", "path", bal.path, "free", free)
			}
		}
	}
	// The block cache holds the index and data blocks that reads of
	// recent envelopes hit; Pebble's 8 MiB default missed on every GET of
	// a few MiB of mailboxes (measured: 0 hits at 8 MiB, 99.7% at 16).
	cache := pebble.NewCache(blockCacheBytes)
	defer cache.Unref() // the DB holds its own reference
	opts := &pebble.Options{
		Cache: cache,
		// Pebble's informational chatter (compactions, flushes) goes to our
		// structured log at debug level; errors stay errors, and a fatal
		// error marks the store failed instead of ending the process.
		Logger:        pebbleLogger{log: plog, health: h},
		EventListener: h.listener(),
	}
	pdb, err := pebble.Open(dir, opts)
	if err == nil {
		if f := h.failed.Load(); f != nil {
			err = errors.Join(*f, pdb.Close())
		}
	}
	var version uint64
	if err == nil && !o.noVersion {
		if version, err = upgrade(pdb, dir, vs, log.With("component", "store")); err != nil {
			err = errors.Join(err, pdb.Close())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	h.check(time.Now())
	go h.run()
	return &DB{pdb: pdb, dir: dir, health: h, version: version, metrics: newStoreMetrics()}, nil
}

// Close flushes nothing extra (every acknowledged write is already in the
// synced WAL) and releases the lock so the next process can open the store.
func (db *DB) Close() error {
	db.stopHealth()
	if err := db.pdb.Close(); err != nil {
		return fmt.Errorf("store: close %s: %w", db.dir, err)
	}
	return nil
}

func (db *DB) stopHealth() {
	select {
	case <-db.health.stop:
	default:
		close(db.health.stop)
	}
	<-db.health.done
}

// Unavailable returns why the store refuses writes right now (an
// ErrUnavailable), or nil while it takes them: the readiness of a server.
func (db *DB) Unavailable() error { return db.health.unavailable() }

// Busy reports whether Pebble is flushing a memtable or compacting tables
// right now: background work that a benchmark lets finish before it
// measures the next round.
func (db *DB) Busy() bool { return PebbleBusy(db.pdb) }

// PebbleBusy is Busy for any Pebble database.
func PebbleBusy(pdb *pebble.DB) bool {
	m := pdb.Metrics()
	return m.Flush.NumInProgress > 0 || m.Compact.NumInProgress > 0
}

// Dir is the Pebble directory, for tests that inspect the raw files.
func (db *DB) Dir() string { return db.dir }

// Get returns a copy of the value stored at key, or ErrNotFound.
func (db *DB) Get(key []byte) ([]byte, error) {
	v, closer, err := db.pdb.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get: %w", err)
	}
	out := bytes.Clone(v)
	if cerr := closer.Close(); cerr != nil {
		return nil, fmt.Errorf("store: get: %w", cerr)
	}
	return out, nil
}

// Batch collects writes that become durable together.
type Batch struct{ b *pebble.Batch }

// NewBatch starts an empty batch; Commit or Discard it.
func (db *DB) NewBatch() *Batch { return &Batch{b: db.pdb.NewBatch()} }

// Set records key=value in the batch.
func (b *Batch) Set(key, value []byte) error {
	if err := b.b.Set(key, value, nil); err != nil {
		return fmt.Errorf("store: batch set: %w", err)
	}
	return nil
}

// Delete records the removal of key in the batch.
func (b *Batch) Delete(key []byte) error {
	if err := b.b.Delete(key, nil); err != nil {
		return fmt.Errorf("store: batch delete: %w", err)
	}
	return nil
}

// DeleteRange records the removal of every key in [start, end).
func (b *Batch) DeleteRange(start, end []byte) error {
	if err := b.b.DeleteRange(start, end, nil); err != nil {
		return fmt.Errorf("store: batch delete range: %w", err)
	}
	return nil
}

// Discard drops an uncommitted batch.
func (b *Batch) Discard() { _ = b.b.Close() }

// Commit applies the batch and syncs the write-ahead log before returning:
// only after Commit returns nil may a write be acknowledged to a client.
// Concurrent Commits are grouped by Pebble into one fsync.
//
// While the store refuses writes (see ErrUnavailable) Commit returns an
// error that wraps ErrUnavailable at once, without going to Pebble. A
// Commit that fails this way stored nothing; one that fails because
// Pebble failed during it may have been applied whole or not at all
// (batches are atomic), never in part.
func (db *DB) Commit(b *Batch) error {
	defer b.Discard()
	if err := db.health.admit(); err != nil {
		db.metrics.refused.Inc()
		return fmt.Errorf("store: commit: %w", err)
	}
	n := b.b.Len() // before Apply, which may take a large batch's data
	start := time.Now()
	err := db.pdb.Apply(b.b, pebble.Sync)
	err = db.health.committed(n, err)
	db.metrics.commitDone(time.Since(start), err)
	if err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// Scan calls fn for every key with the given prefix in key order. The
// slices passed to fn are only valid during the call. Returning an error
// from fn stops the scan and returns that error.
func (db *DB) Scan(prefix []byte, fn func(key, value []byte) error) error {
	it, err := db.pdb.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: PrefixEnd(prefix)})
	if err != nil {
		return fmt.Errorf("store: scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, verr := it.ValueAndErr()
		if verr != nil {
			_ = it.Close()
			return fmt.Errorf("store: scan value: %w", verr)
		}
		if err := fn(it.Key(), v); err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: scan: %w", err)
	}
	return nil
}

// PrefixEnd returns the smallest key greater than every key with prefix,
// or nil (no upper bound) when prefix is all 0xff.
func PrefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// pebbleLogger routes Pebble's log calls into slog. Pebble's messages
// carry file and job numbers, so each is logged under one constant message
// with the text as an attribute: the log limiter then sees a storm of them
// as the repeats they are.
type pebbleLogger struct {
	log    *slog.Logger
	health *health
}

func (l pebbleLogger) Infof(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("pebble", "detail", fmt.Sprintf(format, args...))
	}
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("pebble error", "detail", fmt.Sprintf(format, args...))
}

// Fatalf is Pebble's "cannot go on" (a failed commit or MANIFEST write, a
// broken invariant). Ending the process here, as Pebble's default logger
// does, took every service down with it, reads included; instead the
// store is marked failed: writes are refused until a restart, reads go on.
// Pebble returns from the call site as if nothing happened (Apply returns
// nil), so Commit checks the mark after every Apply.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.health.fail(fmt.Sprintf(format, args...))
}

// Flush writes the memtable to disk, for tests that inspect the raw files.
func (db *DB) Flush() error {
	if err := db.pdb.Flush(); err != nil {
		return fmt.Errorf("store: flush: %w", err)
	}
	return nil
}
