// Package cluster connects an edgerelay node to the NATS JetStream deployment
// that cluster mode keeps its shared state in: an external NATS cluster
// (RELAY_NATS_URL) or a nats-server embedded in this process
// (RELAY_NATS_EMBED_LISTEN, see store/natsembed). It owns the connection,
// the node's identity, the readiness of the shared store, the buckets every
// service builds its backend on, and the start-up agreement on the settings
// that must be equal on every node.
//
// Services never see this package: each has a backend (in store/cluster/...)
// that implements the same interface as its Pebble store.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/natsembed"
)

// Config says how a node reaches the cluster. Exactly one of URLs and Embed
// is set.
type Config struct {
	// NodeName is this node's name, unique in the cluster (RELAY_NODE_NAME).
	NodeName string
	// URLs are the client URLs of an external NATS cluster (RELAY_NATS_URL).
	URLs []string
	// CredsFile is a NATS .creds file (RELAY_NATS_CREDS), TLSCA a PEM file of
	// the CA that signed the servers' certificates (RELAY_NATS_TLS_CA).
	CredsFile, TLSCA string
	// Embed starts a nats-server inside this process and connects to it
	// in-process (RELAY_NATS_EMBED_*); nil with URLs set.
	Embed *natsembed.Config
	// Replicas of every stream and bucket (RELAY_NATS_REPLICAS).
	Replicas int
	// Client is a command (edgerelay cluster ...), not a node: it keeps no
	// liveness record, so no node ever takes it for one of theirs.
	Client bool
}

// Timeouts of one operation on the shared store. A write that has not been
// acknowledged by then is answered 503 (and retried by the client: every
// write of the relay is idempotent or checked by compare-and-set).
const (
	opTimeout = 5 * time.Second
	// probeEvery is how often readiness asks JetStream whether it answers.
	probeEvery = livenessRefresh
	// logEvery is how often one failure that keeps recurring (a probe, a
	// refused connection attempt) is logged again; a new reason is logged
	// at once.
	logEvery = 10 * probeEvery
	// recentNATSError is how long an error the server reported on its own
	// (a permissions violation answers no request: the request times out)
	// is named as the likely cause of a failed probe.
	recentNATSError = 10 * time.Second
)

// Cluster is a node's connection to the shared store.
type Cluster struct {
	node        string
	incarnation string
	replicas    int
	embed       *natsembed.Node
	nc          *nats.Conn
	js          jetstream.JetStream
	log         *slog.Logger
	nodes       jetstream.KeyValue // er_nodes: liveness (nodes.go)
	client      bool               // Config.Client
	peers       *peers             // the beats of the other nodes (peers.go); nil for a client

	// down is why the shared store cannot take writes right now (an error
	// wrapping store.ErrUnavailable), or nil while it can.
	down atomic.Pointer[error]
	// natsErr is the latest failed connection attempt or error the server
	// reported outside a request (authorization, permissions), so that the
	// log says why the store is unreachable rather than only that it is.
	natsErr atomic.Pointer[natsError]
	logs    logLimit
	stop    chan struct{}
	bg      sync.WaitGroup // watch and the liveness refresh
}

