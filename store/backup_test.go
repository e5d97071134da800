package store

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// backupOf writes a store with one channel key and one envelope, and a
// checkpoint of it into <tmp>/backup while it is open.
func backupOf(t *testing.T, o Options) (string, BackupInfo) {
	t.Helper()
	db := openWith(t, t.TempDir(), o)
	defer db.Close()
	if err := NewChannelClaims(db).AddKey(h("claim-key"), "alpha", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if err := NewEnvelopeLog(db).Put("notes/backup-mailbox", DirP2C, 1, []byte("envelope one"), nil, 0); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "backup")
	info, err := db.Checkpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Written after the checkpoint: not in it.
	if err := NewEnvelopeLog(db).Put("notes/backup-mailbox", DirP2C, 2, []byte("envelope two"), nil, 0); err != nil {
		t.Fatal(err)
	}
	return dir, info
}

func TestBackupRestoreRoundTrip(t *testing.T) {
	backup, info := backupOf(t, Options{})
	files, size, err := dirSize(backup)
	if err != nil || info.Path != backup || info.Version != Version || info.Files != files || info.Bytes != size || files == 0 {
		t.Fatalf("info %+v, dir has %d files %d bytes (%v)", info, files, size, err)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("backup dir mode: %v %v", fi.Mode(), err)
	}
	before := fileState(t, backup)
	data := t.TempDir()
	restored, err := Restore(backup, data)
	if err != nil {
		t.Fatal(err)
	}
	if restored.Path != filepath.Join(data, "pebble") || restored.Version != Version || restored.Files == 0 {
		t.Fatalf("restored %+v", restored)
	}
	if after := fileState(t, backup); !reflect.DeepEqual(before, after) {
		t.Fatal("restore changed the backup")
	}
	if _, err := os.Stat(filepath.Join(data, "pebble.restoring")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary copy left: %v", err)
	}
	db := openTemp(t, data)
	defer db.Close()
	if db.Version() != Version {
		t.Fatalf("version %d", db.Version())
	}
	if keys, err := NewChannelClaims(db).Keys(); err != nil || len(keys) != 1 || keys[0].Host != "alpha" {
		t.Fatalf("keys %+v %v", keys, err)
	}
	l := NewEnvelopeLog(db)
	var got string
	if ok, err := l.Envelope("notes/backup-mailbox", DirP2C, 1, func(e []byte) { got = string(e) }); !ok || err != nil || got != "envelope one" {
		t.Fatalf("envelope 1: %t %q %v", ok, got, err)
	}
	if ok, err := l.Envelope("notes/backup-mailbox", DirP2C, 2, func([]byte) {}); ok || err != nil {
		t.Fatalf("envelope written after the checkpoint is in it: %t %v", ok, err)
	}
}

func TestBackupIntoEmptyDirAndRefusesNonEmpty(t *testing.T) {
	db := openTemp(t, t.TempDir())
	defer db.Close()
	empty := t.TempDir()
	if _, err := db.Checkpoint(empty); err != nil {
		t.Fatalf("empty dir: %v", err)
	}
	full := t.TempDir()
	keep := filepath.Join(full, "notes.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := db.Checkpoint(full)
	if !errors.Is(err, ErrNotEmpty) || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("non-empty dir: %v", err)
	}
	if raw, err := os.ReadFile(keep); err != nil || string(raw) != "mine" {
		t.Fatalf("the dir's file: %q %v", raw, err)
	}
	if entries, _ := os.ReadDir(full); len(entries) != 1 {
		t.Fatalf("refused backup wrote %d entries", len(entries))
	}
}

func TestRestoreRefusesADataDirWithAStore(t *testing.T) {
	backup, _ := backupOf(t, Options{})
	data := t.TempDir()
	db := openTemp(t, data)
	// Open: the lock says a server is running.
	if _, err := Restore(backup, data); !errors.Is(err, ErrStoreLocked) {
		t.Fatalf("locked: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Closed: the store is there all the same. (Taking Pebble's lock to
	// look re-creates the empty lock file: its time is all that changes.)
	before := lockTimeless(fileState(t, data))
	if _, err := Restore(backup, data); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("store present: %v", err)
	}
	if after := lockTimeless(fileState(t, data)); !reflect.DeepEqual(before, after) {
		t.Fatalf("the refused restore changed the data dir:\nbefore %v\nafter  %v", before, after)
	}
}

func TestRestoreRefusesANewerBackup(t *testing.T) {
	backup, info := backupOf(t, Options{versions: &versioning{current: Version + 1}})
	if info.Version != Version+1 {
		t.Fatalf("backup version %d", info.Version)
	}
	data := t.TempDir()
	_, err := Restore(backup, data)
	want := "store format 2 is newer than this binary's 1: run a binary of that version or newer"
	if !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), want) {
		t.Fatalf("restore: %v", err)
	}
	if entries, _ := os.ReadDir(data); len(entries) != 0 {
		t.Fatalf("the refused restore left %v", entries)
	}
}

func TestRestoreRefusesWhatIsNotABackup(t *testing.T) {
	notStore := t.TempDir()
	if err := os.WriteFile(filepath.Join(notStore, "photo.jpg"), []byte("jpeg"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"missing": filepath.Join(t.TempDir(), "nope"), "empty": t.TempDir(), "other files": notStore} {
		data := t.TempDir()
		if _, err := Restore(dir, data); err == nil {
			t.Fatalf("%s: restored", name)
		}
		if entries, _ := os.ReadDir(data); len(entries) != 0 {
			t.Fatalf("%s: the refused restore left %v", name, entries)
		}
	}
}

// lockTimeless drops the modification time of Pebble's lock file from a
// fileState, keeping its presence, mode and (empty) content.
func lockTimeless(state map[string]string) map[string]string {
	for p, s := range state {
		if filepath.Base(p) == "LOCK" {
			f := strings.Fields(s)
			state[p] = f[0] + " " + f[2]
		}
	}
	return state
}
