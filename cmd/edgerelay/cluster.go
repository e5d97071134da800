package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/agent"
	"edgerelay/route"
	"edgerelay/store"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/agentkv"
	"edgerelay/store/cluster/channelkv"
	"edgerelay/store/cluster/mailboxjs"
	"edgerelay/store/cluster/pushkv"
	"edgerelay/store/cluster/signalroute"
	"edgerelay/store/mailboxlocal"
	"edgerelay/store/natsembed"
)

// openCluster connects this node to the cluster's shared store: the
// embedded nats-server (started here, its store in <data dir>/nats) or an
// external NATS cluster. It returns only once JetStream answers, logging
// while it waits: a node never serves as a single node by accident. ctx
// ends the wait (SIGTERM during the start).
func openCluster(ctx context.Context, cfg config.Config, log *slog.Logger) (*cluster.Cluster, error) {
	cc := cfg.Cluster
	c := cluster.Config{
		NodeName: cc.NodeName, URLs: cc.URLs, CredsFile: cc.CredsFile, TLSCA: cc.TLSCA,
		Replicas: cc.Replicas,
	}
	if cc.EmbedListen != "" {
		c.Embed = &natsembed.Config{
			NodeName: cc.NodeName, ClientListen: cc.EmbedListen, ClusterListen: cc.EmbedClusterListen,
			Routes: cc.EmbedRoutes, StoreDir: filepath.Join(cfg.DataDir, "nats"), Replicas: cc.Replicas,
		}
	}
	cl, err := cluster.Open(ctx, c, log)
	if err != nil {
		return nil, err
	}
	if err := cl.Agree(ctx, sharedSettings(cfg)); err != nil {
		_ = cl.Close()
		return nil, err
	}
	return cl, nil
}

// sharedSettings are the settings every node must run with the same
// value, because a client that reaches two nodes would otherwise get two
// answers: the TURN secret (credentials minted on one node are checked on
// another), the mailbox apps and limits, the push gateway's limits and key
// layout, and the replica count. Typed values are compared, so "720h" and
// "720h0m0s" agree. Per-node settings (listen addresses, connection
// limits, queue bounds, certificates) may differ.
func sharedSettings(cfg config.Config) []cluster.Setting {
	s := func(name, v string) cluster.Setting { return cluster.Setting{Name: name, Value: v} }
	itoa := strconv.Itoa
	budget := "unmetered"
	if cfg.Gateway.Metered {
		budget = itoa(cfg.Gateway.DailyBudget)
	}
	return []cluster.Setting{
		s(config.EnvNATSReplicas, itoa(cfg.Cluster.Replicas)),
		s(config.EnvTURNSecret, cfg.TURN.Secret.Reveal()),
		s(config.EnvTURNRealm, cfg.TURN.Realm),
		s(config.EnvApps, cfg.Mailbox.Apps),
		s(config.EnvIdle, cfg.Mailbox.Idle.String()),
		s(config.EnvMaxEnvelope, itoa(cfg.Mailbox.MaxEnvelope)),
		s(config.EnvMaxStored, itoa(cfg.Mailbox.MaxStored)),
		s(config.EnvMaxStoredBytes, itoa(cfg.Mailbox.MaxStoredBytes)),
		s(config.EnvPushRatePerMinute, itoa(cfg.Gateway.RatePerMinute)),
		s(config.EnvPushDailyBudget, budget),
		s(config.EnvPushSeparateKeys, strconv.FormatBool(cfg.Gateway.SeparateKeys)),
		s(config.EnvPushRegistration, strconv.FormatBool(cfg.Gateway.Registration)),
	}
}

// clusterAgentKey makes this node's agent relay signing key the cluster's
// one key (runtimes pin it, whichever node they reach): the first node
// publishes its key (or a new one), the others adopt it into their data
// dir. A node with a key file of its own that is not the cluster's refuses
// to start: switching keys would unpair every runtime that pinned it.
func clusterAgentKey(ctx context.Context, cl *cluster.Cluster, dataDir string) error {
	local, err := agent.KeyPEM(dataDir)
	if err != nil {
		return err
	}
	shared, err := cl.SharedSecret(ctx, "agent_relay_key", local, agent.NewKeyPEM)
	if errors.Is(err, cluster.ErrSecretDiffers) {
		return fmt.Errorf("the agent relay signing key %s is not the cluster's: runtimes pinned to one of the two would be refused by the other; move this file away to adopt the cluster's key (runtimes paired with this node's key must pair again), or bring this node's state in with edgerelay cluster import", filepath.Join(dataDir, agent.KeyFile))
	}
	if err != nil {
		return err
	}
	if local == nil {
		if err := agent.InstallKey(dataDir, shared); err != nil {
			return err
		}
	}
	return nil
}