// Open starts the embedded server when configured, connects, and waits until
// JetStream answers, saying so in the log every few seconds while it does not
// (a node never serves on its own by accident: it serves only once the
// cluster's JetStream does). It fails only for a configuration error or when
// ctx ends first.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Cluster, error) {
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "cluster")
	if cfg.NodeName == "" {
		return nil, errors.New("cluster: node name is empty (RELAY_NODE_NAME)")
	}
	if (len(cfg.URLs) > 0) == (cfg.Embed != nil) {
		return nil, errors.New("cluster: set exactly one of RELAY_NATS_URL and RELAY_NATS_EMBED_LISTEN")
	}
	if cfg.Replicas < 1 {
		return nil, fmt.Errorf("cluster: replicas %d: must be at least 1 (RELAY_NATS_REPLICAS)", cfg.Replicas)
	}
	inc := make([]byte, 8)
	_, _ = rand.Read(inc)
	c := &Cluster{
		node: cfg.NodeName, incarnation: hex.EncodeToString(inc), replicas: cfg.Replicas, client: cfg.Client,
		log: log, stop: make(chan struct{}), logs: logLimit{every: logEvery},
	}
	c.setDown(fmt.Errorf("%w: not connected to NATS yet", store.ErrUnavailable))
	opts := []nats.Option{
		nats.Name("edgerelay " + cfg.NodeName),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		// nats.go gives up for good once a server refuses the same
		// credentials twice; the operator may fix the server side (an
		// account, a permission) without restarting this node, so keep
		// trying, saying why in the log.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { c.noteNATSError(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub == nil { // a subscription's own errors (slow consumer) say nothing of the store
				c.noteNATSError(err)
			}
			if c.logs.due("async " + err.Error()) {
				log.Warn("NATS reported an error", "error", err)
			}
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.setDown(fmt.Errorf("%w: disconnected from NATS", store.ErrUnavailable))
			log.Warn("disconnected from NATS", "error", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "server", nc.ConnectedServerName())
		}),
	}
	var err error
	if cfg.Embed != nil {
		if c.embed, err = natsembed.Start(ctx, *cfg.Embed, log); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		c.nc, err = c.embed.Connect(opts...)
	} else {
		if cfg.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		}
		if cfg.TLSCA != "" {
			opts = append(opts, nats.RootCAs(cfg.TLSCA))
		}
		c.nc, err = nats.Connect(strings.Join(cfg.URLs, ","), opts...)
		if err != nil {
			err = fmt.Errorf("cluster: connect to %s: %w", strings.Join(cfg.URLs, ","), err)
		}
	}
	if err != nil {
		c.closeEngine()
		return nil, err
	}
	if c.js, err = jetstream.New(c.nc); err != nil {
		c.closeEngine()
		return nil, fmt.Errorf("cluster: jetstream: %w", err)
	}
	if err := c.waitReady(ctx); err != nil {
		c.closeEngine()
		return nil, err
	}
	if !c.client {
		if err := c.startPeers(); err != nil {
			c.closeEngine()
			return nil, err
		}
	}
	c.bg.Go(c.watch)
	return c, nil
}

