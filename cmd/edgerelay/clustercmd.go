package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/store/cluster"
)

const clusterUsage = `usage:
  edgerelay cluster forget-setting NAME   clear the cluster's record of a shared setting (RELAY_TURN_SECRET, ...)
                                          so that the next node to start records its value: how a setting that
                                          must agree on every node is changed (change it on every node, forget
                                          it, restart the nodes)
  edgerelay cluster import --from DIR     move a single node's whole store (the data dir DIR, its server
                                          stopped) into the cluster; idempotent: run it again after a failure

The cluster commands connect to the cluster's NATS as a client: RELAY_NATS_URL (with
RELAY_NATS_CREDS, RELAY_NATS_TLS_CA), which for embedded servers is any node's
RELAY_NATS_EMBED_LISTEN address.
`

// runCluster is `edgerelay cluster …`.
func runCluster(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || helpAsked(args) {
		fmt.Fprint(stdout, clusterUsage)
		return 0
	}
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	from := fs.String("from", "", "data dir of the single node to import (cluster import)")
	if code, ok := parseFlags(fs, args[1:], clusterUsage, stdout, stderr); !ok {
		return code
	}
	switch args[0] {
	case "import":
		if *from == "" || fs.NArg() != 0 {
			return usageError(stderr, "cluster import", "give the single node's data dir as --from DIR", clusterUsage)
		}
		// No deadline over the whole import: a large store takes longer
		// than any fixed bound, and every cluster write has its own.
		err := withClusterClient(0, func(ctx context.Context, c *cluster.Cluster) error { return clusterImport(ctx, c, *from, stdout) })
		if err != nil {
			fmt.Fprintf(stderr, "edgerelay cluster import: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, "imported: the cluster now holds the single node's state")
		return 0
	case "forget-setting":
		if fs.NArg() != 1 {
			return usageError(stderr, "cluster forget-setting", "name one setting", clusterUsage)
		}
		name := fs.Arg(0)
		if !sharedSetting(name) {
			return usageError(stderr, "cluster forget-setting", fmt.Sprintf("%s is not a setting the nodes must agree on", name), clusterUsage)
		}
		err := withClusterClient(time.Minute, func(ctx context.Context, c *cluster.Cluster) error { return c.ForgetSetting(ctx, name) })
		if err != nil {
			fmt.Fprintf(stderr, "edgerelay cluster forget-setting: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "forgot %s: the next node to start records its value\n", name)
		return 0
	default:
		return usageError(stderr, "cluster", fmt.Sprintf("unknown command %q", args[0]), clusterUsage)
	}
}

// sharedSetting reports whether name is one of sharedSettings.
func sharedSetting(name string) bool {
	for _, s := range sharedSettings(config.Config{}) {
		if s.Name == name {
			return true
		}
	}
	return false
}

// withClusterClient connects to the cluster named by RELAY_NATS_URL for one
// command, within a minute.
func withClusterClient(bound time.Duration, fn func(context.Context, *cluster.Cluster) error) error {
	values, err := config.Load(nil, os.Environ(), io.Discard)
	if err != nil {
		return err
	}
	cfg, err := values.Config()
	if err != nil {
		return err
	}
	if len(cfg.Cluster.URLs) == 0 {
		return fmt.Errorf("%s is empty: name the cluster's NATS (with embedded servers, any node's %s)", config.EnvNATSURL, config.EnvNATSEmbedListen)
	}
	// Connecting gives up after a minute (a wrong address should not
	// hang); the command then runs for at most bound (0: no bound).
	octx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, _ := os.Hostname()
	c, err := cluster.Open(octx, cluster.Config{
		NodeName: "edgerelay-cli-" + host, URLs: cfg.Cluster.URLs, CredsFile: cfg.Cluster.CredsFile,
		TLSCA: cfg.Cluster.TLSCA, Replicas: cfg.Cluster.Replicas, Client: true,
	}, nil)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	return errors.Join(fn(ctx, c), c.Close())
}
