package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// The store's format version. Every record's key starts with a service
// byte, a printable letter ('a', 'c', 'g', 'm': keyspace.go and the files
// of each service); the version record's key starts with 0x00, which no
// service byte is, so no service's prefix can ever reach it, and it sorts
// before every record:
//
//	0x00 'v'    format version of the whole store (8 BE)
//
// A store written before versions existed has no such record; its layout
// is version 1.
const versionKey = "\x00v"

// Version is the store format this binary reads and writes. Bump it with a
// migration step from the previous version in migrations.
const Version = 1

// ErrNewerVersion refuses a store written by a newer binary: this one does
// not know its layout and must not write to it.
var ErrNewerVersion = errors.New("store format is newer than this binary's")

// NewerVersionError says which versions met in which Pebble directory.
type NewerVersionError struct {
	Dir          string
	Store, Known uint64
}

func (e *NewerVersionError) Error() string {
	return fmt.Sprintf("store format %d is newer than this binary's %d: run a binary of that version or newer", e.Store, e.Known)
}

// Unwrap makes errors.Is(err, ErrNewerVersion) hold.
func (e *NewerVersionError) Unwrap() error { return ErrNewerVersion }

// migration turns a store at format From into From+1.
type migration struct {
	From uint64
	// Apply reads the store through r and adds the step's writes to b.
	// The version bump joins the same batch and is committed synced, so a
	// crash leaves the store at From or at From+1, never in between. (A
	// step too large for one batch would have to be idempotent and commit
	// its own batches before the bump; none exists yet.)
	Apply func(r pebble.Reader, b *pebble.Batch) error
}

// migrations is the table of steps, one per version after the first. It
// is empty: version 1 is today's layout.
func migrations() []migration { return nil }

// versioning is what OpenOptions checks a store against: this binary's
// version and steps, or a test's.
type versioning struct {
	current uint64
	steps   []migration
}

func defaultVersioning() versioning { return versioning{current: Version, steps: migrations()} }

func encodeVersion(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// storedVersion reads the version record of r: its version and true, or
// false when there is none.
func storedVersion(r pebble.Reader) (uint64, bool, error) {
	raw, closer, err := r.Get([]byte(versionKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the format version: %w", err)
	}
	defer closer.Close()
	if len(raw) != 8 {
		return 0, false, fmt.Errorf("the format version record holds %d bytes, not 8: the store is damaged or not edgerelay's", len(raw))
	}
	v := binary.BigEndian.Uint64(raw)
	if v == 0 {
		return 0, false, errors.New("the format version record says 0: the store is damaged or not edgerelay's")
	}
	return v, true, nil
}

// hasRecords reports whether r holds any key at all.
func hasRecords(r pebble.Reader) (bool, error) {
	it, err := r.NewIter(nil)
	if err != nil {
		return false, err
	}
	ok := it.First()
	return ok, it.Close()
}

// effectiveVersion is the version of the store in r: the record's, 1 for
// a store with records but no version record (written before versions
// existed), 0 for an empty store.
func effectiveVersion(r pebble.Reader) (uint64, error) {
	v, ok, err := storedVersion(r)
	if err != nil || ok {
		return v, err
	}
	data, err := hasRecords(r)
	if err != nil {
		return 0, fmt.Errorf("look for records: %w", err)
	}
	if data {
		return 1, nil
	}
	return 0, nil
}

// probeVersion opens the Pebble directory read-only and returns its
// version: 0 when there is no database yet or it is empty. A newer
// version is refused here, before the read-write open that would change
// files. A read-only open writes no WAL, MANIFEST or OPTIONS file, and
// through noLockFS it does not touch the lock file either (Pebble's lock
// re-creates it, which truncates it). Without the lock it may read a store
// that a running process is writing: it only reads, and the read-write
// open that follows takes the lock and reports the running process.
func probeVersion(dir string, vs versioning) (uint64, error) {
	pdb, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, FS: noLockFS{vfs.Default}, Logger: quietLogger{}})
	if errors.Is(err, pebble.ErrDBDoesNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := effectiveVersion(pdb)
	err = errors.Join(err, pdb.Close())
	if err != nil {
		return 0, err
	}
	if v > vs.current {
		return 0, &NewerVersionError{Dir: dir, Store: v, Known: vs.current}
	}
	return v, nil
}

// noLockFS is the filesystem with a lock that does nothing, for the
// read-only probe. (Opening the lock file for a lock of our own would be
// worse than none: closing any descriptor of a file drops every POSIX
// lock this process holds on it, a store this process has open included.)
type noLockFS struct{ vfs.FS }

func (noLockFS) Lock(string) (io.Closer, error) { return noLock{}, nil }

type noLock struct{}

func (noLock) Close() error { return nil }

// upgrade brings the open store to vs.current: an empty store gets the
// version written, one without a record gets 1 (its layout), then each
// step runs in order, each in one synced batch with its version bump. It
// returns the version the store is at.
func upgrade(pdb *pebble.DB, dir string, vs versioning, log *slog.Logger) (uint64, error) {
	v, err := effectiveVersion(pdb)
	if err != nil {
		return 0, err
	}
	_, recorded, err := storedVersion(pdb)
	if err != nil {
		return 0, err
	}
	switch {
	case v > vs.current:
		// The probe saw an older store; another process wrote it since.
		return 0, &NewerVersionError{Dir: dir, Store: v, Known: vs.current}
	case v == 0:
		if err := pdb.Set([]byte(versionKey), encodeVersion(vs.current), pebble.Sync); err != nil {
			return 0, fmt.Errorf("record the format version: %w", err)
		}
		return vs.current, nil
	case !recorded:
		if err := pdb.Set([]byte(versionKey), encodeVersion(v), pebble.Sync); err != nil {
			return 0, fmt.Errorf("record the format version: %w", err)
		}
		log.Info("store format recorded", "dir", dir, "version", v)
	}
	for v < vs.current {
		step, ok := findStep(vs.steps, v)
		if !ok {
			return v, fmt.Errorf("no migration from store format %d (this binary writes %d)", v, vs.current)
		}
		b := pdb.NewBatch()
		err := step.Apply(pdb, b)
		if err == nil {
			err = b.Set([]byte(versionKey), encodeVersion(v+1), nil)
		}
		if err == nil {
			err = pdb.Apply(b, pebble.Sync)
		}
		_ = b.Close()
		if err != nil {
			return v, fmt.Errorf("migrate store format %d to %d: %w", v, v+1, err)
		}
		log.Info("store migrated", "dir", dir, "from", v, "to", v+1)
		v++
	}
	return v, nil
}

func findStep(steps []migration, from uint64) (migration, bool) {
	for _, s := range steps {
		if s.From == from {
			return s, true
		}
	}
	return migration{}, false
}

// Version is the format version of the open store.
func (db *DB) Version() uint64 { return db.version }

// quietLogger drops the chatter of the read-only opens (the version
// probe, a backup's check); their errors come back as errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}