// waitReady polls JetStream until it answers, logging a reason when it is
// first seen and then every logEvery while it lasts.
func (c *Cluster) waitReady(ctx context.Context) error {
	for miss := 0; ; miss++ {
		err := c.probe(ctx)
		if err == nil {
			c.setDown(nil)
			if miss > 0 {
				c.log.Info("cluster store reachable", "node", c.node)
			}
			return nil
		}
		if c.logs.due(err.Error()) {
			c.log.Warn("cluster store not reachable yet, retrying (this node serves nothing until it is)", "node", c.node, "error", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: JetStream not reachable before start gave up: %w (last: %w)", context.Cause(ctx), err)
		case <-time.After(probeEvery):
		}
	}
}

// probe writes this node's liveness record (nodes.go): an acknowledged
// write is the one sure sign that writes can be acknowledged. A stream's
// info is not (measured: a stream leader that lost its quorum kept answering
// for about 11 s, until it stepped down), nor is JetStream's account info,
// which a server answers alone. The buckets are created first, which needs
// the meta group's quorum. One write a second per node is the cost.
func (c *Cluster) probe(ctx context.Context) error {
	if !c.nc.IsConnected() {
		// The failed attempt's reason (TLS verification, authorization):
		// the connection's own while it retries a server that answers,
		// the reconnect callback's for one that does not.
		why := c.nc.LastError()
		if why == nil {
			if e := c.natsErr.Load(); e != nil {
				why = e.err
			}
		}
		if why != nil {
			return fmt.Errorf("%w: not connected to NATS: %w", store.ErrUnavailable, why)
		}
		return fmt.Errorf("%w: not connected to NATS", store.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if c.nodes == nil {
		for _, b := range []BucketConfig{{Name: configBucket}, {Name: nodesBucket, MaxAge: livenessTTL}} {
			if _, err := c.createOrUpdate(ctx, c.bucketStream(b)); err != nil {
				return c.unreachable("JetStream does not answer", err)
			}
		}
		kv, err := c.js.KeyValue(ctx, nodesBucket)
		if err != nil {
			return c.unreachable("JetStream does not answer", err)
		}
		c.nodes = kv
	}
	if c.client {
		// A command writes nothing of its own: the config stream's leader
		// answering is enough to go on (its first write tells the rest).
		if _, err := c.js.Stream(ctx, "KV_"+configBucket); err != nil {
			return c.unreachable("no JetStream quorum", err)
		}
		return nil
	}
	if _, err := c.nodes.Put(ctx, c.node, []byte(c.incarnation)); err != nil {
		return c.unreachable("no JetStream quorum (a write was not acknowledged)", err)
	}
	return nil
}

// unreachable is a failed probe's error, naming the error the server
// reported on its own just before, if any: a request the account may not
// publish is never answered, so the probe itself only sees a timeout.
func (c *Cluster) unreachable(what string, err error) error {
	if e := c.natsErr.Load(); e != nil && time.Since(e.at) < recentNATSError && !errors.Is(err, e.err) {
		return fmt.Errorf("%w: %s: %w (NATS reported: %w)", store.ErrUnavailable, what, err, e.err)
	}
	return fmt.Errorf("%w: %s: %w", store.ErrUnavailable, what, err)
}

// natsError is an error NATS reported through a callback, and when.
type natsError struct {
	err error
	at  time.Time
}

func (c *Cluster) noteNATSError(err error) {
	if err != nil {
		c.natsErr.Store(&natsError{err: err, at: time.Now()})
	}
}

// logLimit lets a recurring message through once per interval (a failure
// retried every second is logged clearly at once, then every interval);
// a message not seen before passes at once. It remembers a bounded number
// of messages.
type logLimit struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
}

// maxLogMessages bounds logLimit's memory; when full it starts over,
// which at worst logs each message once more.
const maxLogMessages = 16

// due reports whether msg should be logged now, and if so counts it as
// logged.
func (l *logLimit) due(msg string) bool {
	// One failure reads "authorization violation" from nats.go and
	// "Authorization Violation" from the server.
	msg = strings.ToLower(msg)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if at, ok := l.last[msg]; ok && now.Sub(at) < l.every {
		return false
	}
	if l.last == nil || len(l.last) >= maxLogMessages {
		l.last = make(map[string]time.Time, maxLogMessages)
	}
	l.last[msg] = now
	return true
}

// watch keeps the readiness and the liveness record current until Close.
func (c *Cluster) watch() {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		err := c.probe(context.Background())
		prev := c.Unavailable()
		c.setDown(err)
		switch {
		case err != nil && (c.logs.due(err.Error()) || prev == nil):
			c.log.Warn("cluster store unavailable: writes answer 503", "error", err)
		case err == nil && prev != nil:
			c.log.Info("cluster store available again")
		}
	}
}

func (c *Cluster) setDown(err error) {
	if err == nil {
		c.down.Store(nil)
		return
	}
	c.down.Store(&err)
}

// Unavailable returns why the shared store takes no writes right now (an
// error wrapping store.ErrUnavailable), or nil: the node's readiness.
func (c *Cluster) Unavailable() error {
	if p := c.down.Load(); p != nil {
		return *p
	}
	return nil
}

// Node is this node's name; Incarnation is random per start, so that state
// a node left behind before a crash is told apart from its current state.
func (c *Cluster) Node() string        { return c.node }
func (c *Cluster) Incarnation() string { return c.incarnation }

// Replicas is the replica count of every stream and bucket.
func (c *Cluster) Replicas() int { return c.replicas }

// Conn and JetStream are the node's connection, for the services' backends.
func (c *Cluster) Conn() *nats.Conn               { return c.nc }
func (c *Cluster) JetStream() jetstream.JetStream { return c.js }

// Context bounds one operation on the shared store.
func Context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// Close flushes what the connection still holds and stops the embedded
// server, which hands its Raft leaderships to another server first.
func (c *Cluster) Close() error {
	close(c.stop)
	c.bg.Wait()
	err := c.nc.FlushTimeout(2 * time.Second)
	c.closeEngine()
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("cluster: close: %w", err)
	}
	return nil
}

func (c *Cluster) closeEngine() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.embed != nil {
		c.embed.Close()
	}
}

// Writable refuses a write at once, as op's failure, while readiness says
// the shared store cannot acknowledge it (instead of waiting out a
// timeout per request).
func (c *Cluster) Writable(op string) error {
	if err := c.Unavailable(); err != nil {
		return Fail(op, err)
	}
	return nil
}

// EmbeddedAddr is the client address of the embedded nats-server, where
// other nodes' commands (edgerelay cluster ...) connect; "" for a node of
// an external NATS cluster.
func (c *Cluster) EmbeddedAddr() string {
	if c.embed == nil {
		return ""
	}
	return c.embed.ClientAddr()
}
