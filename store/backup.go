package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Backups. A backup is a Pebble checkpoint: a directory that is itself a
// Pebble store, consistent as of one instant, holding exactly the bytes of
// the store (secrets as SHA-256 digests, push registrations sealed, as at
// rest). Restore is a byte copy of it into a data dir that holds no store.

// BackupInfo describes a backup written by Checkpoint or restored by
// Restore.
type BackupInfo struct {
	Path    string `json:"path"`
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
	Version uint64 `json:"version"` // the store's format version
}

// Errors of backup and restore.
var (
	// ErrNotEmpty refuses a backup into a directory that holds files, or
	// a restore into a data dir whose pebble directory does.
	ErrNotEmpty = errors.New("not empty")
	// ErrStoreLocked refuses a restore into a data dir whose store a
	// running process holds.
	ErrStoreLocked = errors.New("store is in use")
)

// Checkpoint writes a consistent copy of the store into dir, which must
// not exist or be empty. Pebble syncs the WAL first, so every write
// committed before the call is in the copy; on the same filesystem the
// tables are hard links (they are immutable), so the copy is cheap: move
// it to other storage to survive the loss of this disk.
func (db *DB) Checkpoint(dir string) (BackupInfo, error) {
	if err := emptyOrAbsent(dir); err != nil {
		return BackupInfo{}, err
	}
	// Pebble creates the directory itself and refuses one that exists.
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return BackupInfo{}, fmt.Errorf("store: backup into %s: %w", dir, err)
	}
	if err := db.pdb.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return BackupInfo{}, fmt.Errorf("store: backup into %s: %w", dir, err)
	}
	// Pebble makes it 0755; the data dir's store is 0700.
	if err := os.Chmod(dir, 0o700); err != nil {
		return BackupInfo{}, fmt.Errorf("store: backup into %s: %w", dir, err)
	}
	files, size, err := dirSize(dir)
	if err != nil {
		return BackupInfo{}, fmt.Errorf("store: backup into %s: %w", dir, err)
	}
	return BackupInfo{Path: dir, Files: files, Bytes: size, Version: db.version}, nil
}

// emptyOrAbsent refuses a directory that holds anything (or a file).
func emptyOrAbsent(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("store: backup into %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("store: backup into %s: %w: it holds %d entries (%s, …); a backup goes into a new or empty directory", dir, ErrNotEmpty, len(entries), entries[0].Name())
	}
	return nil
}

// Restore copies the backup in backupDir into <dataDir>/pebble, which
// must not exist or be empty and must not be locked by a running process.
// The copy goes to a sibling directory first and is renamed into place
// once complete and synced, so a failed restore leaves no half store that
// a server would open. A backup of a newer format than this binary's is
// refused, and nothing is left in the data dir; an older one is migrated
// by the next Open.
func Restore(backupDir, dataDir string) (BackupInfo, error) {
	target := filepath.Join(dataDir, "pebble")
	if err := unlocked(target); err != nil {
		return BackupInfo{}, err
	}
	entries, err := os.ReadDir(target)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return BackupInfo{}, fmt.Errorf("store: restore into %s: %w", target, err)
	}
	if len(entries) > 0 {
		return BackupInfo{}, fmt.Errorf("store: restore into %s: %w: the data dir holds a store already; restore into a fresh data dir", target, ErrNotEmpty)
	}
	if fi, err := os.Stat(backupDir); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return BackupInfo{}, fmt.Errorf("store: restore from %s: %w", backupDir, err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return BackupInfo{}, fmt.Errorf("store: restore: data dir: %w", err)
	}
	tmp := target + ".restoring"
	if err := os.RemoveAll(tmp); err != nil { // a failed restore's leftover
		return BackupInfo{}, fmt.Errorf("store: restore: %w", err)
	}
	fail := func(err error) (BackupInfo, error) {
		_ = os.RemoveAll(tmp)
		return BackupInfo{}, err
	}
	if err := copyDir(backupDir, tmp); err != nil {
		return fail(fmt.Errorf("store: restore from %s: %w", backupDir, err))
	}
	// The copy is read, not the backup: should Pebble ever write in a
	// read-only open, the backup stays as it was.
	version, err := probeVersion(tmp, defaultVersioning())
	var newer *NewerVersionError
	switch {
	case errors.As(err, &newer):
		newer.Dir = backupDir
		return fail(fmt.Errorf("store: restore from %s: %w", backupDir, err))
	case err != nil:
		return fail(fmt.Errorf("store: restore from %s: not a store backup: %w", backupDir, err))
	case version == 0:
		return fail(fmt.Errorf("store: restore from %s: not a store backup: it holds no database", backupDir))
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(fmt.Errorf("store: restore into %s: %w", target, err))
	}
	if err := os.Rename(tmp, target); err != nil {
		return fail(fmt.Errorf("store: restore into %s: %w", target, err))
	}
	if err := syncDir(dataDir); err != nil {
		return BackupInfo{}, fmt.Errorf("store: restore into %s: %w", target, err)
	}
	files, size, err := dirSize(target)
	if err != nil {
		return BackupInfo{}, fmt.Errorf("store: restore into %s: %w", target, err)
	}
	return BackupInfo{Path: target, Files: files, Bytes: size, Version: version}, nil
}

// unlocked refuses a Pebble directory whose lock another process holds
// (Pebble's own lock, the one a server takes for as long as it runs).
func unlocked(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	l, err := pebble.LockDirectory(dir, vfs.Default)
	if err != nil {
		return fmt.Errorf("store: restore into %s: %w: a server is running on this data dir (stop it, and restore into a fresh data dir): %v", dir, ErrStoreLocked, err)
	}
	return l.Close()
}

// copyDir copies the regular files of src into dst (created 0700) and
// syncs each file and dst itself. Pebble's lock file is not copied.
func copyDir(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "LOCK" {
			continue
		}
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file: a store backup holds only files", filepath.Join(src, e.Name()))
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return syncDir(dst)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	return errors.Join(err, out.Close())
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// dirSize counts the files of dir and their bytes.
func dirSize(dir string) (files int, size int64, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return 0, 0, err
		}
		if fi.Mode().IsRegular() {
			files++
			size += fi.Size()
		}
	}
	return files, size, nil
}
