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
}

// Timeouts of one operation on the shared store. A write that has not been
// acknowledged by then is answered 503 (and retried by the client: every
// write of the relay is idempotent or checked by compare-and-set).
const (
	opTimeout = 5 * time.Second
	// probeEvery is how often readiness asks JetStream whether it answers.
	probeEvery = livenessRefresh
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

	// down is why the shared store cannot take writes right now (an error
	// wrapping store.ErrUnavailable), or nil while it can.
	down atomic.Pointer[error]
	stop chan struct{}
	bg   sync.WaitGroup // watch and the liveness refresh
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
		node: cfg.NodeName, incarnation: hex.EncodeToString(inc), replicas: cfg.Replicas,
		log: log, stop: make(chan struct{}),
	}
	c.setDown(fmt.Errorf("%w: not connected to NATS yet", store.ErrUnavailable))
	opts := []nats.Option{
		nats.Name("edgerelay " + cfg.NodeName),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
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
	c.bg.Go(c.watch)
	return c, nil
}

// waitReady polls JetStream until it answers, logging once on the first miss
// and then every ten.
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
		if miss%10 == 0 {
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
		return fmt.Errorf("%w: not connected to NATS", store.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if c.nodes == nil {
		for _, b := range []BucketConfig{{Name: configBucket}, {Name: nodesBucket, MaxAge: livenessTTL}} {
			if _, err := c.js.CreateOrUpdateStream(ctx, c.bucketStream(b)); err != nil {
				return fmt.Errorf("%w: JetStream does not answer: %w", store.ErrUnavailable, err)
			}
		}
		kv, err := c.js.KeyValue(ctx, nodesBucket)
		if err != nil {
			return fmt.Errorf("%w: JetStream does not answer: %w", store.ErrUnavailable, err)
		}
		c.nodes = kv
	}
	if _, err := c.nodes.Put(ctx, c.node, []byte(c.incarnation)); err != nil {
		return fmt.Errorf("%w: no JetStream quorum (a write was not acknowledged): %w", store.ErrUnavailable, err)
	}
	return nil
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
		case err != nil && prev == nil:
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
