// Package clustertest starts cluster-mode nodes inside a test: n embedded
// nats-servers on loopback, routed to each other, each with a
// cluster.Cluster connected in-process, so that a backend's test can write
// through node 0 and read through node 2 as two edgerelay processes would.
package clustertest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/internal/freeport"
	"edgerelay/store/cluster"
	"edgerelay/store/natsembed"
)

// Nodes is a running test cluster.
type Nodes struct {
	t     testing.TB
	log   *slog.Logger
	cfgs  []cluster.Config
	nodes []*cluster.Cluster
}

// Start starts n nodes (replicas n) and waits until each one's JetStream
// answers. The nodes stop when the test ends.
func Start(t testing.TB, n int) *Nodes {
	t.Helper()
	c := &Nodes{t: t, log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	// JetStream needs its routes configured from the start, so every route
	// port is picked first; each node gets the same list, itself included.
	var routes []string
	for range n {
		routes = append(routes, "nats-route://"+freeport.TCP(t))
	}
	for i := range n {
		c.cfgs = append(c.cfgs, cluster.Config{
			NodeName: fmt.Sprintf("n%d", i),
			Replicas: n,
			Embed: &natsembed.Config{
				NodeName:      fmt.Sprintf("n%d", i),
				ClientListen:  "127.0.0.1:0",
				ClusterListen: strings.TrimPrefix(routes[i], "nats-route://"),
				Routes:        routes,
				StoreDir:      t.TempDir(),
				Replicas:      n,
			},
		})
	}
	c.nodes = make([]*cluster.Cluster, n)
	// A clustered JetStream answers only with a quorum, so the nodes open
	// side by side: each Open waits for the others.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { c.nodes[i], errs[i] = c.open(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Stop(i)
		}
	})
	return c
}

func (c *Nodes) open(i int) (*cluster.Cluster, error) {
	return cluster.Open(OpenContext(c.t), c.cfgs[i], c.log.With("test_node", i))
}

// OpenContext is a context for opening a node or a client of the cluster:
// generous, because under -race with other packages' tests beside it a
// 2-core machine took over 30 s once, and a young cluster's meta leader can
// move (JetStream answers 503 meanwhile) after every node has opened.
func OpenContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Node returns node i (nil while it is stopped).
func (c *Nodes) Node(i int) *cluster.Cluster { return c.nodes[i] }

// Len is the number of nodes.
func (c *Nodes) Len() int { return len(c.nodes) }

// Stop closes node i: its connection and its embedded server, as a node
// that stops does.
func (c *Nodes) Stop(i int) {
	if c.nodes[i] != nil {
		_ = c.nodes[i].Close()
		c.nodes[i] = nil
	}
}

// Restart opens node i again on its old ports and store; it waits until
// the node's JetStream answers, which needs a quorum of running nodes.
func (c *Nodes) Restart(i int) *cluster.Cluster {
	c.t.Helper()
	if c.nodes[i] != nil {
		c.t.Fatalf("clustertest: node %d is running", i)
	}
	n, err := c.open(i)
	if err != nil {
		c.t.Fatal(err)
	}
	c.nodes[i] = n
	return n
}

// Context is a context for one operation in a test: 10 s.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testWriter sends log output to the test's log (shown on failure or -v).
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Open makes one backend per running node with open (a backend's New), in
// node order, failing the test on an error.
func Open[T any](t testing.TB, nodes *Nodes, open func(context.Context, *cluster.Cluster) (T, error)) []T {
	t.Helper()
	var out []T
	for i := range nodes.Len() {
		if nodes.Node(i) == nil {
			continue
		}
		b, err := open(Context(t), nodes.Node(i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// As is backends seen through the interface I they implement, for a
// contract suite.
func As[I, T any](backends []T) []I {
	out := make([]I, len(backends))
	for i, b := range backends {
		out[i] = any(b).(I)
	}
	return out
}
