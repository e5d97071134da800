package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/pushgw/keycmd"
	"edgerelay/store"
)

const keysUsage = `usage:
  edgerelay keys agent relay-key | account add NAME | account list | pair-key ACCOUNT [--ttl 15m]
                       | instance list | instance revoke ID          agent relay accounts and pairing
  edgerelay keys push create --label L [--expires T] | list | disable | revoke   push gateway API keys
  edgerelay keys channel add --host NAME     create a claim key for a computer; prints the key once
  edgerelay keys channel list                list hosts and whether each key is used
  edgerelay keys channel revoke --host NAME  revoke a host's key and disconnect it

Each works against the running server (through RELAY_ADMIN_LISTEN and the
admin token in RELAY_DATA_DIR) or, when no server runs, on the store itself.
Flags may stand before or after the arguments; -- ends them. keys channel and
keys agent take --data-dir DIR and --admin-listen HOST:PORT (defaults from
RELAY_DATA_DIR and RELAY_ADMIN_LISTEN, as serve reads them); keys push reads
those two from the environment.
`

func runKeys(args []string, stdout, stderr io.Writer) int {
	if helpAsked(args) || len(args) >= 1 && args[0] == "channel" && helpAsked(args[1:]) {
		fmt.Fprint(stdout, keysUsage)
		return 0
	}
	if len(args) >= 1 && args[0] == "push" {
		return runPushKeys(args[1:], stdout, stderr)
	}
	if len(args) >= 1 && args[0] == "agent" {
		return runAgentKeys(args[1:], stdout, stderr)
	}
	if len(args) < 2 || args[0] != "channel" {
		fmt.Fprint(stderr, keysUsage)
		return 2
	}
	verb := args[1]
	values, err := config.Load(nil, os.Environ(), io.Discard)
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay keys: %v\n", err)
		return 2
	}
	fs := flag.NewFlagSet("keys channel "+verb, flag.ContinueOnError)
	k := keysFlags(fs, values)
	host := fs.String("host", "", "host name of the computer")
	if code, ok := parseFlags(fs, args[2:], keysUsage, stdout, stderr); !ok {
		return code
	}
	// The host is --host or the one positional argument, not both: a
	// second name would otherwise be dropped without a word.
	switch {
	case fs.NArg() > 1 || fs.NArg() == 1 && (*host != "" || verb == "list"):
		return usageError(stderr, fs.Name(), fmt.Sprintf("unexpected argument %q", fs.Arg(fs.NArg()-1)), keysUsage)
	case fs.NArg() == 1:
		*host = fs.Arg(0)
	}
	switch verb {
	case "add":
		if *host == "" {
			fmt.Fprint(stderr, keysUsage)
			return 2
		}
		key, err := k.add(*host)
		if err != nil {
			fmt.Fprintf(stderr, "edgerelay keys channel add: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "claim key for host %q (shown once; the relay keeps only its hash):\n%s\n", *host, key)
	case "list":
		list, err := k.list()
		if err != nil {
			fmt.Fprintf(stderr, "edgerelay keys channel list: %v\n", err)
			return 1
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOST\tUSED\tCLAIMED\tCONNECTED\tCREATED")
		for _, i := range list {
			fmt.Fprintf(tw, "%s\t%t\t%t\t%t\t%s\n", i.Host, i.Used, i.Claimed, i.Connected, i.Created.Format(time.RFC3339))
		}
		_ = tw.Flush()
	case "revoke":
		if *host == "" {
			fmt.Fprint(stderr, keysUsage)
			return 2
		}
		if err := k.revoke(*host); err != nil {
			fmt.Fprintf(stderr, "edgerelay keys channel revoke: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "revoked host %q\n", *host)
	default:
		fmt.Fprint(stderr, keysUsage)
		return 2
	}
	return 0
}

// keysFlags defines the flags that keys channel and keys agent share,
// --data-dir and --admin-listen (defaults from RELAY_DATA_DIR and
// RELAY_ADMIN_LISTEN, as serve reads them), and returns the client they
// configure once fs is parsed. (keys push, in package keycmd, takes both
// from the environment only.)
func keysFlags(fs *flag.FlagSet, values *config.Values) *keysClient {
	k := &keysClient{}
	fs.StringVar(&k.dataDir, "data-dir", values.String(config.EnvDataDir), "data dir of the relay")
	fs.StringVar(&k.adminAddr, "admin-listen", values.String(config.EnvAdminListen), "admin address of the running relay")
	k.cluster = clusterMode(values)
	return k
}

// keysClient reaches the key store through the running server when there
// is one, else opens the store directly (which fails while a server holds
// its lock, so the two never write at once).
type keysClient struct {
	dataDir, adminAddr string
	// cluster: the settings say cluster mode, where there is no store to
	// fall back to in the data dir.
	cluster bool
}

// clusterMode reports whether the settings put the relay in cluster mode.
func clusterMode(values *config.Values) bool {
	return values.String(config.EnvNATSURL) != "" || values.String(config.EnvNATSEmbedListen) != ""
}

// openOffline opens the data dir's store for a key command that found no
// server running; in cluster mode it refuses.
func (k keysClient) openOffline() (*store.DB, error) {
	if k.cluster {
		return nil, admin.ClusterOffline(k.adminAddr)
	}
	db, err := store.Open(k.dataDir, nil)
	if err != nil {
		return nil, fmt.Errorf("no server answered at %s and the store cannot be opened (is a server running with another admin address?): %w", k.adminAddr, err)
	}
	return db, nil
}

// errNoServer means no server answered: use the store directly.
var errNoServer = admin.ErrNoServer

func (k keysClient) add(host string) (string, error) {
	var resp admin.AddKeyResponse
	err := k.call(http.MethodPost, "", admin.AddKeyRequest{Host: host}, http.StatusCreated, &resp)
	if errors.Is(err, errNoServer) {
		err = k.offline(func(keys channel.Keys) error {
			var aerr error
			resp.Key, aerr = keys.Add(host)
			return aerr
		})
	}
	return resp.Key, err
}

func (k keysClient) list() ([]channel.KeyInfo, error) {
	var list []channel.KeyInfo
	err := k.call(http.MethodGet, "", nil, http.StatusOK, &list)
	if errors.Is(err, errNoServer) {
		err = k.offline(func(keys channel.Keys) error {
			var lerr error
			list, lerr = keys.List()
			return lerr
		})
	}
	return list, err
}

func (k keysClient) revoke(host string) error {
	err := k.call(http.MethodDelete, "/"+host, nil, http.StatusOK, nil)
	if errors.Is(err, errNoServer) {
		err = k.offline(func(keys channel.Keys) error { return keys.Revoke(host) })
	}
	return err
}

func (k keysClient) offline(fn func(channel.Keys) error) error {
	db, err := k.openOffline()
	if err != nil {
		return err
	}
	ferr := fn(channel.Keys{Claims: store.NewChannelClaims(db)})
	return errors.Join(ferr, db.Close())
}

// call sends one admin request; errNoServer when there is no admin token
// (no server running on this data dir) or nothing listens.
func (k keysClient) call(method, suffix string, body any, want int, out any) error {
	return k.callAdmin(method, "/v1/keys/channel"+suffix, body, want, out)
}

// callAdmin sends one request to the running server's admin listener.
func (k keysClient) callAdmin(method, path string, body any, want int, out any) error {
	return admin.Call(k.adminAddr, filepath.Join(k.dataDir, adminTokenFile), method, path, body, want, out)
}

// runPushKeys is `edgerelay keys push …`: the push gateway's API keys.
func runPushKeys(args []string, stdout, stderr io.Writer) int {
	if helpAsked(args) {
		fmt.Fprint(stdout, keycmd.Usage)
		return 0
	}
	values, err := config.Load(nil, os.Environ(), io.Discard)
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay keys push: %v\n", err)
		return 2
	}
	dataDir := values.String(config.EnvDataDir)
	return keycmd.Run(args, keycmd.Config{
		DataDir: dataDir, AdminAddr: values.String(config.EnvAdminListen),
		AdminTokenFile: filepath.Join(dataDir, adminTokenFile), Separate: values.Bool(config.EnvPushSeparateKeys),
		Cluster: clusterMode(values),
	}, stdout, stderr)
}
