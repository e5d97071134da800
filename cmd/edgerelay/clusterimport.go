package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"edgerelay/fastpath/agent"
	"edgerelay/store"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/agentkv"
	"edgerelay/store/cluster/channelkv"
	"edgerelay/store/cluster/mailboxjs"
	"edgerelay/store/cluster/pushkv"
)

// importCounts is what one service's import moved.
type importCounts struct {
	service string
	what    string
	n       int
}

// clusterImport moves a single node's store (the data dir from) into the
// cluster: every record through the cluster backend's import, which is
// idempotent (a record already imported in the same state is left as it
// is), so an import cut short is run again. Opening the Pebble store takes
// its lock: while that single node's server runs, the import is refused.
func clusterImport(ctx context.Context, c *cluster.Cluster, from string, stdout io.Writer) error {
	db, err := store.Open(from, nil)
	if err != nil {
		return fmt.Errorf("open the single node's store in %s (is its server still running? stop it first): %w", from, err)
	}
	defer db.Close()
	var counts []importCounts
	n, err := importChannel(ctx, c, store.NewChannelClaims(db))
	counts = append(counts, importCounts{"channel", "claim keys", n})
	if err == nil {
		var agentCounts []importCounts
		agentCounts, err = importAgent(ctx, c, store.NewAgentStore(db), from)
		counts = append(counts, agentCounts...)
	}
	if err == nil {
		n, err = importPush(ctx, c, db)
		counts = append(counts, importCounts{"push gateway", "API keys", n})
	}
	if err == nil {
		var mailboxCounts []importCounts
		mailboxCounts, err = importMailboxes(ctx, c, store.NewEnvelopeLog(db))
		counts = append(counts, mailboxCounts...)
	}
	for _, k := range counts {
		fmt.Fprintf(stdout, "%s: %d %s\n", k.service, k.n, k.what)
	}
	return err
}

func importChannel(ctx context.Context, c *cluster.Cluster, from *store.ChannelClaims) (int, error) {
	keys, err := from.Keys()
	if err != nil {
		return 0, err
	}
	to, err := channelkv.New(ctx, c)
	if err != nil {
		return 0, err
	}
	for i, k := range keys {
		if err := to.Import(k); err != nil {
			return i, fmt.Errorf("channel: %w", err)
		}
	}
	return len(keys), nil
}

// importAgent imports the agent relay's records and makes the single
// node's signing key the cluster's (its runtimes pinned it); a cluster
// that holds another key already is a conflict the operator settles.
func importAgent(ctx context.Context, c *cluster.Cluster, from *store.AgentStore, dataDir string) ([]importCounts, error) {
	counts := []importCounts{{"agent", "accounts", 0}, {"agent", "instances", 0}, {"agent", "pairing keys", 0}}
	accounts, err := from.Accounts()
	if err != nil {
		return counts, err
	}
	instances, err := from.Instances()
	if err != nil {
		return counts, err
	}
	pairing, err := from.PairingKeys()
	if err != nil {
		return counts, err
	}
	if local, err := agent.KeyPEM(dataDir); err != nil {
		return counts, err
	} else if local != nil {
		if _, err := c.SharedSecret(ctx, "agent_relay_key", local, agent.NewKeyPEM); errors.Is(err, cluster.ErrSecretDiffers) {
			return counts, fmt.Errorf("agent: the cluster signs with another relay key than %s/%s: runtimes pinned to this node's key would be refused; import into a cluster whose nodes have not started the agent relay yet, or pair the runtimes again", dataDir, agent.KeyFile)
		} else if err != nil {
			return counts, err
		}
	}
	to, err := agentkv.New(ctx, c)
	if err != nil {
		return counts, err
	}
	for _, a := range accounts {
		if err := to.ImportAccount(a); err != nil {
			return counts, fmt.Errorf("agent: %w", err)
		}
		counts[0].n++
	}
	for _, in := range instances {
		if err := to.ImportInstance(in); err != nil {
			return counts, fmt.Errorf("agent: %w", err)
		}
		counts[1].n++
	}
	for _, p := range pairing {
		if err := to.ImportPairingKey(p); err != nil {
			return counts, fmt.Errorf("agent: %w", err)
		}
		counts[2].n++
	}
	return counts, nil
}

// importPush imports the push gateway's API keys of every scope (shared,
// and the per-mount ones of RELAY_PUSH_SEPARATE_KEYS). Device-token claims
// and the day's budget are not moved: claims free up within a minute, and
// the budget starts the day over.
func importPush(ctx context.Context, c *cluster.Cluster, db *store.DB) (int, error) {
	n := 0
	for _, scope := range []store.PushScope{store.PushScopeShared, store.PushScopeFCM, store.PushScopeAPNs} {
		from, err := store.NewPushGateway(db, scope)
		if err != nil {
			return n, err
		}
		keys := from.Keys()
		if len(keys) == 0 {
			continue
		}
		to, err := pushkv.New(ctx, c, scope)
		if err != nil {
			return n, err
		}
		for _, k := range keys {
			err := to.AddKey(k)
			if errors.Is(err, store.ErrPushKeyExists) {
				if held, ok := to.KeyByHash(k.Hash); ok && held.ID == k.ID {
					err = nil // imported before
				} else {
					err = fmt.Errorf("push gateway: key %s %q: the cluster holds its hash under another key", k.ID, k.Label)
				}
			}
			if err != nil {
				_ = to.Close()
				return n, err
			}
			n++
		}
		if err := to.Close(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// mailboxImportTimeout bounds one mailbox's import (at most 2 × 4,096
// envelopes, each one acknowledged publish).
const mailboxImportTimeout = 5 * time.Minute

// importMailboxes imports every mailbox (claim, pruned marks, envelopes,
// sealed push registrations) through the cluster's mailbox store, in name
// order, stopping at the first conflict. The mailbox streams are made
// only when there is a mailbox to import. Each mailbox has a deadline of
// its own (the command has none).
func importMailboxes(ctx context.Context, c *cluster.Cluster, from *store.EnvelopeLog) ([]importCounts, error) {
	counts := []importCounts{{"mailbox", "mailboxes", 0}, {"mailbox", "envelopes", 0}}
	var to *mailboxjs.Store
	var err error
	eachErr := from.EachMailbox(func(name string, rec store.MailboxRecord) bool {
		if to == nil {
			// The nodes' configuration: Open updates the streams to the
			// config it is given.
			if to, err = mailboxjs.Open(ctx, c, mailboxStreams()); err != nil {
				return false
			}
		}
		mctx, cancel := context.WithTimeout(ctx, mailboxImportTimeout)
		defer cancel()
		var st mailboxjs.ImportStats
		st, err = to.Import(mctx, from, name, rec)
		counts[1].n += st.Envelopes
		if err != nil {
			err = fmt.Errorf("mailbox: %w", err)
			return false
		}
		counts[0].n++
		return true
	})
	return counts, errors.Join(eachErr, err)
}