// unavailable is the node's readiness in cluster mode: its own disk (the
// data dir still holds the TLS files, the agent key and, for an embedded
// server, the JetStream store) and the shared store's quorum.
func (r *relay) unavailable() error {
	if err := r.db.Unavailable(); err != nil {
		return err
	}
	return r.cluster.Unavailable()
}

// mailboxStreams is the configuration of the mailbox's shard streams,
// the same on every node and in edgerelay cluster import (Open updates the
// streams to the config it is given).
func mailboxStreams() mailboxjs.Config { return mailboxjs.Config{} }

// mailboxLimits are the mailbox's bounds from the settings.
func mailboxLimits(cfg config.Config) store.MailboxLimits {
	return store.MailboxLimits{
		Idle: cfg.Mailbox.Idle, MaxStored: cfg.Mailbox.MaxStored, MaxStoredBytes: cfg.Mailbox.MaxStoredBytes,
	}.WithDefaults()
}

// mailboxes is the mailbox relay's store: this node's Pebble with the
// mailboxes in use in memory, or the cluster's.
func (r *relay) mailboxes(ctx context.Context, cfg config.Config, db *store.DB, log *slog.Logger) (store.Mailboxes, error) {
	if r.cluster == nil {
		return mailboxlocal.New(mailboxlocal.Config{
			Log: store.NewEnvelopeLog(db), Limits: mailboxLimits(cfg),
			EnvelopeCache: envelopeCache(cfg.Mailbox.EnvelopeCache), Logger: log,
		})
	}
	js, err := mailboxjs.Open(ctx, r.cluster, mailboxStreams())
	if err != nil {
		return nil, fmt.Errorf("mailbox: cluster streams: %w", err)
	}
	mb, err := mailboxjs.NewMailboxes(ctx, js, mailboxLimits(cfg), log)
	if err != nil {
		return nil, fmt.Errorf("mailbox: cluster store: %w", err)
	}
	r.closers = append(r.closers, mb.Close)
	return mb, nil
}

// signals is where the mailbox's signal sides meet: nil on a single node
// (the handler's own in-process rooms), across the nodes in a cluster.
func (r *relay) signals() route.Signals {
	if r.cluster == nil {
		return nil
	}
	sr := signalroute.New(r.cluster)
	r.closers = append(r.closers, sr.Close)
	return sr
}

// channelClaims is the private channel's durable state: this node's
// Pebble store, or the cluster's. In cluster mode, forgotten (a release or
// a revocation through any node) calls the handler's Forget, so that the
// node holding that computer's sockets closes them; call it once the
// handler exists.
func (r *relay) channelClaims(ctx context.Context) (claims store.ChannelClaimStore, forgotten func(func(store.Hash)) error, err error) {
	if r.cluster == nil {
		return store.NewChannelClaims(r.db), func(func(store.Hash)) error { return nil }, nil
	}
	kv, err := channelkv.New(ctx, r.cluster)
	if err != nil {
		return nil, nil, err
	}
	return kv, func(fn func(store.Hash)) error { return kv.WatchForgotten(r.background(), fn) }, nil
}

// agentRecords is the agent relay's durable state, likewise; revoked feeds
// the handler's Revoked with instances revoked through any node.
func (r *relay) agentRecords(ctx context.Context) (records store.AgentRecords, revoked func(func(string)) error, err error) {
	if r.cluster == nil {
		return store.NewAgentStore(r.db), func(func(string)) error { return nil }, nil
	}
	kv, err := agentkv.New(ctx, r.cluster)
	if err != nil {
		return nil, nil, err
	}
	return kv, func(fn func(string)) error { return kv.WatchRevoked(r.background(), fn) }, nil
}

// background is a context that ends when the relay stops its background
// work.
func (r *relay) background() context.Context {
	ctx, stop := context.WithCancel(context.Background())
	r.stopBackground = append(r.stopBackground, stop)
	return ctx
}

// pushGatewayStore is one key store of the push gateway (a scope),
// likewise; the cluster's watches its keys until the relay closes.
func (r *relay) pushGatewayStore(ctx context.Context, scope store.PushScope) (store.PushGatewayStore, error) {
	if r.cluster == nil {
		return store.NewPushGateway(r.db, scope)
	}
	g, err := pushkv.New(ctx, r.cluster, scope)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, g.Close)
	return g, nil
}
