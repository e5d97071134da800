package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/agent"
	"edgerelay/store"
)

const backupUsage = `usage:
  edgerelay backup DIR    write a consistent copy of the store into DIR (new or empty)
  edgerelay restore DIR   copy the backup in DIR into the data dir, which must hold no store

backup asks the running server (found through RELAY_ADMIN_LISTEN and the
admin token in RELAY_DATA_DIR) to write a Pebble checkpoint of its store
into DIR: every write acknowledged before the command started is in it.
DIR is a path on the server's machine (the admin listener is loopback). With
no server running, backup opens the data dir's store and checkpoints it
itself. On the same filesystem the checkpoint hard-links the store's tables:
copy DIR to other storage (tar, rsync) to survive the loss of the disk.

restore copies DIR into <data dir>/pebble. It refuses a data dir whose store
a running server holds or that holds a store at all, and a backup written by
a newer binary (a store format this one does not know); an older one is
migrated when the server starts. Then start the server on that data dir.

A backup is a byte copy of the store, nothing else: secrets (claim keys,
tokens, pairing keys, API keys) stay SHA-256 digests and push registrations
stay sealed, as at rest. The data dir's other files are not in it: keep
agent/relay.key with the backup (put it into the new data dir before the
server starts, or every paired agent runtime refuses the new key it would
make); the admin token and a development TLS certificate are made anew.

Flags: --data-dir DIR and, for backup, --admin-listen HOST:PORT (defaults
from RELAY_DATA_DIR and RELAY_ADMIN_LISTEN, as serve reads them). Cluster
mode keeps its state in NATS JetStream, which these commands do not copy:
they refuse it.
`

// backupTimeout bounds a backup through the server: a checkpoint into
// another filesystem copies the whole store.
const backupTimeout = time.Hour

// serverBackup is what serve hands the admin listener for POST /v1/backup:
// a checkpoint of its store, or nil in cluster mode, whose state is in
// NATS and whose Pebble store holds nothing worth restoring.
func serverBackup(db *store.DB, clustered bool) func(dir string) (store.BackupInfo, error) {
	if clustered || db == nil {
		return nil
	}
	return db.Checkpoint
}

// errClusterBackup refuses backup and restore in cluster mode.
var errClusterBackup = errors.New("cluster mode keeps its state in NATS JetStream, which backup and restore do not copy; they cover the single-node store")

func runBackup(args []string, stdout, stderr io.Writer) int {
	values, err := config.Load(nil, os.Environ(), io.Discard)
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay backup: %v\n", err)
		return 2
	}
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	k := keysFlags(fs, values)
	dir, code, ok := oneDir(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if k.cluster {
		fmt.Fprintf(stderr, "edgerelay backup: %v\n", errClusterBackup)
		return 1
	}
	// The store checks this too; here it is said in the operator's words
	// before anything else happens.
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		fmt.Fprintf(stderr, "edgerelay backup: %s is not empty (it holds %s and %d more): a backup goes into a new or empty directory\n", dir, entries[0].Name(), len(entries)-1)
		return 1
	}
	var info store.BackupInfo
	by := "the running server"
	err = admin.CallWithin(backupTimeout, k.adminAddr, filepath.Join(k.dataDir, adminTokenFile),
		http.MethodPost, admin.BackupPath, admin.BackupRequest{Dir: dir}, http.StatusCreated, &info)
	if errors.Is(err, errNoServer) {
		by = "this command (no server running)"
		err = offlineBackup(k, dir, &info)
	}
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay backup: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "backup of %s written by %s to %s: store format %d, %d files, %d bytes\n",
		filepath.Join(k.dataDir, "pebble"), by, info.Path, info.Version, info.Files, info.Bytes)
	return 0
}

func offlineBackup(k *keysClient, dir string, info *store.BackupInfo) error {
	db, err := k.openOffline()
	if err != nil {
		return err
	}
	*info, err = db.Checkpoint(dir)
	return errors.Join(err, db.Close())
}

func runRestore(args []string, stdout, stderr io.Writer) int {
	values, err := config.Load(nil, os.Environ(), io.Discard)
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay restore: %v\n", err)
		return 2
	}
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	dataDir := fs.String("data-dir", values.String(config.EnvDataDir), "data dir to restore into")
	dir, code, ok := oneDir(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if clusterMode(values) {
		fmt.Fprintf(stderr, "edgerelay restore: %v\n", errClusterBackup)
		return 1
	}
	info, err := store.Restore(dir, *dataDir)
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay restore: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "restored %s into %s: store format %d, %d files, %d bytes\n", dir, info.Path, info.Version, info.Files, info.Bytes)
	if note := relayKeyNote(*dataDir); note != "" {
		fmt.Fprintln(stderr, note)
	}
	fmt.Fprintf(stdout, "start the server with RELAY_DATA_DIR=%s\n", *dataDir)
	return 0
}

// relayKeyNote warns when the restored store has paired agent instances
// and the data dir no agent relay key: the server would make a new one,
// which every paired runtime refuses.
func relayKeyNote(dataDir string) string {
	if _, err := os.Stat(filepath.Join(dataDir, agent.KeyFile)); err == nil {
		return ""
	}
	db, err := store.Open(dataDir, nil)
	if err != nil {
		return ""
	}
	defer db.Close()
	if inst, err := store.NewAgentStore(db).Instances(); err != nil || len(inst) == 0 {
		return ""
	}
	return fmt.Sprintf("note: the store has paired agent instances but %s is missing: copy the old data dir's file there before the server starts, or the runtimes refuse the new key it would make", filepath.Join(dataDir, agent.KeyFile))
}

// oneDir parses fs and its one positional argument, a directory, made
// absolute against the caller's working directory (the server has its own).
func oneDir(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (string, int, bool) {
	if code, ok := parseFlags(fs, args, backupUsage, stdout, stderr); !ok {
		return "", code, false
	}
	switch {
	case fs.NArg() == 0:
		return "", usageError(stderr, fs.Name(), "missing the directory", backupUsage), false
	case fs.NArg() > 1:
		return "", usageError(stderr, fs.Name(), fmt.Sprintf("unexpected argument %q", fs.Arg(1)), backupUsage), false
	}
	dir, err := filepath.Abs(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay %s: %v\n", fs.Name(), err)
		return "", 1, false
	}
	return dir, 0, true
}
